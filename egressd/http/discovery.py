"""The discovery API (docs/reference.md): list proxies, acquire, release and report on leases.

A Quart-Trio app over a `ProxyCache` (the informer cache, indexed) and a
`LeaseStore` (the interface, never the concrete store), whose candidates the
cache keeps in step. No route walks the fleet: an acquire is the store's
indexed choice, a listing with a selector walks the matches of its smallest
term with each proxy's view encoded once per version. Every error, including
unknown routes and wrong methods, is `{"error": code, "message": text}`.
"""

from __future__ import annotations

import json
import logging
import math

from quart import Response, request
from quart_trio import QuartTrio

from egressd.http import middleware
from egressd.http.common import json_response, new_app, no_content, reply
from egressd.http.openapi import document
from egressd.http.source import ProxyCache
from egressd.http.wire import (
    ApiError,
    Health,
    codec,
    cooldowns_view,
    grant_view,
    lease_view,
    parse_bool,
    parse_lease_request,
    parse_report_request,
    parse_selector,
)
from egressd.leases import Grant, LeaseStore, Refusal, UnknownLeaseError, Usage
from egressd.model.helpers import is_healthy

log = logging.getLogger(__name__)

LIST_PARAMS = ("selector", "healthy")


def create_discovery_app(
    source: ProxyCache,
    *,
    store: LeaseStore,
    default_ttl: float,
    max_ttl: float,
    token: str | None,
) -> QuartTrio:
    """The discovery app, its middleware installed. `token=None` serves unauthenticated."""
    app = new_app("egressd.discovery")
    source.feed(store)
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
        selector, healthy = _list_query()
        chosen = [
            p for p in source.select(selector)
            if healthy is None or (is_healthy(p) is True) is healthy
        ]
        usage = await store.usage(p.key for p in chosen)
        items = ",".join(source.view_prefix(p) + _per_request(usage.get(p.key)) for p in chosen)
        return Response(f'{{"items":[{items}]}}', status=200, content_type="application/json")

    @app.post("/v1/leases")
    async def acquire() -> Response:
        req = parse_lease_request(
            await _body(), default_ttl=default_ttl, max_ttl=max_ttl)
        outcome = await store.acquire(req.selector, target=req.target, ttl=req.ttl)
        if not isinstance(outcome, Grant):
            return _no_proxy(outcome, considered=source.count(req.selector))
        lease = outcome.lease
        proxy = source.get(lease.key)
        # The store's candidates are the cache's leasable proxies, changed in step with it
        # and with no await between the choice and here.
        assert proxy is not None
        usage = (await store.usage([lease.key])).get(lease.key)
        return reply(grant_view(
            proxy, usage, lease_id=lease.id, expires_at=lease.expires_at,
            active_leases=outcome.active_leases), 201)

    @app.get("/v1/leases/<lease_id>")
    async def show_lease(lease_id: str) -> Response:
        lease = await store.lease(lease_id)
        proxy = None if lease is None else source.get(lease.key)
        if lease is None or proxy is None:  # a Proxy deleted while leased has nothing to show
            raise ApiError("unknown_lease", "no such lease (never issued, expired or released)",
                           status=404)
        usage = (await store.usage([lease.key])).get(lease.key)
        return reply(lease_view(proxy, usage, lease_id=lease.id, target=lease.target,
                                expires_at=lease.expires_at))

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


def _list_query() -> tuple[dict[str, str], bool | None]:
    """The selector and healthy filter of `GET /v1/proxies`, each given at most once."""
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
    return selector, healthy


_IDLE = ',"activeLeases":0,"cooldowns":{}}'


def _per_request(usage: Usage | None) -> str:
    """The end of an encoded proxyView: the fields the lease store knows now."""
    if usage is None:
        return _IDLE
    cooldowns = json.dumps(codec.unstructure(cooldowns_view(usage.cooldowns)),
                           separators=(",", ":"))
    return f',"activeLeases":{usage.active_leases},"cooldowns":{cooldowns}}}'


def _no_proxy(refusal: Refusal, *, considered: int) -> Response:
    """The 409, with Retry-After when some match's lease or cooldown will end."""
    error = ApiError(
        "no_proxy_available",
        "no proxy matching the selector is free for this target",
        status=409,
        extra={
            "considered": considered,
            # Every match that is not leasable: unhealthy, unprobed, hostless, not Ready.
            "unhealthy": considered - refusal.considered,
            "atCapacity": refusal.at_capacity,
            "inCooldown": refusal.in_cooldown,
        },
    )
    response = json_response(error.body(), error.status)
    if refusal.retry_after is not None:
        # Whole seconds (RFC 9110 delay-seconds), at least 1: retrying at 0 would only
        # meet the same refusal.
        response.headers["Retry-After"] = str(max(1, math.ceil(refusal.retry_after)))
    return response


async def _body() -> bytes:
    data = await request.get_data(as_text=False)
    return data if isinstance(data, bytes) else data.encode()
