"""Turning objects and errors into responses: JSON bodies, Status errors, one-object
renderings (full, Table, PartialObjectMetadata), Warning headers, watch lines."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

from egressd import timestamps
from egressd.sandbox.apiserver import table
from egressd.sandbox.apiserver.errors import ApiError
from egressd.sandbox.apiserver.resources import ResourceType
from egressd.sandbox.apiserver.store import Obj
from egressd.sandbox.apiserver.wire import Request, Response


def json_response(status: int, body: Any, headers: tuple[tuple[str, str], ...] = ()
                  ) -> Response:
    return Response(status, json.dumps(body, separators=(",", ":")).encode(), headers)


def error_response(exc: ApiError) -> Response:
    return json_response(exc.code, exc.status(), exc.headers)


def out(rt: ResourceType, obj: Obj) -> Obj:
    """A stored object as served: a copy, with the resource's apiVersion and kind."""
    served = copy.deepcopy(obj)
    served["apiVersion"] = rt.api_version
    served["kind"] = rt.kind
    return served


def warning(text: str) -> str:
    """An RFC 7234 warning header value, quoted the way kube-apiserver quotes it."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{escaped}"'


def render_one(rt: ResourceType, request: Request, status: int, obj: Obj, *,
               now: datetime.datetime, warnings: tuple[str, ...] = ()) -> Response:
    """One object in the representation the request's Accept asks for."""
    accept = request.headers.get("accept", "")
    headers = tuple(("Warning", warning(w)) for w in warnings)
    if table.wants(accept, "Table"):
        return json_response(status, table.table(rt, [out(rt, obj)], now=now,
                                                 include=request.param("includeObject")),
                             headers)
    if table.wants(accept, "PartialObjectMetadata"):
        return json_response(status, {"kind": "PartialObjectMetadata",
                                      "apiVersion": "meta.k8s.io/v1",
                                      "metadata": obj.get("metadata", {})}, headers)
    return json_response(status, out(rt, obj), headers)


def watch_line(kind: str, obj: Obj) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def timestamp(when: datetime.datetime) -> str:
    """metav1.Time: whole seconds, UTC, "Z" (the one RFC 3339 writer)."""
    return timestamps.format_time(when, precision="seconds")
