"""A CRD's structural schema enforced the way kube-apiserver enforces it.

The fake API server uses `CRDSchema` for any custom resource it serves:
`prune` drops unknown fields (reporting their paths, which the server turns
into `unknown field` warnings), `apply_defaults` fills structural defaults,
and `validate` runs the OpenAPI checks and then every `x-kubernetes-validations`
CEL rule (cel-python), returning errors worded as the API server words its
`StatusCause`s, so clients (kubectl, egressd's kube layer) see what a real
cluster would say. A typical write is `validate(apply_defaults(prune(obj)[0]))`.

Fidelity notes (deliberate gaps, recorded in docs/decisions.md):
* `metadata` is left to the server (ObjectMeta rules), as in Kubernetes; the
  root CEL `self` sees only `metadata.name` and `metadata.generateName`.
* `format` checks cover `date-time` and `date`; other formats pass.
* `allOf`/`anyOf`/`oneOf`/`not` are not evaluated (none of our CRDs use them);
  validation ratcheting of unchanged invalid fields is not emulated.
* Patterns run through Python's `re`, which agrees with RE2 on ordinary patterns.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs
import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from egressd.errors import EgressdError

# Cause types (metav1.CauseType) the API server uses for field errors.
INVALID = "FieldValueInvalid"
REQUIRED = "FieldValueRequired"
NOT_SUPPORTED = "FieldValueNotSupported"
TOO_LONG = "FieldValueTooLong"
TOO_MANY = "FieldValueTooMany"
TYPE_INVALID = "FieldValueTypeInvalid"
FORBIDDEN = "FieldValueForbidden"
DUPLICATE = "FieldValueDuplicate"

# kube-apiserver skips CEL when the structural errors include one of these:
# rules written against the schema's types and bounds cannot run on such data.
_BLOCKING: Final = frozenset({NOT_SUPPORTED, REQUIRED, TOO_LONG, TOO_MANY, TYPE_INVALID})
_RULE_REASONS: Final = frozenset({INVALID, REQUIRED, FORBIDDEN, DUPLICATE})

_OLD_SELF = re.compile(r"\boldSelf\b")
_NO_SUCH_MEMBER = re.compile(r"no such member in mapping: '([^']*)'")
_DATE_TIME = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class _Missing:
    """Marks an absent value (distinct from JSON null)."""


_MISSING: Final = _Missing()


class SchemaError(EgressdError):
    """The CRD cannot be served: the version is not in it, a schema keyword has the wrong
    shape, a CEL rule does not compile, or a `default` fails its own schema or rules.

    A real API server rejects such a CRD at creation; the fake one fails to start.
    """


@attrs.frozen
class FieldError:
    """One rejected field, as a `StatusCause` of a 422 Invalid response."""

    field: str
    reason: str = attrs.field(kw_only=True)
    message: str = attrs.field(kw_only=True)

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"

    def to_cause(self) -> dict[str, str]:
        """The `details.causes[]` entry of a Status (JSON key `reason` is the cause type)."""
        return {"reason": self.reason, "message": self.message, "field": self.field}


# The cause a real server adds when structural errors stopped CEL evaluation.
RULES_NOT_CHECKED: Final = FieldError(
    "<nil>",
    reason=INVALID,
    message=(
        'Invalid value: "null": some validation rules were not checked because the object '
        "was invalid; correct the existing errors to complete validation"
    ),
)


def invalid_message(kind: str, name: str, errors: list[FieldError]) -> str:
    """The Status `message` of a 422, e.g. `Proxy.crawl.example.com "a" is invalid: [...]`.

    `kind` is the qualified kind (`Proxy.crawl.example.com`).
    """
    joined = ", ".join(str(e) for e in errors)
    body = joined if len(errors) == 1 else f"[{joined}]"
    return f'{kind} "{name}" is invalid: {body}'


def _go_value(value: object) -> str:
    """A value as Go's field errors print it (strings quoted, numbers bare)."""
    if value is None:
        return '"null"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) and not value.is_integer() else str(
            int(value)
        )
    return json.dumps(value, separators=(",", ":"))


def _go_map(value: Mapping[str, Any]) -> str:
    """A JSON object as Go's %#v prints a map[string]interface{} (keys sorted)."""
    def item(v: object) -> str:
        return "interface {}(nil)" if v is None else _go_value(v)

    body = ", ".join(f"{json.dumps(k)}:{item(value[k])}" for k in sorted(value))
    return f"map[string]interface {{}}{{{body}}}"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(expected: str, value: object) -> bool:
    if expected == "object":
        return isinstance(value, dict)
    if expected == "array":
        return isinstance(value, list)
    if expected == "string":
        return isinstance(value, str)
    if expected == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if expected == "integer":
        # JSON has one number type: 3.0 is an integer, as kube-openapi sees it.
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if expected == "number":
        return isinstance(value, int | float)
    return True


def _json_equal(a: object, b: object) -> bool:
    # Python's True == 1; JSON's true is not 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _parse_date_time(text: str) -> dt.datetime | None:
    if not _DATE_TIME.match(text):
        return None
    norm = re.sub(r"(\.\d{6})\d+", r"\1", text.replace("z", "Z").replace("t", "T"))
    try:
        return dt.datetime.fromisoformat(norm.replace(" ", "T"))
    except ValueError:
        return None


def _format_ok(fmt: str, value: str) -> bool:
    if fmt == "date-time":
        return _parse_date_time(value) is not None
    if fmt == "date":
        if not _DATE.match(value):
            return False
        try:
            dt.date.fromisoformat(value)
        except ValueError:
            return False
    return True


@attrs.frozen
class _Rule:
    """One compiled `x-kubernetes-validations` entry."""

    rule: str
    program: celpy.Runner
    message: str | None
    message_program: celpy.Runner | None
    reason: str
    field_path: str
    transition: bool


@attrs.frozen
class _Node:
    """One schema node, pre-digested so per-request work is only walking the value."""

    type: str | None = None
    properties: Mapping[str, _Node] = attrs.field(factory=dict)
    # additionalProperties: a schema, True (any value), or None (not allowed).
    additional: _Node | bool | None = None
    items: _Node | None = None
    required: tuple[str, ...] = ()
    enum: tuple[Any, ...] | None = None
    default: Any = _MISSING
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
    rules: tuple[_Rule, ...] = ()

    def child(self, key: str) -> _Node | None:
        """The schema of an object member, or None if the member is unknown."""
        if key in self.properties:
            return self.properties[key]
        if isinstance(self.additional, _Node):
            return self.additional
        return None


def _compile(env: celpy.Environment, text: str, where: str) -> celpy.Runner:
    try:
        return env.program(env.compile(text))
    except Exception as exc:  # cel-python raises several unrelated types for bad source
        raise SchemaError(f"{where}: CEL rule {text!r} does not compile: {exc}") from exc


_TYPES: Final = frozenset({"object", "array", "string", "integer", "number", "boolean"})
_NUMBER_KEYWORDS: Final = ("minimum", "maximum", "multipleOf")
_COUNT_KEYWORDS: Final = ("minLength", "maxLength", "minItems", "maxItems", "minProperties",
                          "maxProperties")
_STRING_KEYWORDS: Final = ("format", "x-kubernetes-list-type", "description")
_STRING_LIST_KEYWORDS: Final = ("required", "x-kubernetes-list-map-keys")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_keywords(raw: object, where: str) -> Mapping[str, Any]:
    """`raw` as a schema node, or SchemaError naming the first keyword of the wrong shape.

    kube-apiserver refuses such a CRD; here it must not become a crash later,
    while an object is validated against it.
    """
    shown = where or "<root>"
    if not isinstance(raw, Mapping):
        raise SchemaError(f"{shown}: a schema must be an object")
    kind = raw.get("type")
    if kind is not None and (not isinstance(kind, str) or kind not in _TYPES):
        raise SchemaError(f"{shown}: unsupported type {kind!r}")
    for key in _NUMBER_KEYWORDS:
        if key in raw and not _is_number(raw[key]):
            raise SchemaError(f"{shown}: {key} must be a number")
    for key in _COUNT_KEYWORDS:
        value = raw.get(key)
        if key in raw and not (isinstance(value, int) and not isinstance(value, bool)
                               and value >= 0):
            raise SchemaError(f"{shown}: {key} must be a non-negative integer")
    for key in _STRING_KEYWORDS:
        if key in raw and not isinstance(raw[key], str):
            raise SchemaError(f"{shown}: {key} must be a string")
    for key in _STRING_LIST_KEYWORDS:
        value = raw.get(key)
        if key in raw and not (isinstance(value, list)
                               and all(isinstance(v, str) for v in value)):
            raise SchemaError(f"{shown}: {key} must be a list of strings")
    if "enum" in raw and not isinstance(raw["enum"], list):
        raise SchemaError(f"{shown}: enum must be a list")
    if "properties" in raw and not isinstance(raw["properties"], Mapping):
        raise SchemaError(f"{shown}: properties must be an object")
    if "items" in raw and not isinstance(raw["items"], Mapping):
        raise SchemaError(f"{shown}: items must be a schema")
    if "additionalProperties" in raw and not isinstance(raw["additionalProperties"],
                                                        Mapping | bool):
        raise SchemaError(f"{shown}: additionalProperties must be a schema or a boolean")
    if "pattern" in raw:
        if not isinstance(raw["pattern"], str):
            raise SchemaError(f"{shown}: pattern must be a string")
        try:
            re.compile(raw["pattern"])
        except re.error as exc:
            raise SchemaError(f"{shown}: pattern {raw['pattern']!r} does not compile: "
                              f"{exc}") from None
    rules = raw.get("x-kubernetes-validations")
    if rules is not None:
        if not isinstance(rules, list):
            raise SchemaError(f"{shown}: x-kubernetes-validations must be a list")
        for entry in rules:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("rule"), str):
                raise SchemaError(f"{shown}: every x-kubernetes-validations entry needs a "
                                  "string rule")
            for key in ("message", "messageExpression", "fieldPath", "reason"):
                if key in entry and not isinstance(entry[key], str):
                    raise SchemaError(f"{shown}: x-kubernetes-validations {key} must be a "
                                      "string")
    return raw


def _build(raw: Mapping[str, Any], env: celpy.Environment, where: str) -> _Node:
    raw = _check_keywords(raw, where)
    props = {
        k: _build(v, env, _child(where, k)) for k, v in (raw.get("properties") or {}).items()
    }
    additional: _Node | bool | None = None
    ap = raw.get("additionalProperties")
    if isinstance(ap, Mapping):
        additional = _build(ap, env, f"{where}[*]")
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
            _Rule(
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
    return _Node(
        type=raw.get("type"),
        properties=props,
        additional=additional,
        items=_build(items, env, f"{where}[*]") if isinstance(items, Mapping) else None,
        required=tuple(raw.get("required") or ()),
        enum=tuple(raw["enum"]) if "enum" in raw else None,
        default=copy.deepcopy(raw["default"]) if "default" in raw else _MISSING,
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


# Root members the API server owns; the schema never prunes or defaults them.
_ROOT_KEEP: Final = ("apiVersion", "kind", "metadata")


class CRDSchema:
    """The structural schema of one version of a CRD, with its CEL rules compiled once."""

    def __init__(self, root: _Node, *, printer_columns: list[dict[str, Any]],
                 status_subresource: bool) -> None:
        self._root = root
        self._printer_columns = printer_columns
        self.status_subresource = status_subresource
        # kube-apiserver builds no CEL validator for a schema without rules, and only
        # that validator adds the "rules were not checked" cause.
        self._has_rules = _has_rules(root)

    @classmethod
    def from_crd(cls, crd: Mapping[str, Any], version: str) -> CRDSchema:
        """Digest `crd` (an apiextensions.k8s.io/v1 CRD as a dict) for `version`.

        Raises `SchemaError` if the version is absent, a schema keyword has the wrong
        shape, a rule does not compile or a default fails its schema or rules.
        """
        spec = crd.get("spec") or {}
        for ver in spec.get("versions") or ():
            if ver.get("name") == version:
                break
        else:
            raise SchemaError(f"CRD {crd.get('metadata', {}).get('name')!r} has no version "
                              f"{version!r}")
        schema = ver.get("schema") or {}
        if not isinstance(schema, Mapping):
            raise SchemaError(f"version {version!r}: schema must be an object")
        raw = schema.get("openAPIV3Schema") or {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
        env = celpy.Environment()
        built = cls(
            _build(raw, env, ""),
            printer_columns=copy.deepcopy(list(ver.get("additionalPrinterColumns") or ())),
            status_subresource="status" in (ver.get("subresources") or {}),
        )
        index = next(i for i, v in enumerate(spec["versions"]) if v is ver)
        built._check_defaults(built._root, f"spec.versions[{index}].schema.openAPIV3Schema")
        return built

    def _check_defaults(self, node: _Node, where: str) -> None:
        """Refuse a `default` kube-apiserver refuses when the CRD is created.

        As its `ValidateDefaults`: each default, exactly as written (children's
        defaults are not applied to it first), must hold no field pruning would
        drop, pass the node's schema, then the node's CEL rules (with oldSelf = the
        default). additionalProperties is not followed, as there.
        """
        if node.default is not _MISSING:
            path = f"{where}.default"
            pruned = copy.deepcopy(node.default)
            dropped: list[str] = []
            self._prune(node, pruned, path, dropped)
            errors = [FieldError(path, reason=INVALID, message=(
                f"Invalid value: {_go_value(node.default)}: must not have unknown fields "
                f"({', '.join(dropped)})"))] if dropped else []
            self._check(node, node.default, path, errors)
            if not errors:
                self._run_rules(node, node.default, node.default, path, errors)
            if errors:
                raise SchemaError("; ".join(str(e) for e in errors))
        if node.items is not None:
            self._check_defaults(node.items, f"{where}.items")
        for key, child in node.properties.items():
            self._check_defaults(child, f"{where}.properties[{key}]")

    @property
    def printer_columns(self) -> list[dict[str, Any]]:
        """The version's `additionalPrinterColumns` (a copy), for Table rendering."""
        return copy.deepcopy(self._printer_columns)

    # -- pruning -------------------------------------------------------------------

    def prune(self, obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """A copy of `obj` without the fields the schema does not know, and their paths.

        Honours `x-kubernetes-preserve-unknown-fields`, `additionalProperties` and
        embedded resources; `apiVersion`, `kind` and `metadata` at the root are kept.
        """
        out = copy.deepcopy(dict(obj))
        dropped: list[str] = []
        self._prune(self._root, out, "", dropped, root=True)
        return out, dropped

    def _prune(self, node: _Node | None, value: Any, path: str, dropped: list[str], *,
               root: bool = False) -> None:
        if node is None:
            return
        if isinstance(value, dict):
            keep = _ROOT_KEEP if (root or node.embedded) else ()
            for key in list(value):
                if key in keep:
                    continue
                child = node.child(key)
                child_path = (
                    _child(path, key) if key in node.properties or node.additional is None
                    else f"{path}[{key}]"
                )
                if child is None and node.additional is None and not node.preserve_unknown:
                    dropped.append(child_path)
                    del value[key]
                else:
                    self._prune(child, value[key], child_path, dropped)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                self._prune(node.items, item, f"{path}[{i}]", dropped)

    # -- defaulting ------------------------------------------------------------------

    def apply_defaults(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of `obj` with every structural default applied, for spec and status alike.

        As in Kubernetes: a missing field (or a null one on a non-nullable field)
        gets its default, then the defaults below it (so `default: {}` fills its
        children's defaults); a null on a non-nullable field without a default is dropped.
        """
        out = copy.deepcopy(dict(obj))
        self._default(self._root, out, root=True)
        return out

    def _default(self, node: _Node | None, value: Any, *, root: bool = False) -> None:
        if node is None:
            return
        if isinstance(value, dict):
            for key, prop in node.properties.items():
                if root and key in _ROOT_KEEP:
                    continue
                present = key in value
                if present and value[key] is None and not prop.nullable:
                    if prop.default is _MISSING:
                        del value[key]
                        continue
                    present = False
                if not present and prop.default is not _MISSING:
                    value[key] = copy.deepcopy(prop.default)
            for key, item in value.items():
                if root and key in _ROOT_KEEP:
                    continue
                self._default(node.child(key), item)
        elif isinstance(value, list):
            for item in value:
                self._default(node.items, item)

    # -- validation ------------------------------------------------------------------

    def validate(self, obj: Mapping[str, Any], old: Mapping[str, Any] | None = None,
                 ) -> list[FieldError]:
        """Every structural error of `obj`, then (if none blocks them) every failed CEL rule.

        `old` is the stored object on update: transition rules (those naming
        `oldSelf`) run only where an old value exists, so they are skipped on create.
        A rule that fails to evaluate (a missing field read without `has()`) rejects.
        """
        errors: list[FieldError] = []
        self._check(self._root, obj, "", errors, root=True)
        if any(e.reason in _BLOCKING for e in errors):
            if self._has_rules:
                errors.append(RULES_NOT_CHECKED)
            return errors
        self._run_rules(self._root, obj, _MISSING if old is None else old, "", errors, root=True)
        return errors

    def _check(self, node: _Node, value: Any, path: str, errors: list[FieldError], *,
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
            if not (isinstance(value, str) or _type_ok("integer", value)):
                errors.append(FieldError(shown, reason=TYPE_INVALID, message=(
                    f'Invalid value: "{_json_type(value)}": {shown} in body must be of type '
                    f'integer,string: "{_json_type(value)}"')))
                return
        elif node.type is not None and not _type_ok(node.type, value):
            actual = _json_type(value)
            errors.append(FieldError(shown, reason=TYPE_INVALID, message=(
                f'Invalid value: "{actual}": {shown} in body must be of type {node.type}: '
                f'"{actual}"')))
            return

        if node.enum is not None and not any(_json_equal(value, e) for e in node.enum):
            supported = ", ".join(_go_value(e) for e in node.enum)
            errors.append(FieldError(shown, reason=NOT_SUPPORTED, message=(
                f"Unsupported value: {_go_value(value)}: supported values: {supported}")))

        if isinstance(value, int | float) and not isinstance(value, bool):
            self._check_number(node, value, shown, errors)
        elif isinstance(value, str):
            self._check_string(node, value, shown, errors)
        elif isinstance(value, list):
            self._check_array(node, value, path, errors)
        elif isinstance(value, dict):
            self._check_object(node, value, path, errors, root=root)

    def _check_number(self, node: _Node, value: float, shown: str,
                      errors: list[FieldError]) -> None:
        def invalid(detail: str) -> None:
            errors.append(FieldError(shown, reason=INVALID, message=(
                f"Invalid value: {_go_value(value)}: {shown} in body {detail}")))

        if node.minimum is not None:
            if node.exclusive_minimum and value <= node.minimum:
                invalid(f"should be greater than {_go_value(node.minimum)}")
            elif value < node.minimum:
                invalid(f"should be greater than or equal to {_go_value(node.minimum)}")
        if node.maximum is not None:
            if node.exclusive_maximum and value >= node.maximum:
                invalid(f"should be less than {_go_value(node.maximum)}")
            elif value > node.maximum:
                invalid(f"should be less than or equal to {_go_value(node.maximum)}")
        if node.multiple_of and not math.isclose(
            value / node.multiple_of, round(value / node.multiple_of)
        ):
            invalid(f"should be a multiple of {_go_value(node.multiple_of)}")

    def _check_string(self, node: _Node, value: str, shown: str,
                      errors: list[FieldError]) -> None:
        if node.max_length is not None and len(value) > node.max_length:
            unit = "byte" if node.max_length == 1 else "bytes"
            errors.append(FieldError(shown, reason=TOO_LONG, message=(
                f"Too long: may not be more than {node.max_length} {unit}")))
        if node.min_length is not None and len(value) < node.min_length:
            errors.append(FieldError(shown, reason=INVALID, message=(
                f"Invalid value: {_go_value(value)}: {shown} in body should be at least "
                f"{node.min_length} chars long")))
        if node.pattern is not None and not node.pattern.search(value):
            errors.append(FieldError(shown, reason=INVALID, message=(
                f"Invalid value: {_go_value(value)}: {shown} in body should match "
                f"'{node.pattern.pattern}'")))
        if node.format is not None and not _format_ok(node.format, value):
            errors.append(FieldError(shown, reason=TYPE_INVALID, message=(
                f"Invalid value: {_go_value(value)}: {shown} in body must be of type "
                f"{node.format}: {_go_value(value)}")))

    def _check_array(self, node: _Node, value: list[Any], path: str,
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
                self._check(node.items, item, f"{path}[{i}]", errors)
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
                if not any(_json_equal(ident, s) for s in seen):
                    seen.append(ident)
                elif not any(_json_equal(ident, r) for r in reported):
                    reported.append(ident)
                    shown_value = (_go_map(ident) if node.list_type == "map"
                                   else _go_value(ident))
                    errors.append(FieldError(f"{path}[{i}]", reason=DUPLICATE, message=(
                        f"Duplicate value: {shown_value}")))

    def _check_object(self, node: _Node, value: dict[str, Any], path: str,
                      errors: list[FieldError], *, root: bool) -> None:
        shown = path or "<nil>"
        for key in node.required:
            if key not in value:
                errors.append(FieldError(_child(path, key), reason=REQUIRED,
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
                self._check(node.properties[key], item, _child(path, key), errors)
            elif isinstance(node.additional, _Node):
                self._check(node.additional, item, f"{path}[{key}]", errors)

    # -- CEL ---------------------------------------------------------------------------

    def _run_rules(self, node: _Node, value: Any, old: Any, path: str,
                   errors: list[FieldError], *, root: bool = False) -> None:
        if value is None:
            return
        if node.rules:
            self_value = _root_view(value) if root else value
            old_value = _root_view(old) if root and isinstance(old, dict) else old
            for rule in node.rules:
                if rule.transition and (old_value is _MISSING or old_value is None):
                    continue
                error = self._evaluate(rule, node, self_value, old_value, path)
                if error is not None:
                    errors.append(error)
        if isinstance(value, dict):
            for key, item in value.items():
                if root and key == "metadata":
                    continue
                child = node.properties.get(key)
                child_path = _child(path, key)
                if child is None and isinstance(node.additional, _Node):
                    child, child_path = node.additional, f"{path}[{key}]"
                if child is None:
                    continue
                old_item = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
                self._run_rules(child, item, old_item, child_path, errors)
        elif isinstance(value, list) and node.items is not None:
            old_by_key = _map_list_index(node, old)
            for i, item in enumerate(value):
                old_elem: Any = _MISSING
                if old_by_key is not None and isinstance(item, dict):
                    old_elem = old_by_key.get(_list_key(node, item), _MISSING)
                self._run_rules(node.items, item, old_elem, f"{path}[{i}]", errors)

    def _evaluate(self, rule: _Rule, node: _Node, value: Any, old: Any,
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
        detail = self._message(rule, activation)
        if rule.reason == FORBIDDEN:
            return FieldError(field, reason=FORBIDDEN, message=f"Forbidden: {detail}")
        if rule.reason == REQUIRED:
            return FieldError(field, reason=REQUIRED, message=f"Required value: {detail}")
        if rule.reason == DUPLICATE:
            return FieldError(field, reason=DUPLICATE, message=(
                f'Duplicate value: "{type_name}": {detail}'))
        return FieldError(field, reason=INVALID, message=f'Invalid value: "{type_name}": {detail}')

    @staticmethod
    def _message(rule: _Rule, activation: dict[str, Any]) -> str:
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


def _has_rules(node: _Node) -> bool:
    children = [*node.properties.values(), node.items, node.additional]
    return bool(node.rules) or any(isinstance(c, _Node) and _has_rules(c) for c in children)


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


def _list_key(node: _Node, item: Mapping[str, Any]) -> str:
    return json.dumps([item.get(k) for k in node.list_map_keys])


def _map_list_index(node: _Node, old: Any) -> dict[str, Any] | None:
    """Old items of a list-type=map by key: the only lists whose items correlate."""
    if node.list_type != "map" or not isinstance(old, list):
        return None
    return {_list_key(node, item): item for item in old if isinstance(item, dict)}


def _to_cel(value: Any, node: _Node | None) -> Any:
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
        parsed = _parse_date_time(value)
        if parsed is not None:
            return celtypes.TimestampType(parsed.astimezone(dt.UTC))
    if isinstance(value, dict):
        return celtypes.MapType(
            {celtypes.StringType(k): _to_cel(v, node.child(k)) for k, v in value.items()}
        )
    if isinstance(value, list):
        return celtypes.ListType([_to_cel(v, node.items) for v in value])
    return json_to_cel(value)
