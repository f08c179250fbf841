"""CEL: every `x-kubernetes-validations` rule run over the value (transition rules
with `oldSelf` where an old value correlates), failures worded as kube-apiserver's."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any

from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from egressd.sandbox.schema.nodes import Node, Rule
from egressd.sandbox.schema.values import (
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    MISSING,
    REQUIRED,
    FieldError,
    member_path,
    parse_date_time,
)

_NO_SUCH_MEMBER = re.compile(r"no such member in mapping: '([^']*)'")


def run_rules(node: Node, value: Any, old: Any, path: str,
              errors: list[FieldError], *, root: bool = False) -> None:
    """Every rule at `node` over `value`, then at every node below it (depth first)."""
    if value is None:
        return
    if node.rules:
        _run_node_rules(node, value, old, path, errors, root=root)
    if isinstance(value, dict):
        _run_member_rules(node, value, old, path, errors, root=root)
    elif isinstance(value, list) and node.items is not None:
        old_by_key = _map_list_index(node, old)
        for i, item in enumerate(value):
            old_elem: Any = MISSING
            if old_by_key is not None and isinstance(item, dict):
                old_elem = old_by_key.get(_list_key(node, item), MISSING)
            run_rules(node.items, item, old_elem, f"{path}[{i}]", errors)


def _run_node_rules(node: Node, value: Any, old: Any, path: str,
                    errors: list[FieldError], *, root: bool) -> None:
    self_value = _root_view(value) if root else value
    old_value = _root_view(old) if root and isinstance(old, dict) else old
    for rule in node.rules:
        if rule.transition and (old_value is MISSING or old_value is None):
            continue  # a transition rule needs an old value (none on create)
        error = _evaluate(rule, node, self_value, old_value, path)
        if error is not None:
            errors.append(error)


def _run_member_rules(node: Node, value: dict[str, Any], old: Any, path: str,
                      errors: list[FieldError], *, root: bool) -> None:
    for key, item in value.items():
        if root and key == "metadata":
            continue
        child = node.properties.get(key)
        child_path = member_path(path, key)
        if child is None and isinstance(node.additional, Node):
            child, child_path = node.additional, f"{path}[{key}]"
        if child is None:
            continue
        old_item = old.get(key, MISSING) if isinstance(old, dict) else MISSING
        run_rules(child, item, old_item, child_path, errors)


def _evaluate(rule: Rule, node: Node, value: Any, old: Any,
              path: str) -> FieldError | None:
    activation: dict[str, Any] = {"self": _to_cel(value, node)}
    if rule.transition:
        activation["oldSelf"] = _to_cel(old, node)
    field = (path + rule.field_path) if rule.field_path else (path or "<nil>")
    type_name = node.type or ("integer or string" if node.int_or_string else "object")
    try:
        result: object = rule.program.evaluate(activation)
    # cel-python raises CELEvalError, and occasionally a bare Python error, when a
    # rule cannot be evaluated; the API server rejects the object either way.
    except Exception as exc:
        return FieldError(field, reason=INVALID, message=(
            f'Invalid value: "{type_name}": {_cel_error_text(exc)} '
            f"evaluating rule: {rule.rule}"))
    if isinstance(result, CELEvalError):
        return FieldError(field, reason=INVALID, message=(
            f'Invalid value: "{type_name}": {_cel_error_text(result)} '
            f"evaluating rule: {rule.rule}"))
    if isinstance(result, celtypes.BoolType) and bool(result):
        return None
    detail = _message(rule, activation)
    if rule.reason == FORBIDDEN:
        return FieldError(field, reason=FORBIDDEN, message=f"Forbidden: {detail}")
    if rule.reason == REQUIRED:
        return FieldError(field, reason=REQUIRED, message=f"Required value: {detail}")
    if rule.reason == DUPLICATE:
        return FieldError(field, reason=DUPLICATE, message=(
            f'Duplicate value: "{type_name}": {detail}'))
    return FieldError(field, reason=INVALID, message=f'Invalid value: "{type_name}": {detail}')


def _message(rule: Rule, activation: dict[str, Any]) -> str:
    if rule.message_program is not None:
        try:
            text = rule.message_program.evaluate(activation)
        except Exception:  # a broken messageExpression falls back, as in Kubernetes
            text = None
        if isinstance(text, str) and text.strip():
            return str(text)
    if rule.message:
        return rule.message
    return f"failed rule: {rule.rule}"


def has_rules(node: Node) -> bool:
    children = [*node.properties.values(), node.items, node.additional]
    return bool(node.rules) or any(isinstance(c, Node) and has_rules(c) for c in children)


def _cel_error_text(exc: BaseException) -> str:
    text = str(exc.args[0]) if exc.args else str(exc)
    # Kubernetes' CEL wording, so messages match a real server's.
    return _NO_SUCH_MEMBER.sub(r"no such key: \1", text)


def _root_view(obj: Any) -> Any:
    """The root object as CEL sees it: metadata reduced to name and generateName."""
    if not isinstance(obj, dict):
        return obj
    view = dict(obj)
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        view["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return view


def _list_key(node: Node, item: Mapping[str, Any]) -> str:
    return json.dumps([item.get(k) for k in node.list_map_keys])


def _map_list_index(node: Node, old: Any) -> dict[str, Any] | None:
    """Old items of a list-type=map by key: the only lists whose items correlate."""
    if node.list_type != "map" or not isinstance(old, list):
        return None
    return {_list_key(node, item): item for item in old if isinstance(item, dict)}


def _to_cel(value: Any, node: Node | None) -> Any:
    """A JSON value as the CEL value Kubernetes gives a rule (typed by the schema)."""
    if value is None or node is None or (node.type is None and not node.int_or_string):
        return json_to_cel(value)
    if node.int_or_string:
        return celtypes.StringType(value) if isinstance(value, str) else celtypes.IntType(value)
    if node.type == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return celtypes.IntType(int(value))
    if node.type == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return celtypes.DoubleType(float(value))
    if node.type == "string" and isinstance(value, str) and node.format == "date-time":
        parsed = parse_date_time(value)
        if parsed is not None:
            return celtypes.TimestampType(parsed.astimezone(dt.UTC))
    if isinstance(value, dict):
        return celtypes.MapType(
            {celtypes.StringType(k): _to_cel(v, node.child(k)) for k, v in value.items()}
        )
    if isinstance(value, list):
        return celtypes.ListType([_to_cel(v, node.items) for v in value])
    return json_to_cel(value)
