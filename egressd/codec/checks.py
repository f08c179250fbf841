"""Rules on a field beyond its type, written as `Annotated` metadata.

`zone: Annotated[str, matches(ZONE_RE, "a zone")]` is checked by the converter
after the type (the problem names the field's path) and becomes the field's
JSON Schema keywords (`pattern`) in the generated OpenAPI document, so a rule
is written once for both.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

import attrs


# eq=False: hashed by identity, as `Annotated` metadata must be hashable.
@attrs.frozen(eq=False)
class Check:
    """A rule on a structured value: `test` returns what is wrong, or None."""

    test: Callable[[Any], str | None]
    schema: Mapping[str, Any] = attrs.field(factory=dict)
    """The rule as JSON Schema keywords (empty when JSON Schema cannot say it)."""


@attrs.frozen
class Doc:
    """A field's description in the generated schema."""

    text: str


@attrs.frozen(eq=False)
class SchemaOnly:
    """JSON Schema keywords for a field that the converter need not check (a default)."""

    schema: Mapping[str, Any]


def matches(pattern: re.Pattern[str], what: str) -> Check:
    """The whole string matches `pattern` (anchor it with ^...$)."""

    def test(value: str) -> str | None:
        return None if pattern.match(value) else f"{value!r} is not {what}"

    return Check(test, {"pattern": pattern.pattern})


def _non_empty(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


NON_EMPTY = Check(_non_empty, {"pattern": r"\S"})
"""Not empty and not only white space."""


def one_of(values: Collection[str]) -> Check:
    """Exactly one of these strings (an enum that stays a plain `str`)."""
    allowed = ", ".join(repr(v) for v in values)

    def test(value: str) -> str | None:
        return None if value in values else f"expected one of {allowed}, got {value!r}"

    return Check(test, {"enum": list(values)})


def max_length(limit: int) -> Check:
    def test(value: str) -> str | None:
        return None if len(value) <= limit else f"longer than {limit} characters"

    return Check(test, {"maxLength": limit})


def not_one_of(values: Collection[str], why: str) -> Check:
    """Refuse these exact values (`why` says what they are instead)."""

    def test(value: str) -> str | None:
        return f"{value!r} is {why}" if value in values else None

    return Check(test, {"not": {"enum": sorted(values)}})


def at_least(low: float, *, exclusive: bool = False) -> Check:
    def test(value: float) -> str | None:
        if value > low or (value == low and not exclusive):
            return None
        return f"must be {'above' if exclusive else 'at least'} {low:g}"

    return Check(test, {"exclusiveMinimum" if exclusive else "minimum": low})


def min_items(count: int) -> Check:
    def test(value: Collection[Any]) -> str | None:
        return None if len(value) >= count else f"needs at least {count} item(s)"

    return Check(test, {"minItems": count})


def _cidr(value: str) -> str | None:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return f"{value!r} is not an IP address or CIDR"
    return None


CIDR = Check(_cidr)
"""An IP address or network (`10.0.0.0/8`, `::1`)."""
