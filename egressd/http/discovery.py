"""The discovery API (docs/reference.md): list proxies, acquire, release and report on leases.

A Quart-Trio app over a `ProxySource` (the informer cache) and a `LeaseStore`
(the interface, never the concrete store). Every error, including unknown
routes and wrong methods, is `{"error": code, "message": text}`.
"""

from __future__ import annotations

import logging

from quart import Response, request
from quart_trio import QuartTrio

from egressd.http import middleware
from egressd.http.common import json_response, new_app, no_content, reply
from egressd.http.openapi import document
from egressd.http.source import ProxySource
from egressd.http.wire import (
    ApiError,
    Health,
    ProxyList,
    grant_view,
    leasable,
    matches,
    parse_bool,
    parse_lease_request,
    parse_report_request,
    parse_selector,
    proxy_view,
)
from egressd.leases import Candidate, Grant, LeaseStore, UnknownLeaseError
from egressd.model.helpers import is_healthy, max_leases
from egressd.model.proxy import Proxy

log = logging.getLogger(__name__)

LIST_PARAMS = ("selector", "healthy")


def create_discovery_app(  # noqa: C901 -- its owner splits it (issue 10)
    source: ProxySource,
    *,
    store: LeaseStore,
    default_ttl: float,
    max_ttl: float,
    token: str | None,
) -> QuartTrio:
    """The discovery app, its middleware installed. `token=None` serves unauthenticated."""
    app = new_app("egressd.discovery")
    if token is None:
        log.warning(
            "DISCOVERY API IS UNAUTHENTICATED: no DISCOVERY_TOKEN or --discovery-token-file "
            "configured; anyone who can reach it can lease proxies")

    @app.get("/healthz")
    async def healthz() -> Response:
        return reply(Health("ok"))

    openapi_document = document(max_ttl=max_ttl, default_ttl=default_ttl)

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return json_response(openapi_document)

    @app.get("/v1/proxies")
    async def list_proxies() -> Response:
        unknown = sorted(set(request.args) - set(LIST_PARAMS))
        if unknown:
            raise ApiError("invalid_query", f"unknown query parameter(s) {', '.join(unknown)}")
        selectors = request.args.getlist("selector")
        if len(selectors) > 1:
            raise ApiError("invalid_selector", "give selector once: selector=k=v,k2=v2")
        selector = parse_selector(selectors[0] if selectors else "")
        healthy_args = request.args.getlist("healthy")
        if len(healthy_args) > 1:
            raise ApiError("invalid_query", "give healthy once")
        healthy = parse_bool(healthy_args[0], "healthy") if healthy_args else None
        # In key order already (the source keeps it): no sort per request.
        chosen = [
            p for p in source.proxies()
            if matches(p, selector) and (healthy is None or (is_healthy(p) is True) is healthy)
        ]
        usage = await store.usage(p.key for p in chosen)
        return reply(ProxyList(tuple(proxy_view(p, usage.get(p.key)) for p in chosen)))

    @app.post("/v1/leases")
    async def acquire() -> Response:
        req = parse_lease_request(
            await _body(), default_ttl=default_ttl, max_ttl=max_ttl)
        considered = 0
        by_key: dict[str, Proxy] = {}
        selector = req.selector
        for proxy in source.proxies():
            if selector and not matches(proxy, selector):
                continue
            considered += 1
            if leasable(proxy):
                by_key[proxy.key] = proxy
        candidates = (
            Candidate(key=key, max_leases=max_leases(p.spec), latency_ms=p.status.latency_ms)
            for key, p in by_key.items()
        )
        outcome = await store.acquire(candidates, target=req.target, ttl=req.ttl)
        if not isinstance(outcome, Grant):
            raise ApiError(
                "no_proxy_available",
                "no proxy matching the selector is free for this target",
                status=409,
                extra={
                    "considered": considered,
                    # Every match that is not leasable: unhealthy, unprobed, hostless, deleting.
                    "unhealthy": considered - outcome.considered,
                    "atCapacity": outcome.at_capacity,
                    "inCooldown": outcome.in_cooldown,
                },
            )
        lease = outcome.lease
        usage = (await store.usage([lease.key])).get(lease.key)
        return reply(grant_view(
            by_key[lease.key], usage, lease_id=lease.id, expires_at=lease.expires_at,
            active_leases=outcome.active_leases), 201)

    @app.delete("/v1/leases/<lease_id>")
    async def release(lease_id: str) -> Response:
        await store.release(lease_id)
        return no_content()

    @app.post("/v1/leases/<lease_id>/report")
    async def report(lease_id: str) -> Response:
        req = parse_report_request(await _body())
        try:
            await store.report(
                lease_id, result=req.result, target=req.target, retry_after=req.retry_after)
        except UnknownLeaseError:
            raise ApiError("unknown_lease", "no such lease (never issued, or long expired)",
                           status=404) from None
        return no_content()

    app.asgi_app = middleware.wrap(app.asgi_app, token=token)  # type: ignore[method-assign,assignment]
    return app


async def _body() -> bytes:
    data = await request.get_data(as_text=False)
    return data if isinstance(data, bytes) else data.encode()
