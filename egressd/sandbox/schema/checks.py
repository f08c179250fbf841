"""Structural validation: types, enums, bounds, lengths, patterns, formats, list
types and required members, worded as kube-apiserver words its field errors."""

from __future__ import annotations

import math
from typing import Any

from egressd.sandbox.schema.nodes import Node
from egressd.sandbox.schema.values import (
    DUPLICATE,
    INVALID,
    NOT_SUPPORTED,
    REQUIRED,
    TOO_LONG,
    TOO_MANY,
    TYPE_INVALID,
    FieldError,
    format_ok,
    go_map,
    go_value,
    json_equal,
    json_type,
    member_path,
    type_ok,
)


def check(node: Node, value: Any, path: str, errors: list[FieldError], *,
          root: bool = False) -> None:
    shown = path or "<nil>"
    if value is None:
        if node.nullable or (node.type is None and not node.int_or_string):
            return
        expected = "integer or string" if node.int_or_string else node.type
        errors.append(FieldError(shown, reason=TYPE_INVALID, message=(
            f'Invalid value: "null": {shown} in body must be of type {expected}: "null"')))
        return
    if node.int_or_string:
        if not (isinstance(value, str) or type_ok("integer", value)):
            errors.append(FieldError(shown, reason=TYPE_INVALID, message=(
                f'Invalid value: "{json_type(value)}": {shown} in body must be of type '
                f'integer,string: "{json_type(value)}"')))
            return
    elif node.type is not None and not type_ok(node.type, value):
        actual = json_type(value)
        errors.append(FieldError(shown, reason=TYPE_INVALID, message=(
            f'Invalid value: "{actual}": {shown} in body must be of type {node.type}: '
            f'"{actual}"')))
        return

    if node.enum is not None and not any(json_equal(value, e) for e in node.enum):
        supported = ", ".join(go_value(e) for e in node.enum)
        errors.append(FieldError(shown, reason=NOT_SUPPORTED, message=(
            f"Unsupported value: {go_value(value)}: supported values: {supported}")))

    if isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(node, value, shown, errors)
    elif isinstance(value, str):
        _check_string(node, value, shown, errors)
    elif isinstance(value, list):
        _check_array(node, value, path, errors)
    elif isinstance(value, dict):
        _check_object(node, value, path, errors, root=root)


def _check_number(node: Node, value: float, shown: str,
                  errors: list[FieldError]) -> None:
    def invalid(detail: str) -> None:
        errors.append(FieldError(shown, reason=INVALID, message=(
            f"Invalid value: {go_value(value)}: {shown} in body {detail}")))

    if node.minimum is not None:
        if node.exclusive_minimum and value <= node.minimum:
            invalid(f"should be greater than {go_value(node.minimum)}")
        elif value < node.minimum:
            invalid(f"should be greater than or equal to {go_value(node.minimum)}")
    if node.maximum is not None:
        if node.exclusive_maximum and value >= node.maximum:
            invalid(f"should be less than {go_value(node.maximum)}")
        elif value > node.maximum:
            invalid(f"should be less than or equal to {go_value(node.maximum)}")
    if node.multiple_of and not math.isclose(
        value / node.multiple_of, round(value / node.multiple_of)
    ):
        invalid(f"should be a multiple of {go_value(node.multiple_of)}")


def _check_string(node: Node, value: str, shown: str,
                  errors: list[FieldError]) -> None:
    if node.max_length is not None and len(value) > node.max_length:
        unit = "byte" if node.max_length == 1 else "bytes"
        errors.append(FieldError(shown, reason=TOO_LONG, message=(
            f"Too long: may not be more than {node.max_length} {unit}")))
    if node.min_length is not None and len(value) < node.min_length:
        errors.append(FieldError(shown, reason=INVALID, message=(
            f"Invalid value: {go_value(value)}: {shown} in body should be at least "
            f"{node.min_length} chars long")))
    if node.pattern is not None and not node.pattern.search(value):
        errors.append(FieldError(shown, reason=INVALID, message=(
            f"Invalid value: {go_value(value)}: {shown} in body should match "
            f"'{node.pattern.pattern}'")))
    if node.format is not None and not format_ok(node.format, value):
        errors.append(FieldError(shown, reason=TYPE_INVALID, message=(
            f"Invalid value: {go_value(value)}: {shown} in body must be of type "
            f"{node.format}: {go_value(value)}")))


def _check_array(node: Node, value: list[Any], path: str,
                 errors: list[FieldError]) -> None:
    shown = path or "<nil>"
    if node.max_items is not None and len(value) > node.max_items:
        errors.append(FieldError(shown, reason=TOO_MANY, message=(
            f"Too many: {len(value)}: must have at most {node.max_items} items")))
    if node.min_items is not None and len(value) < node.min_items:
        errors.append(FieldError(shown, reason=INVALID, message=(
            f"Invalid value: {len(value)}: {shown} in body should have at least "
            f"{node.min_items} items")))
    if node.items is not None:
        for i, item in enumerate(value):
            check(node.items, item, f"{path}[{i}]", errors)
    if node.list_type in ("set", "map"):
        # As kube-apiserver's list-type check: one error per duplicated key, at its
        # first repeat; a map key is shown as Go prints a map (%#v), missing keys left out.
        seen: list[Any] = []
        reported: list[Any] = []
        for i, item in enumerate(value):
            ident: Any = item
            if node.list_type == "map":
                if not isinstance(item, dict):
                    continue
                ident = {k: item[k] for k in node.list_map_keys if k in item}
            if not any(json_equal(ident, s) for s in seen):
                seen.append(ident)
            elif not any(json_equal(ident, r) for r in reported):
                reported.append(ident)
                shown_value = (go_map(ident) if node.list_type == "map"
                               else go_value(ident))
                errors.append(FieldError(f"{path}[{i}]", reason=DUPLICATE, message=(
                    f"Duplicate value: {shown_value}")))


def _check_object(node: Node, value: dict[str, Any], path: str,
                  errors: list[FieldError], *, root: bool) -> None:
    shown = path or "<nil>"
    for key in node.required:
        if key not in value:
            errors.append(FieldError(member_path(path, key), reason=REQUIRED,
                                     message="Required value"))
    if node.max_properties is not None and len(value) > node.max_properties:
        errors.append(FieldError(shown, reason=TOO_MANY, message=(
            f"Too many: {len(value)}: must have at most {node.max_properties} items")))
    if node.min_properties is not None and len(value) < node.min_properties:
        errors.append(FieldError(shown, reason=INVALID, message=(
            f"Invalid value: {len(value)}: {shown} in body should have at least "
            f"{node.min_properties} properties")))
    for key, item in value.items():
        if root and key == "metadata":
            continue
        if key in node.properties:
            check(node.properties[key], item, member_path(path, key), errors)
        elif isinstance(node.additional, Node):
            check(node.additional, item, f"{path}[{key}]", errors)

