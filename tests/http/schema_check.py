"""A small validator for the JSON Schema subset `egressd/http/openapi.py` uses.

The tests validate real responses against the served document with it, so the
document cannot drift from what the API sends. (jsonschema is not a declared
dependency; this subset is all the document uses, and unknown keywords fail loudly.)
"""

from __future__ import annotations

import re
from typing import Any

_KNOWN = {"type", "properties", "required", "additionalProperties", "items", "enum", "$ref",
          "description", "format", "maxLength", "minimum", "maximum", "exclusiveMinimum",
          "default", "pattern", "not", "minItems"}
_DATE_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _type_ok(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    raise AssertionError(f"unknown type {name}")


def validate(value: Any, schema: dict[str, Any], doc: dict[str, Any], path: str = "$") -> None:  # noqa: C901 -- its owner splits it (issue 10)
    """Raise AssertionError naming the first place `value` breaks `schema`."""
    unknown = set(schema) - _KNOWN
    assert not unknown, f"schema keywords this checker does not know: {unknown}"
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        target: Any = doc
        for part in ref[2:].split("/"):
            target = target[part]
        validate(value, target, doc, path)
        return
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        assert any(_type_ok(value, t) for t in types), f"{path}: {value!r} is not {types}"
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    if "not" in schema:
        try:
            validate(value, schema["not"], doc, path)
        except AssertionError:
            pass
        else:
            raise AssertionError(f"{path}: {value!r} matches {schema['not']}, which it must not")
    if isinstance(value, str):
        assert len(value) <= schema.get("maxLength", len(value)), f"{path}: too long"
        assert re.search(schema.get("pattern", ""), value), f"{path}: {value!r} no match"
    if schema.get("format") == "date-time" and isinstance(value, str):
        assert _DATE_TIME.match(value), f"{path}: {value!r} is not RFC 3339"
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            assert name in value, f"{path}: missing {name}"
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in props:
                validate(item, props[name], doc, f"{path}.{name}")
            elif extra is False:
                raise AssertionError(f"{path}: unexpected property {name}")
            elif isinstance(extra, dict):
                validate(item, extra, doc, f"{path}.{name}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            validate(item, schema["items"], doc, f"{path}[{i}]")


def check_response(doc: dict[str, Any], *, path: str, method: str, status: int,
                   body: Any, content_type: str | None = "application/json") -> None:
    """The documented response for (path template, method, status) accepts `body`, sent
    as `content_type` (the response's header; None when it had none)."""
    op = doc["paths"][path][method.lower()]
    assert str(status) in op["responses"], f"{method} {path}: {status} not documented"
    response = op["responses"][str(status)]
    media = (content_type or "").partition(";")[0].strip() or None
    documented = set(response.get("content", {}))
    if media is None:
        assert not documented, f"{method} {path} {status}: no content type, documented {documented}"
    else:
        assert media in documented, f"{method} {path} {status}: {media} is not {documented}"
    content = response.get("content", {}).get("application/json")
    if content is None or "schema" not in content:
        if "content" not in response:
            assert body is None, f"{method} {path} {status}: documented without a body"
        return
    validate(body, content["schema"], doc)
