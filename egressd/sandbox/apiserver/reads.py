"""Reading: get one object, list a collection (selectors, pagination with `continue`,
Table and PartialObjectMetadataList renderings)."""

from __future__ import annotations

import base64
import binascii
import datetime
import json

import attrs

from egressd.sandbox.apiserver import table
from egressd.sandbox.apiserver.errors import bad_request, expired, not_found
from egressd.sandbox.apiserver.respond import json_response, out
from egressd.sandbox.apiserver.routing import Target
from egressd.sandbox.apiserver.selectors import FieldSelector, LabelSelector
from egressd.sandbox.apiserver.store import Obj, Store
from egressd.sandbox.apiserver.wire import Request, Response


def get(store: Store, target: Target) -> Obj:
    assert target.name is not None
    obj = store.get(target.rt.store_key, target.namespace or "", target.name)
    if obj is None:
        raise not_found(target.rt.plural, target.rt.group, target.name)
    return obj


def selectors(target: Target, request: Request) -> tuple[LabelSelector, FieldSelector]:
    labels = LabelSelector.parse(request.param("labelSelector"))
    fields = FieldSelector.parse(request.param("fieldSelector"),
                                 supported=target.rt.field_labels)
    return labels, fields


def parse_rv(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise bad_request(f'resourceVersion: Invalid value: "{text}": must be an integer') from None
    if value < 0:
        raise bad_request(f'resourceVersion: Invalid value: "{text}": must be non-negative')
    return value


@attrs.frozen
class _Page:
    """Where a list page starts and how long it may be."""

    start_after: str  # "namespace/name" of the previous page's last item, or ""
    list_rv: int
    limit: int  # 0: no limit


def _page(store: Store, request: Request) -> _Page:
    rv_param = request.param("resourceVersion")
    if request.param("resourceVersionMatch") == "Exact" and rv_param:
        requested = parse_rv(rv_param)
        if requested < store.compacted:
            raise expired(requested, store.compacted + 1)
    start_after, list_rv = "", store.resource_version
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
        raise bad_request(f"limit: Invalid value: {limit}: must be greater than or equal to 0")
    return _Page(start_after, list_rv, limit)


def _key(meta: Obj) -> str:
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _select(store: Store, target: Target, page: _Page, labels: LabelSelector,
            fields: FieldSelector) -> tuple[list[Obj], bool]:
    """The page's items, and whether more follow."""
    name_pin = fields.name()
    items: list[Obj] = []
    for obj in store.items(target.rt.store_key, target.namespace or None):
        meta = obj["metadata"]
        if name_pin is not None and meta["name"] != name_pin:
            continue
        if page.start_after and _key(meta) <= page.start_after:
            continue
        if not (labels.matches(obj) and fields.matches(obj)):
            continue
        if page.limit and len(items) >= page.limit:
            return items, True
        items.append(obj)
    return items, False


def list_objects(store: Store, target: Target, request: Request, *,
                 now: datetime.datetime) -> Response:
    rt = target.rt
    labels, fields = selectors(target, request)
    page = _page(store, request)
    items, more = _select(store, target, page, labels, fields)
    list_meta: Obj = {"resourceVersion": str(page.list_rv)}
    if more:
        state = {"rv": page.list_rv, "start": _key(items[-1]["metadata"])}
        list_meta["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
    accept = request.headers.get("accept", "")
    if table.wants(accept, "Table"):
        return json_response(200, table.table(rt, [out(rt, o) for o in items], now=now,
                                              include=request.param("includeObject"),
                                              list_meta=list_meta))
    if table.wants(accept, "PartialObjectMetadataList"):
        return json_response(200, {"kind": "PartialObjectMetadataList",
                                   "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
                                   "items": [{"kind": "PartialObjectMetadata",
                                              "apiVersion": "meta.k8s.io/v1",
                                              "metadata": o["metadata"]} for o in items]})
    if rt.custom:
        out_items = [out(rt, o) for o in items]
    else:
        # Built-in lists carry items without kind/apiVersion, as kube-apiserver sends them.
        out_items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                     for o in items]
    return json_response(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                               "metadata": list_meta, "items": out_items})
