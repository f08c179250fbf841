"""Checks a real answer against the served OpenAPI document: status, content type, body.

Bodies are validated with jsonschema_rs (schemathesis's own validator, so the
suite and the fuzzer read the document alike), with `format` asserted: a
`date-time` that is not RFC 3339 fails.
"""

from __future__ import annotations

from typing import Any

import jsonschema_rs


def validate(value: Any, schema: dict[str, Any], doc: dict[str, Any]) -> None:
    """Raise AssertionError naming every place `value` breaks `schema` (refs into `doc`)."""
    rooted = {**schema, "components": doc.get("components", {})}
    validator = jsonschema_rs.Draft202012Validator(rooted, validate_formats=True)
    errors = [f"{'/'.join(map(str, e.instance_path)) or '$'}: {e.message}"
              for e in validator.iter_errors(value)]
    assert not errors, errors


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
