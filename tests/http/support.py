"""Test support for the HTTP layer: an in-memory ProxySource, Proxy builders, a live server.

`MemorySource` is the daemon's own `ProxyCache` (index, views, candidate feed)
filled by hand instead of by the informer. Proxies are built from their wire
form with the model's own `parse_proxy`, as the informer would.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx
import trio

from egressd.http.discovery import create_discovery_app
from egressd.http.serve import serve_app
from egressd.http.source import ProxyCache
from egressd.leases.interface import CooldownHook
from egressd.leases.store import MemoryLeaseStore
from egressd.model.convert import parse_proxy
from egressd.model.proxy import Proxy

EPOCH = 1_800_000_000.0
TOKEN = "s3cret-token"


def trio_wall() -> float:
    """Wall seconds that follow trio's (mock) clock, for the store."""
    return EPOCH + trio.current_time()


class MemorySource(ProxyCache):
    """The daemon's own ProxyCache, filled by hand instead of by an informer."""

    def __init__(self, proxies: Iterable[Proxy] = (), *, synced: bool = True) -> None:
        super().__init__()
        for proxy in proxies:
            self.put(proxy)
        if synced:
            self.synced.set()


def make_proxy(
    name: str,
    *,
    namespace: str = "crawl",
    attributes: dict[str, str] | None = None,
    healthy: bool | None = True,
    host: str | None = "10.0.0.1",
    port: int = 3128,
    latency: int | None = None,
    max_leases: int | None = None,
    deleting: bool = False,
    phase: str | None = None,
) -> Proxy:
    """A Proxy as the informer would hand it over. host=None makes a Managed proxy with no IP.

    `phase` overrides the phase the health verdict implies.
    """
    spec: dict[str, Any] = {"port": port, "attributes": attributes or {}}
    if host is None:
        spec.update(mode="Managed", provider="in-cluster")
    else:
        spec.update(mode="External", endpoint={"host": host})
    if max_leases is not None:
        spec["maxLeases"] = max_leases
    status: dict[str, Any] = {"phase": "Ready" if healthy else "Provisioning", "conditions": []}
    if healthy is not None:
        status["phase"] = "Ready" if healthy else "Unhealthy"
        status["conditions"].append({
            "type": "Healthy", "status": "True" if healthy else "False",
            "reason": "Probe", "lastTransitionTime": "2026-01-01T00:00:00Z",
        })
    if latency is not None:
        status["latencyMs"] = latency
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        status["phase"] = "Deleting"
    if phase is not None:  # a phase the condition does not explain (a stale condition)
        status["phase"] = phase
    return parse_proxy({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": metadata, "spec": spec, "status": status,
    })


def make_store(*, on_cooldown: CooldownHook | None = None, **kw: float) -> MemoryLeaseStore:
    args: dict[str, float] = {"cooldown": 600.0, "ban_cooldown": 3600.0, "max_cooldown": 3600.0}
    args.update(kw)
    return MemoryLeaseStore(
        cooldown=args["cooldown"], ban_cooldown=args["ban_cooldown"],
        max_cooldown=args["max_cooldown"], clock=trio_wall, on_cooldown=on_cooldown)


@contextlib.asynccontextmanager
async def running(app: Any, **client_kw: Any) -> AsyncIterator[httpx.AsyncClient]:
    """Serve `app` on 127.0.0.1 port 0 and yield a client for it; stop both on exit."""
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(functools.partial(serve_app, app, "127.0.0.1:0", grace=0.5))
        async with httpx.AsyncClient(base_url=urls[0], **client_kw) as client:
            yield client
        nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def discovery(
    source: MemorySource,
    store: MemoryLeaseStore | None = None,
    *,
    token: str | None = TOKEN,
    max_ttl: float = 3600.0,
    default_ttl: float = 300.0,
    **client_kw: Any,
) -> AsyncIterator[httpx.AsyncClient]:
    """The discovery API over `source` and `store`, with a client carrying the token."""
    app = create_discovery_app(
        source, store=make_store() if store is None else store, default_ttl=default_ttl,
        max_ttl=max_ttl, token=token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with running(app, headers=headers, **client_kw) as client:
        yield client
