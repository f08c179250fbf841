"""A CRD schema digested into `Node`s: keywords checked for shape, patterns and CEL
rules compiled once, so per-request work is only walking the value."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import celpy

from egressd.sandbox.schema.values import (
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    MISSING,
    REQUIRED,
    SchemaError,
    member_path,
)

_RULE_REASONS: Final = frozenset({INVALID, REQUIRED, FORBIDDEN, DUPLICATE})
_OLD_SELF = re.compile(r"\boldSelf\b")


@attrs.frozen
class Rule:
    """One compiled `x-kubernetes-validations` entry."""

    rule: str
    program: celpy.Runner
    message: str | None
    message_program: celpy.Runner | None
    reason: str
    field_path: str
    transition: bool


@attrs.frozen
class Node:
    """One schema node, pre-digested so per-request work is only walking the value."""

    type: str | None = None
    properties: Mapping[str, Node] = attrs.field(factory=dict)
    # additionalProperties: a schema, True (any value), or None (not allowed).
    additional: Node | bool | None = None
    items: Node | None = None
    required: tuple[str, ...] = ()
    enum: tuple[Any, ...] | None = None
    default: Any = MISSING
    nullable: bool = False
    preserve_unknown: bool = False
    int_or_string: bool = False
    embedded: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    multiple_of: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: re.Pattern[str] | None = None
    format: str | None = None
    min_items: int | None = None
    max_items: int | None = None
    min_properties: int | None = None
    max_properties: int | None = None
    list_type: str | None = None
    list_map_keys: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()

    def child(self, key: str) -> Node | None:
        """The schema of an object member, or None if the member is unknown."""
        if key in self.properties:
            return self.properties[key]
        if isinstance(self.additional, Node):
            return self.additional
        return None


def _compile(env: celpy.Environment, text: str, where: str) -> celpy.Runner:
    try:
        return env.program(env.compile(text))
    except Exception as exc:  # cel-python raises several unrelated types for bad source
        raise SchemaError(f"{where}: CEL rule {text!r} does not compile: {exc}") from exc


_TYPES: Final = frozenset({"object", "array", "string", "integer", "number", "boolean"})


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_string_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# Each keyword's shape, checked in this order; the first misfit names the keyword.
_SHAPES: Final[tuple[tuple[tuple[str, ...], Callable[[object], bool], str], ...]] = (
    (("type",), lambda v: isinstance(v, str) and v in _TYPES, "unsupported type {value!r}"),
    (("minimum", "maximum", "multipleOf"), _is_number, "{key} must be a number"),
    (("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"),
     _is_count, "{key} must be a non-negative integer"),
    (("format", "x-kubernetes-list-type", "description"), lambda v: isinstance(v, str),
     "{key} must be a string"),
    (("required", "x-kubernetes-list-map-keys"), _is_string_list,
     "{key} must be a list of strings"),
    (("enum",), lambda v: isinstance(v, list), "enum must be a list"),
    (("properties",), lambda v: isinstance(v, Mapping), "properties must be an object"),
    (("items",), lambda v: isinstance(v, Mapping), "items must be a schema"),
    (("additionalProperties",), lambda v: isinstance(v, Mapping | bool),
     "additionalProperties must be a schema or a boolean"),
    (("pattern",), lambda v: isinstance(v, str), "pattern must be a string"),
)


def _check_keywords(raw: object, where: str) -> Mapping[str, Any]:
    """`raw` as a schema node, or SchemaError naming the first keyword of the wrong shape.

    kube-apiserver refuses such a CRD; here it must not become a crash later,
    while an object is validated against it.
    """
    shown = where or "<root>"
    if not isinstance(raw, Mapping):
        raise SchemaError(f"{shown}: a schema must be an object")
    for keys, fits, message in _SHAPES:
        for key in keys:
            # `type: null` is no type, as an absent one.
            if key in raw and not (key == "type" and raw[key] is None) and not fits(raw[key]):
                raise SchemaError(f"{shown}: " + message.format(key=key, value=raw[key]))
    if "pattern" in raw:
        try:
            re.compile(raw["pattern"])
        except re.error as exc:
            raise SchemaError(f"{shown}: pattern {raw['pattern']!r} does not compile: "
                              f"{exc}") from None
    _check_rule_entries(raw.get("x-kubernetes-validations"), shown)
    return raw


def _check_rule_entries(rules: object, shown: str) -> None:
    if rules is None:
        return
    if not isinstance(rules, list):
        raise SchemaError(f"{shown}: x-kubernetes-validations must be a list")
    for entry in rules:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("rule"), str):
            raise SchemaError(f"{shown}: every x-kubernetes-validations entry needs a "
                              "string rule")
        for key in ("message", "messageExpression", "fieldPath", "reason"):
            if key in entry and not isinstance(entry[key], str):
                raise SchemaError(f"{shown}: x-kubernetes-validations {key} must be a string")


def build_node(raw: Mapping[str, Any], env: celpy.Environment, where: str) -> Node:
    raw = _check_keywords(raw, where)
    props = {k: build_node(v, env, member_path(where, k))
             for k, v in (raw.get("properties") or {}).items()}
    additional: Node | bool | None = None
    ap = raw.get("additionalProperties")
    if isinstance(ap, Mapping):
        additional = build_node(ap, env, f"{where}[*]")
    elif ap is True:
        additional = True
    items = raw.get("items")
    rules = []
    for entry in raw.get("x-kubernetes-validations") or ():
        text = entry["rule"]
        reason = entry.get("reason", INVALID)
        if reason not in _RULE_REASONS:
            raise SchemaError(f"{where}: unsupported rule reason {reason!r}")
        expr = entry.get("messageExpression")
        rules.append(
            Rule(
                rule=text,
                program=_compile(env, text, where),
                message=entry.get("message"),
                message_program=_compile(env, expr, where) if expr else None,
                reason=reason,
                field_path=entry.get("fieldPath", ""),
                transition=bool(_OLD_SELF.search(text)),
            )
        )
    pattern = raw.get("pattern")
    return Node(
        type=raw.get("type"),
        properties=props,
        additional=additional,
        items=build_node(items, env, f"{where}[*]") if isinstance(items, Mapping) else None,
        required=tuple(raw.get("required") or ()),
        enum=tuple(raw["enum"]) if "enum" in raw else None,
        default=copy.deepcopy(raw["default"]) if "default" in raw else MISSING,
        nullable=bool(raw.get("nullable")),
        preserve_unknown=bool(raw.get("x-kubernetes-preserve-unknown-fields")),
        int_or_string=bool(raw.get("x-kubernetes-int-or-string")),
        embedded=bool(raw.get("x-kubernetes-embedded-resource")),
        minimum=raw.get("minimum"),
        maximum=raw.get("maximum"),
        exclusive_minimum=bool(raw.get("exclusiveMinimum")),
        exclusive_maximum=bool(raw.get("exclusiveMaximum")),
        multiple_of=raw.get("multipleOf"),
        min_length=raw.get("minLength"),
        max_length=raw.get("maxLength"),
        pattern=re.compile(pattern) if pattern is not None else None,
        format=raw.get("format"),
        min_items=raw.get("minItems"),
        max_items=raw.get("maxItems"),
        min_properties=raw.get("minProperties"),
        max_properties=raw.get("maxProperties"),
        list_type=raw.get("x-kubernetes-list-type"),
        list_map_keys=tuple(raw.get("x-kubernetes-list-map-keys") or ()),
        rules=tuple(rules),
    )
