"""The discovery API as OpenAPI 3.1 (served at `/openapi.json`), generated from its classes.

`OPERATIONS` names each route's parameters, body class and answer classes; the
schemas come from those classes through the same codec that reads and writes
them (`egressd.codec.schema_of`), so a field added to a class is in the
document at once. Tests check that every route of the app is here (and nothing
else is), and every real answer (status, content type, body) against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import attrs

from egressd.codec import Doc, Schema, SchemaOnly, schema_of
from egressd.http.wire import (
    SELECTOR_PATTERN,
    Error,
    Health,
    LeaseGrant,
    LeaseRequest,
    LeaseShown,
    NoProxyAvailable,
    ProxyList,
    Report,
    codec,
)


@attrs.frozen(kw_only=True)
class Reply:
    """One documented answer: its body class (None: no body) and content type."""

    description: str
    body: type | None = None
    content_type: str | None = None
    """Defaults to application/json when there is a body."""
    headers: Mapping[str, str] = attrs.field(factory=dict)
    """Header name → description (always sent with this answer)."""
    links: Mapping[str, Link] = attrs.field(factory=dict)
    """Operations a client may call next with a value from this answer (OpenAPI links)."""


@attrs.frozen(kw_only=True)
class Link:
    """An OpenAPI link: `operation_id` takes `parameters` (name → runtime expression)."""

    operation_id: str
    parameters: Mapping[str, str]
    description: str = ""


@attrs.frozen(kw_only=True)
class Param:
    """A query or path parameter; `type` may carry `Annotated` checks and docs."""

    name: str
    type: Any
    where: str = "query"


@attrs.frozen(kw_only=True)
class Operation:
    """One route and method."""

    method: str
    path: str
    summary: str
    params: tuple[Param, ...] = ()
    body: type | None = None
    body_required: bool = False
    replies: Mapping[int, Reply]
    authenticated: bool = True


def _error(description: str) -> Reply:
    return Reply(description=description, body=Error)


ERRORS: Mapping[int, Reply] = {
    400: _error("malformed request"),
    401: Reply(description="missing or wrong bearer token", body=Error,
               headers={"WWW-Authenticate": "Bearer realm=\"egressd\""}),
    408: _error("body not received within 60 s"),
    413: _error("body larger than 64 KiB"),
}
"""What any authenticated operation may answer before it runs (the middleware)."""

LEASE_ID = Param(name="leaseId", type=str, where="path")

_BY_LEASE_ID = {"leaseId": "$response.body#/leaseId"}
_LEASE_LINKS = {
    "report": Link(operation_id="postLeasesLeaseIdReport", parameters=_BY_LEASE_ID,
                   description="report what the client saw through the leased proxy"),
    "release": Link(operation_id="deleteLeasesLeaseId", parameters=_BY_LEASE_ID,
                    description="give the lease back"),
}

OPERATIONS: tuple[Operation, ...] = (
    Operation(method="get", path="/healthz", summary="liveness; needs no token",
              authenticated=False,
              replies={200: Reply(description="alive", body=Health),
                       400: _error("more than one Authorization header")}),
    Operation(method="get", path="/openapi.json", summary="this document",
              replies={200: Reply(description="OpenAPI 3.1", content_type="application/json")}),
    Operation(
        method="get", path="/v1/proxies", summary="list proxies",
        params=(
            Param(name="selector", type=Annotated[str, SchemaOnly({"pattern": SELECTOR_PATTERN}),
                                                  Doc("k=v,k2=v2: attributes the proxies must "
                                                      "have (a key twice with two values is "
                                                      "refused)")]),
            Param(name="healthy", type=Annotated[bool, Doc(
                "only healthy (true) or only not healthy (false) proxies")]),
        ),
        replies={200: Reply(description="the matching proxies", body=ProxyList)}),
    Operation(
        method="post", path="/v1/leases", summary="lease a proxy", body=LeaseRequest,
        replies={201: Reply(description="leased", body=LeaseGrant, links=_LEASE_LINKS),
                 409: Reply(description="no matching proxy is free; with a Retry-After "
                                        "header (seconds until the soonest lease or cooldown "
                                        "of a match ends) when one will end",
                            body=NoProxyAvailable)}),
    Operation(
        method="get", path="/v1/leases/{leaseId}", summary="show an active lease",
        params=(LEASE_ID,),
        replies={200: Reply(description="the lease", body=LeaseShown),
                 404: _error("unknown lease: never issued, expired or released")}),
    Operation(
        method="delete", path="/v1/leases/{leaseId}", summary="give a lease back (idempotent)",
        params=(LEASE_ID,), replies={204: Reply(description="released, or already gone")}),
    Operation(
        method="post", path="/v1/leases/{leaseId}/report",
        summary="report what the client saw through the proxy",
        params=(LEASE_ID,), body=Report, body_required=True,
        replies={204: Reply(description="recorded"), 404: _error("unknown lease")}),
)


def _reply(reply: Reply, components: dict[str, Schema]) -> Schema:
    out: Schema = {"description": reply.description}
    content_type = reply.content_type or ("application/json" if reply.body else None)
    if content_type:
        media: Schema = {}
        if reply.body is not None:
            media["schema"] = schema_of(codec, reply.body, components, writing=True)
        out["content"] = {content_type: media}
    if reply.links:
        out["links"] = {
            name: {"operationId": link.operation_id, "parameters": dict(link.parameters),
                   **({"description": link.description} if link.description else {})}
            for name, link in reply.links.items()}
    if reply.headers:
        out["headers"] = {
            name: {"description": text, "required": True, "schema": {"type": "string"}}
            for name, text in reply.headers.items()}
    return out


def _operation(op: Operation, components: dict[str, Schema]) -> Schema:
    replies = {**ERRORS, **op.replies} if op.authenticated else dict(op.replies)
    out: Schema = {"summary": op.summary, "operationId": _operation_id(op)}
    if not op.authenticated:
        out["security"] = []
    if op.params:
        out["parameters"] = [_param(p, components) for p in op.params]
    if op.body is not None:
        out["requestBody"] = {"required": op.body_required, "content": {"application/json": {
            "schema": schema_of(codec, op.body, components, writing=False)}}}
    out["responses"] = {str(status): _reply(replies[status], components)
                        for status in sorted(replies)}
    return out


def _param(param: Param, components: dict[str, Schema]) -> Schema:
    schema = schema_of(codec, param.type, components, writing=False)
    out: Schema = {"name": param.name, "in": param.where, "required": param.where == "path"}
    if "description" in schema:
        out["description"] = schema.pop("description")
    out["schema"] = schema
    return out


def _operation_id(op: Operation) -> str:
    words = [w.strip("{}") for w in op.path.split("/") if w and w != "v1"]
    return op.method + "".join(w[:1].upper() + w[1:] for w in words).replace(".", "")


def document(*, max_ttl: float, default_ttl: float) -> dict[str, Any]:
    """The OpenAPI document for an API with these TTL limits."""
    components: dict[str, Schema] = {}
    paths: dict[str, dict[str, Schema]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op, components)
    ttl = components["LeaseRequest"]["properties"]["ttlSeconds"]
    ttl.update(maximum=max_ttl, default=default_ttl)
    return {
        "openapi": "3.1.0",
        "info": {"title": "egressd discovery API", "version": "v1"},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": dict(sorted(components.items())),
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
