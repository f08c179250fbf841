"""Server-side printing: `Accept: application/json;as=Table` answers a `Table`.

kubectl 1.32 has no client-side printers for any kind and never reads a
CRD's additionalPrinterColumns itself: the columns it shows are the ones
this module renders (JSONPath cells, Age as "5m", rows carrying
PartialObjectMetadata with the namespace so `-A` can fill its column).
"""

from __future__ import annotations

import datetime
import functools
import logging
from collections.abc import Callable
from typing import Any

from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.ext.parser import parse as jsonpath_parse

from egressd import timestamps
from egressd.sandbox.apiserver.resources import ResourceType

log = logging.getLogger("egressd.sandbox.apiserver")

Obj = dict[str, Any]

_NAME = {"name": "Name", "type": "string", "format": "name", "priority": 0,
         "description": "Name must be unique within a namespace. Is required when creating "
                        "resources, although some resources may allow a client to request the "
                        "generation of an appropriate name automatically."}
_AGE = {"name": "Age", "type": "string", "format": "", "priority": 0,
        "description": "CreationTimestamp is a timestamp representing the server time when this "
                       "object was created."}


def wants(accept: str, what: str) -> bool:
    """True when the Accept header asks for `as=<what>` (Table, PartialObjectMetadata...)."""
    for media in accept.split(","):
        params = {p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip()
                  for p in media.split(";")[1:] if "=" in p}
        if params.get("as") == what:
            return True
    return False


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration ("5m", "3h12m", "2d5h")."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    days = hours // 24
    if hours < 24 * 365 * 8:
        rest = days % 365
        return f"{days // 365}y" if rest == 0 else f"{days // 365}y{rest}d"
    return f"{days // 365}y"


def parse_time(text: str) -> datetime.datetime | None:
    try:
        return timestamps.parse_time(text)
    except ValueError:
        return None


def age(timestamp: Any, now: datetime.datetime) -> str:
    when = parse_time(timestamp) if isinstance(timestamp, str) else None
    if when is None:
        return "<unknown>"
    return human_duration((now - when).total_seconds())


@functools.lru_cache(maxsize=256)
def _compiled(path: str) -> Any:
    expr = path.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    if not expr.startswith("$"):
        expr = "$" + expr
    return jsonpath_parse(expr)


def jsonpath_cell(obj: Obj, path: str, column_type: str, now: datetime.datetime) -> Any:
    """One printer column cell, typed like kube-apiserver's table convertor."""
    try:
        matches = [m.value for m in _compiled(path).find(obj)]
    except (JsonPathLexerError, JsonPathParserError, Exception):
        # kube-apiserver renders a column whose path fails as an empty cell
        # (jsonpath-ng raises assorted errors on odd data).
        log.debug("printer column path failed", extra={"path": path})
        return None
    if not matches:
        return None
    value = matches[0] if len(matches) == 1 else matches
    if column_type == "date":
        return age(value, now) if isinstance(value, str) else None
    if column_type == "integer" and isinstance(value, bool | int | float):
        return int(value)
    if column_type == "number" and isinstance(value, int | float):
        return value
    if column_type == "boolean" and isinstance(value, bool):
        return value
    if isinstance(value, dict | list):
        import json

        return json.dumps(value, separators=(",", ":"))
    if column_type in ("integer", "number", "boolean"):
        return None
    return value if isinstance(value, str) else str(value)


Cells = Callable[[Obj, datetime.datetime], list[Any]]


def _builtin_columns(kind: str) -> tuple[list[dict[str, Any]], Cells]:
    def col(name: str, kind_: str = "string", priority: int = 0) -> dict[str, Any]:
        return {"name": name, "type": kind_, "format": "", "priority": priority,
                "description": name}

    def meta(o: Obj) -> Obj:
        return o.get("metadata") or {}

    if kind == "Pod":
        def pod(o: Obj, now: datetime.datetime) -> list[Any]:
            statuses = (o.get("status") or {}).get("containerStatuses") or []
            containers = (o.get("spec") or {}).get("containers") or []
            ready = sum(1 for c in statuses if c.get("ready"))
            restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
            phase = (o.get("status") or {}).get("phase", "")
            if meta(o).get("deletionTimestamp"):
                phase = "Terminating"
            return [meta(o).get("name"), f"{ready}/{len(containers)}", phase, restarts,
                    age(meta(o).get("creationTimestamp"), now),
                    (o.get("status") or {}).get("podIP") or "<none>",
                    (o.get("spec") or {}).get("nodeName") or "<none>"]
        return ([_NAME, col("Ready"), col("Status"), col("Restarts", "integer"), _AGE,
                 col("IP", priority=1), col("Node", priority=1)], pod)
    if kind == "Secret":
        return ([_NAME, col("Type"), col("Data", "integer"), _AGE],
                lambda o, now: [meta(o).get("name"), o.get("type", ""), len(o.get("data") or {}),
                                age(meta(o).get("creationTimestamp"), now)])
    if kind == "Namespace":
        return ([_NAME, col("Status"), _AGE],
                lambda o, now: [meta(o).get("name"), (o.get("status") or {}).get("phase", ""),
                                age(meta(o).get("creationTimestamp"), now)])
    if kind == "Event":
        def event(o: Obj, now: datetime.datetime) -> list[Any]:
            involved = o.get("involvedObject") or {}
            last = o.get("lastTimestamp") or o.get("eventTime") or meta(o).get(
                "creationTimestamp")
            return [age(last, now), o.get("type", ""), o.get("reason", ""),
                    f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
                    o.get("message", "")]
        return ([col("Last Seen"), col("Type"), col("Reason"), col("Object"), col("Message")],
                event)
    if kind == "Lease":
        return ([_NAME, col("Holder"), _AGE],
                lambda o, now: [meta(o).get("name"),
                                (o.get("spec") or {}).get("holderIdentity", ""),
                                age(meta(o).get("creationTimestamp"), now)])
    if kind == "CustomResourceDefinition":
        return ([_NAME, col("Created At", "date")],
                lambda o, now: [meta(o).get("name"), meta(o).get("creationTimestamp")])
    return ([_NAME, _AGE], lambda o, now: [meta(o).get("name"),
                                           age(meta(o).get("creationTimestamp"), now)])


def columns(rt: ResourceType) -> tuple[list[dict[str, Any]], Cells]:
    """Column definitions and the cell function for a resource type."""
    if not rt.custom:
        return _builtin_columns(rt.kind)
    if not rt.printer_columns:
        return _builtin_columns("")
    defs = [_NAME]
    for column in rt.printer_columns:
        defs.append({"name": column.get("name", ""), "type": column.get("type", "string"),
                     "format": column.get("format", ""),
                     "description": column.get("description", ""),
                     "priority": int(column.get("priority", 0))})

    def cells(obj: Obj, now: datetime.datetime) -> list[Any]:
        row: list[Any] = [(obj.get("metadata") or {}).get("name")]
        for column in rt.printer_columns:
            row.append(jsonpath_cell(obj, column.get("jsonPath", ""),
                                     column.get("type", "string"), now))
        return row

    return defs, cells


def _row_object(rt: ResourceType, obj: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {}}


def table(rt: ResourceType, objects: list[Obj], *, now: datetime.datetime,
          include: str = "Metadata", list_meta: Obj | None = None) -> Obj:
    """A meta.k8s.io/v1 Table of `objects` (include: Object, Metadata or None)."""
    defs, cells = columns(rt)
    rows = []
    for obj in objects:
        row: Obj = {"cells": cells(obj, now)}
        row_obj = _row_object(rt, obj, include or "Metadata")
        if row_obj is not None:
            row["object"] = row_obj
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta or {},
            "columnDefinitions": defs, "rows": rows}
