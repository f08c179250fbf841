"""What the gateway asks of the fleet: the lease store's candidates, a count, how to dial one.

`Fleet` is the narrow view the gateway needs; `SourceFleet` implements it over
the Proxy cache (`ProxyCache`), which keeps the lease store's candidates with
the discovery API's own rule (`leasable`), so the gateway and `POST /v1/leases`
choose alike, from the store's index (no walk of the fleet per acquire).
Credentials come from a `credentials(proxy)` function (the credentials issue
fills it); without one a proxy is dialled as `host:port`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from egressd.gateway.upstream import Upstream
from egressd.http.source import CandidatePool, ProxyCache
from egressd.model.helpers import effective_host, effective_port
from egressd.model.proxy import Proxy

Credentials = Callable[[Proxy], tuple[str, str] | None]
"""A proxy's (username, password) for its upstream, or None when it needs none."""


class Fleet(Protocol):
    def feed(self, store: CandidatePool) -> None:
        """Keep `store`'s candidates in step with the fleet (idempotent)."""
        ...

    def count(self, selector: Mapping[str, str]) -> int:
        """How many proxies match `selector`, leasable or not (for the 503's breakdown)."""
        ...

    def upstream(self, key: str) -> Upstream | None:
        """How to dial proxy `key`, or None if it is gone or has no address."""
        ...


def _no_credentials(_proxy: Proxy) -> None:
    return None


class SourceFleet:
    """A `Fleet` over the informer cache."""

    def __init__(self, source: ProxyCache, *,
                 credentials: Credentials = _no_credentials) -> None:
        self._source = source
        self._credentials = credentials

    def feed(self, store: CandidatePool) -> None:
        self._source.feed(store)

    def count(self, selector: Mapping[str, str]) -> int:
        return self._source.count(selector)

    def upstream(self, key: str) -> Upstream | None:
        proxy = self._source.get(key)
        if proxy is None:
            return None
        host = effective_host(proxy)
        if host is None:
            return None
        creds = self._credentials(proxy)
        username, password = creds if creds is not None else (None, None)
        return Upstream(key=key, host=host, port=effective_port(proxy),
                        username=username, password=password)

