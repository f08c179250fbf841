"""The discovery API described as OpenAPI 3.1 (served at `/openapi.json`).

Tests check that every route of the app is here (and nothing else is), and
validate real responses against these schemas, so the document stays true.
"""

from __future__ import annotations

from typing import Any

from egressd.leases import Result

ERROR_CODES = (
    "invalid_body", "invalid_ttl", "invalid_result", "invalid_selector", "invalid_query",
    "no_proxy_available", "unknown_lease", "unauthorized", "body_too_large", "body_timeout",
    "not_found", "invalid_header",
    "method_not_allowed", "internal_error",
)

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

_COOLDOWN = {
    "type": "object",
    "required": ["until", "reason"],
    "additionalProperties": False,
    "properties": {
        "until": {"type": "string", "format": "date-time"},
        "reason": {"type": "string", "enum": ["rate_limited", "banned"]},
    },
}

_PROXY_VIEW = {
    "type": "object",
    "additionalProperties": False,
    "required": ["namespace", "name", "host", "port", "attributes", "healthy", "latencyMs",
                 "activeLeases", "maxLeases", "phase", "cooldowns"],
    "properties": {
        "namespace": {"type": "string"},
        "name": {"type": "string"},
        "host": {"type": ["string", "null"], "description": "null until the proxy has an address"},
        "port": {"type": "integer"},
        "attributes": _STR_MAP,
        "healthy": {"type": "boolean", "description": "the health engine's verdict is healthy"},
        "latencyMs": {"type": ["integer", "null"]},
        "activeLeases": {"type": "integer"},
        "maxLeases": {"type": "integer"},
        "phase": {"type": ["string", "null"]},
        "cooldowns": {
            "type": "object",
            "description": 'cooldowns in force, by target; "*" is global',
            "additionalProperties": {"$ref": "#/components/schemas/Cooldown"},
        },
    },
}

_ERROR = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "enum": list(ERROR_CODES)},
        "message": {"type": "string"},
    },
}

_NO_PROXY = {
    "type": "object",
    "required": ["error", "message", "considered", "unhealthy", "atCapacity", "inCooldown"],
    "additionalProperties": False,
    "properties": {
        "error": {"type": "string", "enum": ["no_proxy_available"]},
        "message": {"type": "string"},
        "considered": {"type": "integer", "description": "proxies matching the selector"},
        "unhealthy": {"type": "integer",
                      "description": "matches not leasable: no healthy verdict, no host, deleting"},
        "atCapacity": {"type": "integer"},
        "inCooldown": {"type": "integer"},
    },
}

_TARGET = {"type": "string", "maxLength": 253,
           "description": 'the site the proxy is for; "" means none, "*" is reserved'}


def _lease_request(max_ttl: float, default_ttl: float) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "selector": {**_STR_MAP, "description": "attributes the proxy must have"},
            "target": _TARGET,
            "ttlSeconds": {"type": "number", "exclusiveMinimum": 0, "maximum": max_ttl,
                           "default": default_ttl},
        },
    }


_GRANT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["leaseId", "proxy", "proxyUrl", "expiresAt", "activeLeases"],
    "properties": {
        "leaseId": {"type": "string"},
        "proxy": {"$ref": "#/components/schemas/ProxyView"},
        "proxyUrl": {"type": "string", "description": "http://host:port"},
        "expiresAt": {"type": "string", "format": "date-time"},
        "activeLeases": {"type": "integer"},
    },
}

_REPORT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["result"],
    "properties": {
        "result": {"type": "string", "enum": [r.value for r in Result],
                   "description": "proxy_error: the proxy itself failed (refused, timed "
                                  "out, 407); no cooldown, counts as a failed probe"},
        "target": _TARGET,
        "retryAfterSeconds": {"type": "number", "minimum": 0,
                              "description": "the site's Retry-After; bounded to 1 s..max"},
    },
}


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


_ERRORS = {
    "400": _json("Error", "malformed request"),
    "401": _json("Error", "missing or wrong bearer token"),
    "408": _json("Error", "body not received within 60 s"),
    "413": _json("Error", "body larger than 64 KiB"),
}

_LEASE_ID = {"name": "leaseId", "in": "path", "required": True, "schema": {"type": "string"}}


def document(*, max_ttl: float, default_ttl: float) -> dict[str, Any]:
    """The OpenAPI document for an API with these TTL limits."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "egressd discovery API", "version": "v1"},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Cooldown": _COOLDOWN,
                "ProxyView": _PROXY_VIEW,
                "ProxyList": {
                    "type": "object", "required": ["items"], "additionalProperties": False,
                    "properties": {"items": {"type": "array",
                                             "items": {"$ref": "#/components/schemas/ProxyView"}}},
                },
                "LeaseRequest": _lease_request(max_ttl, default_ttl),
                "Grant": _GRANT,
                "Report": _REPORT,
                "Error": _ERROR,
                "NoProxyAvailable": _NO_PROXY,
                "Health": {"type": "object", "required": ["status"],
                           "properties": {"status": {"type": "string"}}},
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": {
                "summary": "liveness; needs no token", "security": [],
                "responses": {"200": _json("Health", "alive")},
            }},
            "/openapi.json": {"get": {
                "summary": "this document",
                "responses": {"200": {"description": "OpenAPI 3.1",
                                      "content": {"application/json": {}}}, **_ERRORS},
            }},
            "/v1/proxies": {"get": {
                "summary": "list proxies",
                "parameters": [
                    {"name": "selector", "in": "query", "schema": {"type": "string"},
                     "description": "k=v,k2=v2: attributes the proxies must have"},
                    {"name": "healthy", "in": "query", "schema": {"type": "boolean"},
                     "description": "only healthy (true) or only not healthy (false) proxies"},
                ],
                "responses": {"200": _json("ProxyList", "the matching proxies"), **_ERRORS},
            }},
            "/v1/leases": {"post": {
                "summary": "lease a proxy",
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/LeaseRequest"}}}},
                "responses": {
                    "201": _json("Grant", "leased"),
                    **_ERRORS,
                    "409": _json("NoProxyAvailable", "no matching proxy is free"),
                },
            }},
            "/v1/leases/{leaseId}": {"delete": {
                "summary": "give a lease back (idempotent)",
                "parameters": [_LEASE_ID],
                "responses": {"204": {"description": "released, or already gone"},
                              **_ERRORS},
            }},
            "/v1/leases/{leaseId}/report": {"post": {
                "summary": "report what the client saw through the proxy",
                "parameters": [_LEASE_ID],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Report"}}}},
                "responses": {"204": {"description": "recorded"}, **_ERRORS,
                              "404": _json("Error", "unknown lease")},
            }},
        },
    }
