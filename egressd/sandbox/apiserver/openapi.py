"""A minimal OpenAPI v3: the index and one document per group-version.

`kubectl apply` (default validation) reads it to learn that the server takes
the `fieldValidation` parameter: it looks for the PATCH operation of the
kind's path carrying `x-kubernetes-group-version-kind`. With that found it
leaves validation to the server (Strict), which is where the CRD schema and
its CEL rules are enforced. Component schemas carry the CRD's own schema
(built-ins a permissive one) so client-side consumers find the kind.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from egressd.sandbox.apiserver.resources import ResourceType


def gv_path(rt: ResourceType) -> str:
    return f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"


def schema_name(rt: ResourceType) -> str:
    """kube's naming: io.k8s.api.core.v1.Pod, com.example.crawl.v1alpha1.Proxy."""
    if not rt.group:
        return f"io.k8s.api.core.{rt.version}.{rt.kind}"
    reversed_group = ".".join(reversed(rt.group.split(".")))
    return f"{reversed_group}.{rt.version}.{rt.kind}"


def _gvk(rt: ResourceType) -> dict[str, str]:
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


_QUERY = ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")


def _operation(rt: ResourceType, action: str, verb: str) -> dict[str, Any]:
    params = [{"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
              for name in _QUERY]
    return {"operationId": f"{verb}{rt.kind}", "parameters": params,
            "x-kubernetes-action": action, "x-kubernetes-group-version-kind": _gvk(rt),
            "responses": {"200": {"description": "OK", "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{schema_name(rt)}"}}}}}}


def index(types: Iterable[ResourceType], schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`/openapi/v3`: one entry per group-version, with a content hash as kube does."""
    paths: dict[str, Any] = {}
    by_gv: dict[str, list[ResourceType]] = {}
    for rt in types:
        by_gv.setdefault(gv_path(rt), []).append(rt)
    for gv, rts in by_gv.items():
        digest = hashlib.sha256(json.dumps(document(rts, schemas), sort_keys=True)
                                .encode()).hexdigest()[:32].upper()
        paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest}"}
    return {"paths": paths}


def document(types: Iterable[ResourceType], schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The group-version document; `schemas` maps CRD name+version to openAPIV3Schema."""
    paths: dict[str, Any] = {}
    components: dict[str, Any] = {}
    for rt in types:
        base = "/" + gv_path(rt)
        collection = (f"{base}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced
                      else f"{base}/{rt.plural}")
        item = collection + "/{name}"
        paths[collection] = {"get": _operation(rt, "list", "list"),
                             "post": _operation(rt, "post", "create")}
        paths[item] = {"get": _operation(rt, "get", "read"),
                       "put": _operation(rt, "put", "replace"),
                       "patch": _operation(rt, "patch", "patch"),
                       "delete": _operation(rt, "delete", "delete")}
        if rt.has_status:
            paths[item + "/status"] = {"get": _operation(rt, "get", "read"),
                                       "put": _operation(rt, "put", "replace"),
                                       "patch": _operation(rt, "patch", "patch")}
        schema = schemas.get(f"{rt.crd_name}/{rt.version}") if rt.crd_name else None
        body = dict(schema) if schema else {"type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True}
        body["x-kubernetes-group-version-kind"] = [_gvk(rt)]
        components[schema_name(rt)] = body
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"},
            "paths": paths, "components": {"schemas": components}}
