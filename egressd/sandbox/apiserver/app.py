"""Routing and the API verbs: get, list, watch, create, update, patch, delete.

One `ApiApp` holds the served resource types (built-ins plus whatever CRDs
define), the store, and the write pipeline every verb shares: metadata
rules, status isolation, kind normalisation, schema enforcement, generation,
no-op detection, finalizers. Requests answer a `Response` or, for watches, a
`Stream`; every failure is an `ApiError` rendered as a `Status` body.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import hmac
import json
import logging
import secrets
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import attrs
import trio

from egressd.sandbox.apiserver import builtin, discovery, openapi, patch, protobuf, table
from egressd.sandbox.apiserver.errors import (
    ApiError,
    already_exists,
    bad_request,
    conflict,
    expired,
    invalid,
    method_not_allowed,
    not_found,
    not_found_path,
    unauthorized,
    unsupported_media_type,
)
from egressd.sandbox.apiserver.faults import Faults
from egressd.sandbox.apiserver.resources import BUILTINS, ResourceType, types_from_crd
from egressd.sandbox.apiserver.selectors import FieldSelector, LabelSelector
from egressd.sandbox.apiserver.store import Event, Obj, Store, Watcher
from egressd.sandbox.apiserver.validation import BadSchema, enforce, load_schema
from egressd.sandbox.apiserver.wire import AbortStream, Request, Response, Send, Stream
from egressd.sandbox.schema import CRDSchema

log = logging.getLogger("egressd.sandbox.apiserver")

CRD_KEY = "apiextensions.k8s.io/customresourcedefinitions"
NAMESPACE_KEY = "/namespaces"
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_PUBLIC = ("/version", "/healthz", "/livez", "/readyz")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def _json(status: int, body: Any, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, json.dumps(body, separators=(",", ":")).encode(), headers)


def _error(exc: ApiError) -> Response:
    return _json(exc.code, exc.status(), exc.headers)


@attrs.frozen
class Target:
    """What a resource URL names."""

    rt: ResourceType
    namespace: str | None  # None: all namespaces (or cluster-scoped)
    name: str | None
    subresource: str | None


@attrs.frozen
class WriteResult:
    obj: Obj
    status: int
    warnings: tuple[str, ...] = ()


class ApiApp:
    """The API server's behaviour behind the transport."""

    def __init__(self, store: Store, faults: Faults, *, token: Callable[[], str],
                 now: Callable[[], datetime.datetime], address: Callable[[], str],
                 bookmark_interval: float) -> None:
        self.store = store
        self.faults = faults
        self._token = token
        self._now = now
        self._address = address
        self.bookmark_interval = bookmark_interval
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._schemas: dict[str, CRDSchema] = {}
        self._openapi_schemas: dict[str, dict[str, Any]] = {}
        for rt in BUILTINS:
            self._types[(rt.group, rt.version, rt.plural)] = rt
        for name in DEFAULT_NAMESPACES:
            self.create_object(self.resource("", "v1", "namespaces"),
                               {"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": name}})

    # ----- resource types

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        return self._types[(group, version, plural)]

    def types(self) -> list[ResourceType]:
        return list(self._types.values())

    def _register_crd(self, crd: Obj) -> None:
        self._unregister_crd(crd["metadata"]["name"], drop_objects=False)
        for rt in types_from_crd(crd):
            self._types[(rt.group, rt.version, rt.plural)] = rt
            for version in crd["spec"]["versions"]:
                if version["name"] == rt.version:
                    key = f"{rt.crd_name}/{rt.version}"
                    self._schemas[key] = load_schema(crd, rt.version)
                    self._openapi_schemas[key] = (version.get("schema") or {}).get(
                        "openAPIV3Schema") or {}

    def _unregister_crd(self, crd_name: str, *, drop_objects: bool) -> None:
        for key, rt in list(self._types.items()):
            if rt.crd_name == crd_name:
                del self._types[key]
                self._schemas.pop(f"{crd_name}/{rt.version}", None)
                if drop_objects:
                    self.store.drop_all(rt.store_key)

    def install_crd(self, crd: Obj) -> Obj:
        """Create (or replace) a CRD as `kubectl apply` would; returns the stored CRD."""
        rt = self.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        body = copy.deepcopy(crd)
        body.setdefault("apiVersion", "apiextensions.k8s.io/v1")
        body.setdefault("kind", "CustomResourceDefinition")
        old = self.store.get(rt.store_key, "", body["metadata"]["name"])
        if old is None:
            return self.create_object(rt, body)
        body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self._write(rt, body, old, subresource=None, dry_run=False,
                           field_validation="Ignore").obj

    # ----- entry point

    async def handle(self, request: Request) -> Response | Stream:
        try:
            return await self._handle(request)
        except ApiError as exc:
            return _error(exc)
        except trio.Cancelled:
            raise
        except Exception as exc:  # a bug here must be a 500, never a dead server
            log.exception("request failed", extra={"method": request.method,
                                                   "path": request.path})
            return _error(ApiError(500, "InternalError", f"Internal error occurred: {exc!r}"))

    def _authorized(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self._token().encode())

    async def _handle(self, request: Request) -> Response | Stream:
        path = request.path.rstrip("/") or "/"
        if path in _PUBLIC:
            return (_json(200, discovery.VERSION) if path == "/version"
                    else Response(200, b"ok", content_type="text/plain"))
        if not self._authorized(request):
            raise unauthorized()
        parts = [p for p in path.split("/") if p]
        target = self._route(parts)
        is_watch = request.flag("watch")
        fault = self.faults.take(request, resource=target.rt.plural if target else None,
                                 is_watch=is_watch)
        if fault is not None:
            error, rule = fault
            if is_watch and rule.as_watch_event:
                return self._error_stream(error)
            raise error
        if target is None:
            return self._meta_endpoint(parts, request)
        return await self._dispatch(target, request, is_watch=is_watch)

    # ----- routing

    def _meta_endpoint(self, parts: list[str], request: Request) -> Response:
        document = self._meta_document(parts)
        if document is None:  # an unknown path is a 404 whatever the verb, as on a cluster
            raise not_found_path("/" + "/".join(parts))
        if request.method != "GET":
            raise method_not_allowed(request.method)
        return _json(200, document)

    def _meta_document(self, parts: list[str]) -> Obj | None:
        """Discovery and OpenAPI documents by path (None: nothing is served there)."""
        types = self.types()
        if parts == ["api"]:
            return discovery.api_versions(self._address())
        if parts == ["apis"]:
            return discovery.api_group_list(types)
        if parts == ["api", "v1"]:
            return discovery.resource_list("v1", [t for t in types if not t.group])
        if len(parts) == 2 and parts[0] == "apis":
            group = discovery.api_group(parts[1], types)
            if group is not None:
                return group
        if len(parts) == 3 and parts[0] == "apis":
            served = [t for t in types if t.group == parts[1] and t.version == parts[2]]
            if served:
                return discovery.resource_list(f"{parts[1]}/{parts[2]}", served)
        if parts == ["openapi", "v3"]:
            return openapi.index(types, self._openapi_schemas)
        if parts[:2] == ["openapi", "v3"] and len(parts) > 2:
            gv = "/".join(parts[2:])
            served = [t for t in types if openapi.gv_path(t) == gv]
            if served:
                return openapi.document(served, self._openapi_schemas)
        return None

    def _route(self, parts: list[str]) -> Target | None:
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        if rest[:1] == ["watch"]:  # the deprecated /watch/ prefix
            rest = rest[1:]
        if not rest:
            return None
        namespace: str | None = None
        if (rest[0] == "namespaces" and len(rest) >= 3 and not group
                and rest[2] not in ("status", "finalize")) or (
                rest[0] == "namespaces" and group and len(rest) >= 3):
            namespace, rest = rest[1], rest[2:]
        plural, name = rest[0], rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if len(rest) > 3:
            raise not_found_path("/" + "/".join(parts))
        rt = self._types.get((group, version, plural))
        if rt is None:
            if any(t.group == group and t.version == version for t in self._types.values()) or (
                    not group):
                raise not_found_path("/" + "/".join(parts))
            return None
        if namespace is not None and not rt.namespaced:
            raise not_found_path("/" + "/".join(parts))
        if rt.namespaced and namespace is None and name is not None:
            raise not_found_path("/" + "/".join(parts))
        if sub is not None and not (sub == "status" and rt.has_status):
            raise not_found_path("/" + "/".join(parts))
        return Target(rt, namespace if rt.namespaced else "", name, sub)

    async def _dispatch(self, target: Target, request: Request, *, is_watch: bool
                        ) -> Response | Stream:
        method = request.method
        if target.name is None:
            if method == "GET":
                return self._watch(target, request) if is_watch else self._list(target, request)
            if method == "POST":
                if target.rt.namespaced and target.namespace is None:
                    raise method_not_allowed(method)
                return self._create(target, request)
            if method == "DELETE":
                return self._delete_collection(target, request)
            raise method_not_allowed(method)
        if method == "GET":
            if is_watch:
                return self._watch(target, request)
            return self._render_one(target, request, 200, self._get(target))
        if method == "PUT":
            return self._update(target, request)
        if method == "PATCH":
            return self._patch(target, request)
        if method == "DELETE" and target.subresource is None:
            return self._delete(target, request)
        raise method_not_allowed(method)

    # ----- reading

    def _get(self, target: Target) -> Obj:
        assert target.name is not None
        obj = self.store.get(target.rt.store_key, target.namespace or "", target.name)
        if obj is None:
            raise not_found(target.rt.plural, target.rt.group, target.name)
        return obj

    def _out(self, rt: ResourceType, obj: Obj) -> Obj:
        out = copy.deepcopy(obj)
        out["apiVersion"] = rt.api_version
        out["kind"] = rt.kind
        return out

    def _render_one(self, target: Target, request: Request, status: int, obj: Obj,
                    warnings: tuple[str, ...] = ()) -> Response:
        accept = request.headers.get("accept", "")
        headers = tuple(("Warning", _warning(w)) for w in warnings)
        if table.wants(accept, "Table"):
            return _json(status, table.table(target.rt, [self._out(target.rt, obj)],
                                             now=self._now(),
                                             include=request.param("includeObject")), headers)
        if table.wants(accept, "PartialObjectMetadata"):
            return _json(status, {"kind": "PartialObjectMetadata",
                                  "apiVersion": "meta.k8s.io/v1",
                                  "metadata": obj.get("metadata", {})}, headers)
        return _json(status, self._out(target.rt, obj), headers)

    def _selectors(self, target: Target, request: Request) -> tuple[LabelSelector, FieldSelector]:
        labels = LabelSelector.parse(request.param("labelSelector"))
        fields = FieldSelector.parse(request.param("fieldSelector"),
                                     supported=target.rt.field_labels)
        return labels, fields

    def _list(self, target: Target, request: Request) -> Response:
        rt = target.rt
        labels, fields = self._selectors(target, request)
        rv_param = request.param("resourceVersion")
        if request.param("resourceVersionMatch") == "Exact" and rv_param:
            requested = _parse_rv(rv_param)
            if requested < self.store.compacted:
                raise expired(requested, self.store.compacted + 1)
        start_after = ""
        list_rv = self.store.resource_version
        token = request.param("continue")
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                start_after, list_rv = str(state["start"]), int(state["rv"])
            except (ValueError, KeyError, TypeError, binascii.Error):
                raise bad_request("continue key is not valid: incorrect encoded start "
                                  "resourceVersion (version meta.k8s.io/v1)") from None
        try:
            limit = int(request.param("limit") or 0)
        except ValueError:
            raise bad_request("limit: Invalid value: must be an integer") from None
        if limit < 0:
            raise bad_request(f"limit: Invalid value: {limit}: must be greater than or equal "
                              "to 0")
        items: list[Obj] = []
        more = False
        name_pin = fields.name()
        for obj in self.store.items(rt.store_key, target.namespace or None):
            meta = obj["metadata"]
            if name_pin is not None and meta["name"] != name_pin:
                continue
            if start_after and f"{meta.get('namespace', '')}/{meta['name']}" <= start_after:
                continue
            if not (labels.matches(obj) and fields.matches(obj)):
                continue
            if limit and len(items) >= limit:
                more = True
                break
            items.append(obj)
        list_meta: Obj = {"resourceVersion": str(list_rv)}
        if more:
            last = items[-1]["metadata"]
            state = {"rv": list_rv, "start": f"{last.get('namespace', '')}/{last['name']}"}
            list_meta["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
        accept = request.headers.get("accept", "")
        if table.wants(accept, "Table"):
            return _json(200, table.table(rt, [self._out(rt, o) for o in items], now=self._now(),
                                          include=request.param("includeObject"),
                                          list_meta=list_meta))
        if table.wants(accept, "PartialObjectMetadataList"):
            return _json(200, {"kind": "PartialObjectMetadataList",
                               "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
                               "items": [{"kind": "PartialObjectMetadata",
                                          "apiVersion": "meta.k8s.io/v1",
                                          "metadata": o["metadata"]} for o in items]})
        if rt.custom:
            out_items = [self._out(rt, o) for o in items]
        else:
            # Built-in lists carry items without kind/apiVersion, as kube-apiserver sends them.
            out_items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                         for o in items]
        return _json(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                           "metadata": list_meta, "items": out_items})

    # ----- watch

    def _error_stream(self, error: ApiError) -> Stream:
        async def run(send: Send) -> None:
            await send(_line("ERROR", error.status()))

        return Stream(200, run)

    def _watch(self, target: Target, request: Request) -> Stream:
        rt = target.rt
        labels, fields = self._selectors(target, request)
        namespace = target.namespace or None
        name = target.name or fields.name()
        as_table = table.wants(request.headers.get("accept", ""), "Table")
        include = request.param("includeObject")
        bookmarks = request.flag("allowWatchBookmarks")
        send_initial = request.flag("sendInitialEvents")
        try:
            timeout = float(request.param("timeoutSeconds") or 0)
        except ValueError:
            raise bad_request("timeoutSeconds: must be an integer") from None
        rv_param = request.param("resourceVersion")

        def matches(obj: Obj | None) -> bool:
            if obj is None:
                return False
            meta = obj["metadata"]
            return ((namespace is None or meta.get("namespace", "") == namespace)
                    and (name is None or meta["name"] == name)
                    and labels.matches(obj) and fields.matches(obj))

        # Register and snapshot with no checkpoint in between: nothing is missed or doubled.
        initial: list[tuple[str, Obj]] = []
        if rv_param in ("", "0"):
            initial = [("ADDED", copy.deepcopy(o))
                       for o in self.store.items(rt.store_key, namespace) if matches(o)]
        else:
            since = self.store.events_since(rt.store_key, _parse_rv(rv_param))
            if since is None:
                return self._error_stream(expired(_parse_rv(rv_param), self.store.compacted + 1))
            for event in since:
                translated = _translate(event, matches)
                if translated is not None:
                    initial.append(translated)
        watcher = self.store.watch(rt.store_key, namespace=namespace, resource=rt.plural)
        self.store.notify()
        now = self._now

        def render(kind: str, obj: Obj) -> bytes:
            if as_table:
                return _line(kind, table.table(rt, [self._out(rt, obj)], now=now(),
                                               include=include))
            return _line(kind, self._out(rt, obj))

        async def run(send: Send) -> None:
            try:
                with trio.move_on_after(timeout) if timeout > 0 else nullcontext():
                    for kind, obj in initial:
                        await send(render(kind, obj))
                    if send_initial and bookmarks and rv_param in ("", "0"):
                        await send(self._bookmark(rt, initial_end=True))
                    await self._pump(watcher, rt, render, matches, send, bookmarks=bookmarks)
            finally:
                self.store.close_watcher(watcher)
                self.store.notify()

        return Stream(200, run)

    def _bookmark(self, rt: ResourceType, *, initial_end: bool = False) -> bytes:
        meta: Obj = {"resourceVersion": str(self.store.resource_version)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return _line("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version,
                                  "metadata": meta})

    async def _pump(self, watcher: Watcher, rt: ResourceType,
                    render: Callable[[str, Obj], bytes], matches: Callable[[Obj | None], bool],
                    send: Send, *, bookmarks: bool) -> None:
        next_bookmark = trio.current_time() + self.bookmark_interval
        while True:
            event: Event | None = None
            with trio.move_on_at(next_bookmark if bookmarks else float("inf")):
                try:
                    event = await watcher.receive.receive()
                except trio.EndOfChannel:
                    if watcher.abrupt:
                        raise AbortStream from None
                    return
            if event is None:
                next_bookmark = trio.current_time() + self.bookmark_interval
                # Only when the queue is empty is "now" a version this watcher has reached.
                if (not self.faults.drop_bookmarks
                        and watcher.receive.statistics().current_buffer_used == 0):
                    await send(self._bookmark(rt))
                continue
            translated = _translate(event, matches)
            if translated is not None:
                await send(render(*translated))

    # ----- writing

    def _field_validation(self, request: Request) -> str:
        value = request.param("fieldValidation") or "Warn"
        if value not in ("Strict", "Warn", "Ignore"):
            raise bad_request(f'fieldValidation: Unsupported value: "{value}": supported values: '
                              '"Ignore", "Strict", "Warn"')
        return value

    def _dry_run(self, request: Request) -> bool:
        value = request.param("dryRun")
        if value and value != "All":
            raise bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
        return value == "All"

    def _decoded(self, request: Request, rt: ResourceType) -> Any:
        """A request body in whichever of JSON, YAML or protobuf its Content-Type names."""
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type in ("application/yaml", "application/x-yaml"):
            return patch.parse_apply(request.body)
        if content_type in ("", "application/json", "*/*"):
            return patch.parse_json(request.body)
        accepted = ["application/json", "application/yaml"]
        if rt.kind in protobuf.READABLE_KINDS:
            accepted.append(protobuf.MEDIA_TYPE)
        if content_type == protobuf.MEDIA_TYPE:
            try:
                return protobuf.decode(request.body)
            except protobuf.UnsupportedKind:
                # Like kube-apiserver for a custom resource: a 415, here for any kind
                # whose protobuf message this server does not know.
                raise unsupported_media_type(accepted) from None
            except protobuf.ProtobufError as exc:
                raise bad_request(f"the protobuf body cannot be decoded: {exc}") from None
        # CBOR is not spoken here: 415 as kube-apiserver answers an unknown body type.
        raise unsupported_media_type(accepted)

    def _body(self, request: Request, target: Target) -> Obj:
        body = self._decoded(request, target.rt)
        if not isinstance(body, dict):
            raise bad_request("the body of the request is not a JSON object")
        self._check_body_type(target.rt, body)
        return body

    def _check_body_type(self, rt: ResourceType, body: Obj) -> None:
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if kind is not None and kind != rt.kind:
            raise bad_request(f"the API version in the data ({api_version}) does not match the "
                              f"expected API version ({rt.api_version})"
                              if kind == rt.kind else
                              f"kind in the data ({kind}) does not match the expected kind "
                              f"({rt.kind})")
        served = [f"{rt.group}/{v}" if rt.group else v
                  for v in (rt.served_versions or (rt.version,))]
        if api_version is not None and api_version not in served:
            raise bad_request(f"the API version in the data ({api_version}) does not match the "
                              f"expected API version ({rt.api_version})")
        if not isinstance(body.get("metadata", {}), dict):
            raise bad_request("metadata: must be an object")

    def _create(self, target: Target, request: Request) -> Response:
        body = self._body(request, target)
        meta = body.setdefault("metadata", {})
        if target.rt.namespaced:
            if meta.get("namespace") not in (None, "", target.namespace):
                raise bad_request("the namespace of the provided object does not match the "
                                  "namespace sent on the request")
            meta["namespace"] = target.namespace
        result = self._create_checked(target.rt, body, dry_run=self._dry_run(request),
                                      field_validation=self._field_validation(request))
        return self._render_one(target, request, 201, result.obj, result.warnings)

    def create_object(self, rt: ResourceType, body: Obj) -> Obj:
        """Create without a request (seeding, the sandbox); raises ApiError like POST."""
        return self._create_checked(rt, copy.deepcopy(body), dry_run=False,
                                    field_validation="Ignore").obj

    def _create_checked(self, rt: ResourceType, body: Obj, *, dry_run: bool,
                        field_validation: str) -> WriteResult:
        _check_decodable(rt, body)
        meta = body.setdefault("metadata", {})
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(
                    secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
            else:
                raise invalid(rt.kind, rt.group, "", [(
                    "metadata.name", "FieldValueRequired",
                    "Required value: name or generateName is required")])
        if rt.namespaced:
            namespace = meta.get("namespace") or ""
            if self.store.peek(NAMESPACE_KEY, "", namespace) is None:
                raise not_found("namespaces", "", namespace)
        else:
            meta.pop("namespace", None)
        if self.store.peek(rt.store_key, meta.get("namespace", ""), meta["name"]) is not None:
            raise already_exists(rt.plural, rt.group, meta["name"])
        return self._write(rt, body, None, subresource=None, dry_run=dry_run,
                           field_validation=field_validation)

    def _update(self, target: Target, request: Request) -> Response:
        body = self._body(request, target)
        assert target.name is not None
        meta = body.setdefault("metadata", {})
        if meta.get("name") not in (None, target.name):
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the "
                              f"name on the URL ({target.name})")
        if target.rt.namespaced and meta.get("namespace") not in (None, "", target.namespace):
            raise bad_request("the namespace of the provided object does not match the "
                              "namespace sent on the request")
        meta["name"] = target.name
        if target.rt.namespaced:
            meta["namespace"] = target.namespace
        old = self.store.get(target.rt.store_key, target.namespace or "", target.name)
        if old is None:
            if target.subresource is None and target.rt.kind != "Pod":
                # PUT creates when missing (AllowCreateOnUpdate) for CRs and most kinds.
                result = self._create_checked(target.rt, body, dry_run=self._dry_run(request),
                                              field_validation=self._field_validation(request))
                return self._render_one(target, request, 201, result.obj, result.warnings)
            raise not_found(target.rt.plural, target.rt.group, target.name)
        if not meta.get("resourceVersion") and target.rt.custom:
            raise invalid(target.rt.kind, target.rt.group, target.name, [(
                "metadata.resourceVersion", "FieldValueInvalid",
                "Invalid value: 0x0: must be specified for an update")])
        result = self._write(target.rt, body, old, subresource=target.subresource,
                             dry_run=self._dry_run(request),
                             field_validation=self._field_validation(request))
        return self._render_one(target, request, result.status, result.obj, result.warnings)

    def _patch(self, target: Target, request: Request) -> Response:
        rt = target.rt
        assert target.name is not None
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        strategic_ok = not rt.custom
        accepted = patch.accepted_types(strategic_ok=strategic_ok)
        if content_type not in accepted:
            raise unsupported_media_type(accepted)
        dry_run = self._dry_run(request)
        field_validation = self._field_validation(request)
        old = self.store.get(rt.store_key, target.namespace or "", target.name)
        if content_type == patch.APPLY:
            return self._apply(target, request, old, dry_run=dry_run,
                               field_validation=field_validation)
        if old is None:
            raise not_found(rt.plural, rt.group, target.name)
        live = self._out(rt, old)
        new = patch.apply_patch(content_type, live, request.body, strategic_ok=strategic_ok)
        self._check_body_type(rt, new)
        new_meta = new.setdefault("metadata", {})
        if not isinstance(new_meta, dict):
            raise bad_request("metadata: must be an object")
        if new_meta.get("name") != target.name:
            raise bad_request("metadata.name: the name of the object cannot change in a patch")
        result = self._write(rt, new, old, subresource=target.subresource, dry_run=dry_run,
                             field_validation=field_validation)
        return self._render_one(target, request, result.status, result.obj, result.warnings)

    def _apply(self, target: Target, request: Request, old: Obj | None, *, dry_run: bool,
               field_validation: str) -> Response:
        rt = target.rt
        assert target.name is not None
        if not request.param("fieldManager"):
            raise bad_request("PATCH, application/apply-patch+yaml requests require a "
                              "fieldManager")
        applied = patch.parse_apply(request.body)
        if applied.get("kind") is None or applied.get("apiVersion") is None:
            raise bad_request("invalid object type: the applied configuration needs "
                              "apiVersion and kind")
        self._check_body_type(rt, applied)
        meta = applied.setdefault("metadata", {})
        if meta.get("name") not in (None, target.name):
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the "
                              f"name on the URL ({target.name})")
        meta["name"] = target.name
        if rt.namespaced:
            meta["namespace"] = target.namespace
        if old is None:
            if target.subresource is not None:
                raise not_found(rt.plural, rt.group, target.name)
            result = self._create_checked(rt, applied, dry_run=dry_run,
                                          field_validation=field_validation)
            return self._render_one(target, request, 201, result.obj, result.warnings)
        new = patch.strategic_merge(self._out(rt, old), applied, strategic=False)
        result = self._write(rt, new, old, subresource=target.subresource, dry_run=dry_run,
                             field_validation=field_validation)
        return self._render_one(target, request, result.status, result.obj, result.warnings)

    def _write(self, rt: ResourceType, new: Obj, old: Obj | None, *, subresource: str | None,
               dry_run: bool, field_validation: str) -> WriteResult:
        """The shared write pipeline for create (old None), update and patch."""
        new = copy.deepcopy(new)
        _check_decodable(rt, new)
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        meta = new.setdefault("metadata", {})
        name = meta.get("name", "")
        if old is None:
            problem = builtin.name_problem(rt, name)
            if problem:
                raise invalid(rt.kind, rt.group, name, [(
                    "metadata.name", "FieldValueInvalid",
                    f"Invalid value: {builtin.quote(name)}: {problem}")])
            for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(field, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _timestamp(self._now())
            if rt.has_generation:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            if rt.has_status and rt.custom:
                new.pop("status", None)  # create cannot set status (status subresource)
            builtin.on_create(rt, new)
        else:
            old_meta = old["metadata"]
            given_rv = meta.get("resourceVersion")
            if given_rv and given_rv != old_meta["resourceVersion"]:
                raise conflict(rt.plural, rt.group, name)
            if subresource == "status":
                # A status write changes status only (metadata, spec: the old ones).
                status = new.get("status")
                new = copy.deepcopy(old)
                if status is None:
                    new.pop("status", None)
                else:
                    new["status"] = status
                meta = new["metadata"]
            else:
                if rt.has_status:
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                    else:
                        new.pop("status", None)
                for field in ("uid", "creationTimestamp", "deletionTimestamp",
                              "deletionGracePeriodSeconds", "generation", "namespace"):
                    if field in old_meta:
                        meta[field] = old_meta[field]
                    else:
                        meta.pop(field, None)
                if old_meta.get("deletionTimestamp"):
                    added = set(meta.get("finalizers") or ()) - set(
                        old_meta.get("finalizers") or ())
                    if added:
                        raise invalid(rt.kind, rt.group, name, [(
                            "metadata.finalizers", "FieldValueForbidden",
                            "Forbidden: no new finalizers can be added if the object is being "
                            "deleted, found new finalizers " + json.dumps(sorted(added)))])
            meta["resourceVersion"] = old_meta["resourceVersion"]
        causes = builtin.on_write(rt, new)
        causes += builtin.validate(rt, new, old)
        if not causes and rt.kind == "CustomResourceDefinition":
            causes = _crd_schema_problems(new)
        if causes:
            raise invalid(rt.kind, rt.group, name, causes)
        warnings: list[str] = []
        if rt.crd_name is not None:
            schema = self._schemas.get(f"{rt.crd_name}/{rt.version}")
            new, warnings = enforce(schema, new, old, kind=rt.kind, group=rt.group,
                                    field_validation=field_validation)
            meta = new["metadata"]
        if old is not None:
            if rt.has_generation and _spec_part(new, rt) != _spec_part(old, rt):
                meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
            if _same(new, old):
                return WriteResult(self._out(rt, old), 200, tuple(warnings))
        if dry_run:
            return WriteResult(self._out(rt, new), 201 if old is None else 200, tuple(warnings))
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            stored = self.store.write(rt.store_key, new, event_type="DELETED", old=old)
            self._after_delete(rt, stored)
            return WriteResult(self._out(rt, stored), 200, tuple(warnings))
        stored = self.store.write(rt.store_key, new,
                                  event_type="ADDED" if old is None else "MODIFIED", old=old)
        if rt.kind == "CustomResourceDefinition":
            self._register_crd(stored)
        return WriteResult(self._out(rt, stored), 201 if old is None else 200, tuple(warnings))

    # ----- deleting

    def _delete(self, target: Target, request: Request) -> Response:
        rt = target.rt
        assert target.name is not None
        options: Obj = {}
        if request.body.strip():
            parsed = self._decoded(request, rt)
            if not isinstance(parsed, dict):
                raise bad_request("DeleteOptions must be a JSON object")
            options = parsed
        old = self._get(target)
        preconditions = options.get("preconditions") or {}
        if not isinstance(preconditions, dict):
            raise bad_request("preconditions must be an object")
        for field in ("uid", "resourceVersion"):
            wanted = preconditions.get(field)
            if wanted and wanted != old["metadata"].get(field):
                raise conflict(rt.plural, rt.group, target.name,
                               f"Precondition failed: {field.upper() if field == 'uid' else field}"
                               f" in precondition: {wanted}, {field} in object meta: "
                               f"{old['metadata'].get(field)}")
        result, status = self.delete_object(rt, old, dry_run=self._dry_run(request))
        return self._render_one(target, request, status, result)

    def delete_object(self, rt: ResourceType, old: Obj, *, dry_run: bool = False
                      ) -> tuple[Obj, int]:
        """Delete now (200), or mark for deletion while finalizers remain (202)."""
        meta = old["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return self._out(rt, old), 202
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = _timestamp(self._now())
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if rt.has_generation:
                new["metadata"]["generation"] = int(meta.get("generation", 1)) + 1
            if dry_run:
                return self._out(rt, new), 202
            return self._out(rt, self.store.write(rt.store_key, new, event_type="MODIFIED",
                                                  old=old)), 202
        if dry_run:
            return self._out(rt, old), 200
        stored = self.store.write(rt.store_key, copy.deepcopy(old), event_type="DELETED", old=old)
        self._after_delete(rt, stored)
        return self._out(rt, stored), 200

    def _after_delete(self, rt: ResourceType, obj: Obj) -> None:
        if rt.kind == "CustomResourceDefinition":
            self._unregister_crd(obj["metadata"]["name"], drop_objects=True)
        elif rt.kind == "Namespace":
            # Namespace deletion removes its contents (the namespace controller's job).
            namespace = obj["metadata"]["name"]
            seen: set[str] = set()
            for other in self.types():
                if not other.namespaced or other.store_key in seen:
                    continue
                seen.add(other.store_key)
                for child in list(self.store.items(other.store_key, namespace)):
                    self.delete_object(other, copy.deepcopy(child))

    def _delete_collection(self, target: Target, request: Request) -> Response:
        rt = target.rt
        labels, fields = self._selectors(target, request)
        dry_run = self._dry_run(request)
        deleted = []
        for obj in list(self.store.items(rt.store_key, target.namespace or None)):
            if labels.matches(obj) and fields.matches(obj):
                result, _ = self.delete_object(rt, copy.deepcopy(obj), dry_run=dry_run)
                deleted.append(result)
        return _json(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                           "metadata": {"resourceVersion": str(self.store.resource_version)},
                           "items": deleted})


def _check_decodable(rt: ResourceType, obj: Obj) -> None:
    """400 for a field of the wrong JSON type, as kube-apiserver's decoder answers it."""
    problem = builtin.decode_problem(rt, obj)
    if problem is not None:
        raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                          f"{rt.kind}: {problem}")


def _crd_schema_problems(crd: Obj) -> list[builtin.Cause]:
    """Compile every version's schema before the CRD is stored: one that cannot be
    served is a 422, never a stored CRD whose objects then fail to write."""
    causes: list[builtin.Cause] = []
    for i, version in enumerate(crd["spec"]["versions"]):
        try:
            load_schema(crd, version["name"])
        except BadSchema as exc:
            causes.append((f"spec.versions[{i}].schema.openAPIV3Schema", "FieldValueInvalid",
                           f"Invalid value: {exc}"))
    return causes


def _warning(text: str) -> str:
    """An RFC 7234 warning header value, quoted the way kube-apiserver quotes it."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{escaped}"'


def _line(kind: str, obj: Obj) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _translate(event: Event, matches: Callable[[Obj | None], bool]) -> tuple[str, Obj] | None:
    """The event a selective watcher sees: objects entering or leaving its selection
    arrive as ADDED or DELETED, as kube-apiserver's watch cache sends them."""
    now, before = matches(event.obj), matches(event.old)
    if event.type == "DELETED":
        return ("DELETED", event.obj) if (now or before) else None
    if event.type == "ADDED":
        return ("ADDED", event.obj) if now else None
    if now and before:
        return ("MODIFIED", event.obj)
    if now:
        return ("ADDED", event.obj)
    if before:
        return ("DELETED", event.obj)
    return None


def _parse_rv(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise bad_request(f'resourceVersion: Invalid value: "{text}": must be an integer') from None
    if value < 0:
        raise bad_request(f'resourceVersion: Invalid value: "{text}": must be non-negative')
    return value


def _timestamp(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: Obj, rt: ResourceType) -> Any:
    """What moves generation: all but metadata and status for CRs, spec otherwise."""
    if rt.custom:
        return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion",
                                                          "kind")}
    return obj.get("spec")


def _same(new: Obj, old: Obj) -> bool:
    """A write that changes nothing keeps the resourceVersion and sends no event."""
    def strip(obj: Obj) -> Obj:
        out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        out["metadata"] = {k: v for k, v in obj.get("metadata", {}).items()
                           if k not in ("resourceVersion", "managedFields")}
        return out

    return strip(new) == strip(old)
