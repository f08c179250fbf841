"""Field managers (`metadata.managedFields`) and server-side apply's merge.

Each write records which manager owns which fields, in kube-apiserver's
`FieldsV1` shape (`{"f:spec": {"f:port": {}}}`). An apply owns exactly the
fields of its configuration: fields it set before and no longer sets are
removed (unless another manager owns them too), and a field another manager
owns with a different value is a 409 conflict unless the apply forces it,
which moves the field to the applier. An update (PUT, PATCH, POST) takes over
the fields it changed.

Fidelity notes: lists are atomic (a list is one field, as for a CRD list
without `x-kubernetes-list-type`); status is tracked under the `status`
subresource, as a real server does; metadata that the server owns is never a
managed field.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

from egressd import timestamps
from egressd.sandbox.apiserver.errors import ApiError
from egressd.sandbox.apiserver.store import Obj

Path = tuple[str, ...]

# Metadata the server owns: never a managed field.
_SERVER_METADATA = frozenset({"name", "namespace", "uid", "resourceVersion", "generation",
                              "creationTimestamp", "deletionTimestamp",
                              "deletionGracePeriodSeconds", "managedFields", "selfLink",
                              "generateName"})


@attrs.frozen
class Manager:
    """Who writes, and how: `operation` is "Apply" or "Update"."""

    name: str
    operation: str
    subresource: str = ""


def manager_for(field_manager: str, user_agent: str, *, operation: str,
                subresource: str | None) -> Manager:
    """The manager of a write: `fieldManager`, else the User-Agent's program name."""
    name = field_manager or user_agent.split("/", 1)[0] or "unknown"
    return Manager(name, operation, subresource or "")


# ----- field sets


def _leaves(value: Any, prefix: Path) -> Iterator[Path]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, (*prefix, key))
    else:
        yield prefix  # a scalar, a list (atomic) or an empty map


def fields_of(obj: Obj, *, subresource: str = "") -> set[Path]:
    """The managed fields `obj` sets: under status for the status subresource,
    everything but status and server-owned metadata otherwise."""
    paths: set[Path] = set()
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if (key == "status") != (subresource == "status"):
            continue
        if key == "metadata" and isinstance(value, dict):
            for meta_key, item in value.items():
                if meta_key not in _SERVER_METADATA:
                    paths.update(_leaves(item, ("metadata", meta_key)))
        else:
            paths.update(_leaves(value, (key,)))
    return paths


def to_fields_v1(paths: Iterable[Path]) -> Obj:
    tree: Obj = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def from_fields_v1(tree: Any, prefix: Path = ()) -> set[Path]:
    """The leaf paths of a FieldsV1 tree (keys other than `f:` are not ours: skipped)."""
    if not isinstance(tree, dict):
        return set()
    children = {k: v for k, v in tree.items() if k.startswith("f:")}
    if not children:
        return {prefix} if prefix else set()
    paths: set[Path] = set()
    for key, sub in children.items():
        paths |= from_fields_v1(sub, (*prefix, key[2:]))
    return paths


def _get(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _ABSENT
        obj = obj[key]
    return obj


class _Absent:
    """A field that is not there (distinct from null)."""


_ABSENT = _Absent()


def _remove(obj: Obj, path: Path) -> None:
    parent: Any = obj
    for key in path[:-1]:
        parent = parent.get(key) if isinstance(parent, dict) else None
    if isinstance(parent, dict):
        parent.pop(path[-1], None)


def _set(obj: Obj, path: Path, value: Any) -> None:
    node = obj
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = copy.deepcopy(value)


def _covers(owned: Path, path: Path) -> bool:
    """`owned` is `path` or one of its ancestors or descendants (the same field tree)."""
    shorter = min(len(owned), len(path))
    return owned[:shorter] == path[:shorter]


# ----- the managedFields list


@attrs.define
class _Entry:
    manager: Manager
    api_version: str
    time: str
    fields: set[Path]


def _entries(obj: Obj | None) -> list[_Entry]:
    raw = ((obj or {}).get("metadata") or {}).get("managedFields") or []
    entries = []
    for item in raw if isinstance(raw, list) else ():
        if not isinstance(item, dict) or not isinstance(item.get("manager"), str):
            continue
        manager = Manager(item["manager"], str(item.get("operation", "Update")),
                          str(item.get("subresource", "")))
        entries.append(_Entry(manager, str(item.get("apiVersion", "")),
                              str(item.get("time", "")), from_fields_v1(item.get("fieldsV1"))))
    return entries


def _render(entries: list[_Entry]) -> list[Obj]:
    out = []
    for entry in entries:
        if not entry.fields:
            continue  # a manager that owns nothing any more is dropped, as upstream
        item: Obj = {"manager": entry.manager.name, "operation": entry.manager.operation,
                     "apiVersion": entry.api_version, "time": entry.time,
                     "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(entry.fields)}
        if entry.manager.subresource:
            item["subresource"] = entry.manager.subresource
        out.append(item)
    return out


def _own(entries: list[_Entry], manager: Manager, paths: set[Path], *, api_version: str,
         now: str, replace: bool) -> None:
    """Give `manager` `paths` (all it owns with `replace`, else in addition)."""
    for entry in entries:
        if entry.manager == manager:
            entry.fields = set(paths) if replace else entry.fields | paths
            entry.api_version, entry.time = api_version, now
            return
    entries.append(_Entry(manager, api_version, now, set(paths)))


def _timestamp(now: datetime.datetime) -> str:
    return timestamps.format_time(now, precision="seconds")


# ----- updates


def record_update(new: Obj, old: Obj | None, manager: Manager, *, api_version: str,
                  now: datetime.datetime) -> None:
    """Set `new`'s managedFields after a non-apply write by `manager`: it takes over
    the fields it changed; fields the write removed leave every manager."""
    entries = _entries(old)
    before = fields_of(old, subresource=manager.subresource) if old is not None else set()
    after = fields_of(new, subresource=manager.subresource)
    changed = {p for p in after if old is None or _get(new, p) != _get(old, p)}
    gone = before - after
    for entry in entries:
        if entry.manager.subresource == manager.subresource:
            entry.fields = {p for p in entry.fields
                            if not any(_covers(c, p) for c in changed | gone)}
    if changed:
        _own(entries, manager, changed, api_version=api_version, now=_timestamp(now),
             replace=False)
    new.setdefault("metadata", {})["managedFields"] = _render(entries)


# ----- apply


def apply(old: Obj, applied: Obj, manager: Manager, *, force: bool, api_version: str,
          now: datetime.datetime) -> Obj:
    """The object after `manager` applies `applied` to `old` (a copy, managedFields set).

    Raises a 409 naming every field another manager owns with another value,
    unless `force`, which takes those fields from their managers.
    """
    entries = _entries(old)
    wanted = fields_of(applied, subresource=manager.subresource)
    others = [e for e in entries if e.manager != manager
              and e.manager.subresource == manager.subresource]
    conflicts = _conflicts(old, applied, wanted, others)
    if conflicts and not force:
        raise _conflict_error(conflicts)
    for entry, paths in conflicts:
        entry.fields -= paths
    mine = next((e for e in entries if e.manager == manager), None)
    previously = mine.fields if mine is not None else set()
    shared = set().union(*(e.fields for e in others)) if others else set()
    result = copy.deepcopy(old)
    for path in previously - wanted:
        if not any(_covers(p, path) for p in shared | wanted):
            _remove(result, path)
    for path in wanted:
        _set(result, path, _get(applied, path))
    _own(entries, manager, wanted, api_version=api_version, now=_timestamp(now), replace=True)
    result.setdefault("metadata", {})["managedFields"] = _render(entries)
    return result


def _conflicts(old: Obj, applied: Obj, wanted: set[Path], others: list[_Entry]
               ) -> list[tuple[_Entry, set[Path]]]:
    found = []
    for entry in others:
        paths = {owned for owned in entry.fields for path in wanted
                 if _covers(owned, path) and _get(old, owned) != _get(applied, owned)}
        if paths:
            found.append((entry, paths))
    return found


def _dotted(path: Path) -> str:
    return "".join(f".{key}" for key in path)


def _conflict_error(conflicts: list[tuple[_Entry, set[Path]]]) -> ApiError:
    causes = []
    lines = []
    for entry, paths in conflicts:
        for path in sorted(paths):
            who = f'conflict with "{entry.manager.name}"'
            if entry.manager.operation == "Update":
                who += f" using {entry.api_version}"
            causes.append({"reason": "FieldManagerConflict", "message": who,
                           "field": _dotted(path)})
            lines.append(f"{who}: {_dotted(path)}")
    count = len(causes)
    noun = "conflict" if count == 1 else "conflicts"
    message = f"Apply failed with {count} {noun}: " + (
        lines[0] if count == 1 else "\n" + "\n".join(f"- {line}" for line in lines))
    return ApiError(409, "Conflict", message, details={"causes": causes})


def fields_json(obj: Obj) -> str:
    """The object's managedFields as compact JSON (for tests and debugging)."""
    return json.dumps((obj.get("metadata") or {}).get("managedFields") or [], sort_keys=True)
