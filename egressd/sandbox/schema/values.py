"""Values shared by the schema modules: cause types, `FieldError`, `SchemaError`, and
JSON type and format checks, with values printed as Go's field errors print them."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

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
BLOCKING: Final = frozenset({NOT_SUPPORTED, REQUIRED, TOO_LONG, TOO_MANY, TYPE_INVALID})

_DATE_TIME = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class Missing:
    """Marks an absent value (distinct from JSON null)."""


MISSING: Final = Missing()


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


def go_value(value: object) -> str:
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


def go_map(value: Mapping[str, Any]) -> str:
    """A JSON object as Go's %#v prints a map[string]interface{} (keys sorted)."""
    def item(v: object) -> str:
        return "interface {}(nil)" if v is None else go_value(v)

    body = ", ".join(f"{json.dumps(k)}:{item(value[k])}" for k in sorted(value))
    return f"map[string]interface {{}}{{{body}}}"


def json_type(value: object) -> str:
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


def type_ok(expected: str, value: object) -> bool:
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


def json_equal(a: object, b: object) -> bool:
    # Python's True == 1; JSON's true is not 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def member_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def parse_date_time(text: str) -> dt.datetime | None:
    if not _DATE_TIME.match(text):
        return None
    norm = re.sub(r"(\.\d{6})\d+", r"\1", text.replace("z", "Z").replace("t", "T"))
    try:
        return dt.datetime.fromisoformat(norm.replace(" ", "T"))
    except ValueError:
        return None


def format_ok(fmt: str, value: str) -> bool:
    if fmt == "date-time":
        return parse_date_time(value) is not None
    if fmt == "date":
        if not _DATE.match(value):
            return False
        try:
            dt.date.fromisoformat(value)
        except ValueError:
            return False
    return True

