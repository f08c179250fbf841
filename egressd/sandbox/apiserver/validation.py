"""Enforcing a CRD's schema: defaults, pruning and validation (structural + CEL).

The schema engine is `egressd.sandbox.schema.CRDSchema`; this module caches
compiled schemas and turns their findings into the 422 and 400 answers
kube-apiserver gives.
"""

from __future__ import annotations

import json
from typing import Any

from egressd.sandbox.apiserver.errors import ApiError, invalid
from egressd.sandbox.schema import CRDSchema, SchemaError

# Compiling a schema (its CEL rules above all) costs tens of milliseconds; tests
# build a server per test, so identical CRD specs share one compiled schema.
_CACHE: dict[str, CRDSchema] = {}
_CACHE_LIMIT = 64


class BadSchema(Exception):
    """Raised by `load_schema` for a CRD version whose schema cannot be served."""


def load_schema(crd: dict[str, Any], version: str) -> CRDSchema:
    """The CRD version's compiled schema.

    Raises BadSchema when the schema is malformed or a CEL rule does not compile.
    """
    key = version + "\0" + json.dumps(crd.get("spec"), sort_keys=True, default=str)
    if key in _CACHE:
        return _CACHE[key]
    try:
        schema = CRDSchema.from_crd(crd, version)
    except SchemaError as exc:
        raise BadSchema(str(exc)) from exc
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[key] = schema
    return schema


def enforce(schema: CRDSchema | None, obj: dict[str, Any], old: dict[str, Any] | None, *,
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
