"""What a URL names: a resource (`Target`) or a discovery/OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from egressd.sandbox.apiserver import discovery, openapi
from egressd.sandbox.apiserver.errors import not_found_path
from egressd.sandbox.apiserver.registry import Registry
from egressd.sandbox.apiserver.resources import ResourceType
from egressd.sandbox.apiserver.store import Obj


@attrs.frozen
class Target:
    """What a resource URL names."""

    rt: ResourceType
    namespace: str | None  # None: all namespaces (or cluster-scoped)
    name: str | None
    subresource: str | None


def _split(parts: list[str]) -> tuple[str, str, list[str]] | None:
    """(group, version, the rest) of a resource URL; None for anything else."""
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if rest[:1] == ["watch"]:  # the deprecated /watch/ prefix
        rest = rest[1:]
    return (group, version, rest) if rest else None


def _namespaced(group: str, rest: list[str]) -> bool:
    """Whether `rest` starts namespaces/{ns}/…: a core namespace's own status and
    finalize subresources are not (they are `namespaces/{name}/status`)."""
    if rest[0] != "namespaces" or len(rest) < 3:
        return False
    return bool(group) or rest[2] not in ("status", "finalize")


def route(parts: list[str], registry: Registry) -> Target | None:
    """The resource `parts` names; None for a non-resource path; 404 for a bad one."""
    split = _split(parts)
    if split is None:
        return None
    group, version, rest = split
    namespace: str | None = None
    if _namespaced(group, rest):
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        raise not_found_path("/" + "/".join(parts))
    plural, name = rest[0], rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    rt = registry.get(group, version, plural)
    if rt is None:
        if not group or registry.serves_group_version(group, version):
            raise not_found_path("/" + "/".join(parts))
        return None
    if not _fits(rt, namespace, name, sub):
        raise not_found_path("/" + "/".join(parts))
    return Target(rt, namespace if rt.namespaced else "", name, sub)


def _fits(rt: ResourceType, namespace: str | None, name: str | None, sub: str | None) -> bool:
    if namespace is not None and not rt.namespaced:
        return False
    if rt.namespaced and namespace is None and name is not None:
        return False
    return (sub is None or (sub == "status" and rt.has_status)
            or (sub == "scale" and rt.scale is not None))


def meta_document(parts: list[str], registry: Registry, address: Callable[[], str]
                  ) -> Obj | None:
    """Discovery and OpenAPI documents by path (None: nothing is served there)."""
    types = registry.types()
    if parts == ["api"]:
        return discovery.api_versions(address())
    if parts == ["apis"]:
        return discovery.api_group_list(types)
    if parts == ["api", "v1"]:
        return discovery.resource_list("v1", [t for t in types if not t.group])
    if parts[:1] == ["apis"] and len(parts) in (2, 3):
        return _group_document(parts[1:], types)
    if parts[:2] == ["openapi", "v3"]:
        if len(parts) == 2:
            return openapi.index(types, registry.openapi_schemas)
        gv = "/".join(parts[2:])
        served = [t for t in types if openapi.gv_path(t) == gv]
        return openapi.document(served, registry.openapi_schemas) if served else None
    return None


def _group_document(parts: list[str], types: list[ResourceType]) -> Obj | None:
    if len(parts) == 1:
        return discovery.api_group(parts[0], types)
    served = [t for t in types if t.group == parts[0] and t.version == parts[1]]
    return discovery.resource_list(f"{parts[0]}/{parts[1]}", served) if served else None
