"""Enforcing a CRD's schema: defaults, pruning and validation (structural + CEL).

The schema engine lives in `egressd.sandbox.schema` (`CRDSchema`); this
module loads it by name so the server still serves (without enforcement)
where that module is absent, and turns its findings into the 422 and 400
answers kube-apiserver gives.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from egressd.sandbox.apiserver.errors import ApiError, invalid

log = logging.getLogger("egressd.sandbox.apiserver")


class FieldErrorLike(Protocol):
    field: str
    reason: str
    message: str


class SchemaLike(Protocol):
    def apply_defaults(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    def prune(self, obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]: ...

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None = None
                 ) -> Sequence[FieldErrorLike]: ...


# Compiling a schema (its CEL rules above all) costs tens of milliseconds; tests
# build a server per test, so identical CRD specs share one compiled schema.
_CACHE: dict[str, SchemaLike | None] = {}
_CACHE_LIMIT = 64


class BadSchema(Exception):
    """Raised by `load_schema` for a CRD version whose schema cannot be served."""


def load_schema(crd: dict[str, Any], version: str) -> SchemaLike | None:
    """The CRD version's schema engine, or None when the engine is absent.

    Raises BadSchema when the schema is malformed or a CEL rule does not compile.
    """
    key = version + "\0" + json.dumps(crd.get("spec"), sort_keys=True, default=str)
    if key in _CACHE:
        return _CACHE[key]
    try:
        module = importlib.import_module("egressd.sandbox.schema")
    except ImportError:
        log.warning("egressd.sandbox.schema is missing: CRD schemas are not enforced")
        return None
    try:
        schema: SchemaLike = module.CRDSchema.from_crd(crd, version)
    except module.SchemaError as exc:
        raise BadSchema(str(exc)) from exc
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[key] = schema
    return schema


def enforce(schema: SchemaLike | None, obj: dict[str, Any], old: dict[str, Any] | None, *,
            kind: str, group: str, field_validation: str) -> tuple[dict[str, Any], list[str]]:
    """Prune, default and validate `obj`; returns it and the warnings to send.

    Unknown fields are dropped (and reported per `fieldValidation`: Strict is
    a 400, Warn a warning header, Ignore silence); validation errors are 422.
    """
    if schema is None:
        return obj, []
    name = (obj.get("metadata") or {}).get("name", "")
    pruned, dropped = schema.prune(obj)
    warnings: list[str] = []
    if dropped:
        if field_validation == "Strict":
            fields = ", ".join(f'unknown field "{path}"' for path in dropped)
            raise ApiError(400, "BadRequest", f"{kind} in version \"{obj.get('apiVersion', '')}\" "
                           f"cannot be handled as a {kind}: strict decoding error: {fields}")
        if field_validation != "Ignore":
            warnings = [f'unknown field "{path}"' for path in dropped]
    defaulted = schema.apply_defaults(pruned)
    errors = schema.validate(defaulted, old)
    if errors:
        raise invalid(kind, group, name, [(e.field, e.reason, e.message) for e in errors])
    return defaulted, warnings
