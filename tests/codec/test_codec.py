"""The converter factory: strict scalars, extra keys, nulls, paths, and the schema it implies."""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections.abc import Mapping
from typing import Annotated, Any

import attrs
import pytest

from egressd.codec import (
    NON_EMPTY,
    TYPE_WORDS,
    Codec,
    Doc,
    WireError,
    at_least,
    matches,
    max_length,
    schema_of,
)


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


@attrs.frozen(kw_only=True)
class Inner:
    """An inner value."""

    count: int
    ratio: float | None = None


@attrs.frozen(kw_only=True)
class Outer:
    """An outer value."""

    name: Annotated[str, matches(re.compile(r"^[a-z]+$"), "lower-case letters"),
                    Doc("the name")]
    tags: tuple[Annotated[str, max_length(3)], ...] = ()
    labels: Mapping[str, str] = attrs.field(factory=dict)
    color: Color = Color.RED
    inner: Inner | None = None
    when: dt.datetime | None = None
    probe_url: str = "x"
    limit: Annotated[float, at_least(0)] = 1.0


STRICT = Codec(forbid_extra_keys=True, renames={"probe_url": "probeURL"})
LENIENT = Codec()
CONFIG = Codec(words=TYPE_WORDS, forbid_extra_keys=True, null_is_absent=False)


def problems(codec: Codec, raw: Any, cls: type = Outer) -> list[str]:
    with pytest.raises(WireError) as info:
        codec.structure(raw, cls, path="x")
    return [str(p) for p in info.value.problems]


def test_round_trip_with_wire_names() -> None:
    raw = {"name": "ab", "tags": ["a"], "labels": {"k": "v"}, "color": "blue",
           "inner": {"count": 2, "ratio": 0.5}, "when": "2024-05-01T10:00:00Z",
           "probeURL": "u", "limit": 2}
    value = STRICT.structure(raw, Outer)
    assert value == Outer(name="ab", tags=("a",), labels={"k": "v"}, color=Color.BLUE,
                          inner=Inner(count=2, ratio=0.5),
                          when=dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC), probe_url="u",
                          limit=2.0)
    assert STRICT.unstructure(value) == {**raw, "limit": 2.0}


@pytest.mark.parametrize(("raw", "expected"), [
    ({"name": "ab", "tags": "abc"}, ["x.tags: expected a list, got 'abc'"]),
    ({"name": "ab", "inner": {"count": True}}, ["x.inner.count: expected int, got True"]),
    ({"name": "ab", "inner": {"count": "1"}}, ["x.inner.count: expected int, got '1'"]),
    ({"name": "ab", "inner": {"count": None}}, ["x.inner.count: expected int, got null"]),
    ({"name": None}, ["x.name: expected string, got null"]),
    ({"name": "ab", "limit": True}, ["x.limit: expected number, got True"]),
    ({"name": "ab", "limit": float("nan")}, ["x.limit: must be finite"]),
    ({"name": "ab", "limit": -1}, ["x.limit: must be at least 0"]),
    ({"name": "ab", "labels": ["k"]}, ["x.labels: expected an object, got a list"]),
    ({"name": "ab", "labels": {"k": 1}}, ["x.labels[k]: expected string, got 1"]),
    ({"name": "AB", "tags": ["abcd", 5]},
     ["x.name: 'AB' is not lower-case letters", "x.tags[0]: longer than 3 characters",
      "x.tags[1]: expected string, got 5"]),
    ({"name": "ab", "color": "green"}, ["x.color: expected one of 'red', 'blue', got 'green'"]),
    ({"name": "ab", "when": "yesterday"},
     ["x.when: expected an RFC 3339 timestamp, got 'yesterday'"]),
    ({"nmae": "ab", "inner": {"count": 1, "extra": 2}},
     ["x.nmae: unknown field", "x.name: required field missing",
      "x.inner.extra: unknown field"]),
    ([], ["x: expected an object, got a list"]),
])
def test_strict_scalars_extra_keys_and_paths(raw: Any, expected: list[str]) -> None:
    assert problems(STRICT, raw) == expected


def test_extra_keys_are_ignored_where_the_codec_allows_them() -> None:
    assert LENIENT.structure({"name": "ab", "apiVersion": "v9"}, Outer) == Outer(name="ab")


def test_null_is_absent_or_a_mistake() -> None:
    assert STRICT.structure({"name": "ab", "inner": None}, Outer).inner is None
    assert problems(CONFIG, {"name": "ab", "inner": None}) == [
        "x.inner: expected a mapping, got null"]
    assert problems(CONFIG, {"name": "ab", "tags": "a"}) == [
        "x.tags: expected a list of strings, got string"]


def test_non_empty_refuses_blank() -> None:
    @attrs.frozen
    class Named:
        name: Annotated[str, NON_EMPTY]

    assert problems(STRICT, {"name": "  "}, Named) == ["x.name: must not be empty"]


def test_schema_says_what_the_codec_does() -> None:
    components: dict[str, Any] = {}
    assert schema_of(STRICT, Outer, components, writing=False) == {
        "$ref": "#/components/schemas/Outer"}
    outer = components["Outer"]
    assert outer["required"] == ["name"]
    assert outer["additionalProperties"] is False
    props = outer["properties"]
    assert props["name"] == {"type": "string", "pattern": "^[a-z]+$", "description": "the name"}
    assert props["tags"] == {"type": "array", "items": {"type": "string", "maxLength": 3}}
    assert props["color"] == {"type": "string", "enum": ["red", "blue"], "default": "red"}
    assert props["inner"] == {"anyOf": [{"$ref": "#/components/schemas/Inner"},
                                         {"type": "null"}]}
    assert props["when"] == {"type": ["string", "null"], "format": "date-time"}
    assert "probeURL" in props
    assert props["limit"] == {"type": "number", "minimum": 0, "default": 1.0}
    assert components["Inner"]["properties"]["ratio"] == {"type": ["number", "null"]}
    # Written by a codec that writes None as null: every field is always there.
    written: dict[str, Any] = {}
    schema_of(Codec(omit_none=False), Inner, written, writing=True)
    assert written["Inner"]["required"] == ["count", "ratio"]
    # A config codec refuses null, so its schema does not offer it.
    config: dict[str, Any] = {}
    schema_of(CONFIG, Inner, config, writing=False)
    assert config["Inner"]["properties"]["ratio"] == {"type": "number"}
