"""What the gateway asks of the fleet: leasable candidates for a selector, and how to dial one.

`Fleet` is the narrow view the gateway needs; `SourceFleet` implements it over
the Proxy cache (`ProxySource`) with the discovery API's own rules (`matches`,
`leasable`), so the gateway and `POST /v1/leases` choose alike. Credentials
come from a `credentials(proxy)` function (the credentials issue fills it);
without one a proxy is dialled as `host:port`.

The candidate walk is the discovery API's, one pass over the cache per
acquire; when the lease layer's selector index lands, `SourceFleet.candidates`
asks it instead and the gateway does not change.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Protocol

import attrs

from egressd.gateway.upstream import Upstream
from egressd.http.source import ProxySource
from egressd.http.wire import leasable, matches
from egressd.leases import Candidate
from egressd.model.helpers import effective_host, effective_port, max_leases
from egressd.model.proxy import Proxy

Credentials = Callable[[Proxy], tuple[str, str] | None]
"""A proxy's (username, password) for its upstream, or None when it needs none."""


@attrs.frozen(kw_only=True)
class Found:
    """Candidates for one acquire; `considered` counts every selector match (for the 503)."""

    considered: int
    candidates: list[Candidate]


class Fleet(Protocol):
    def candidates(self, selector: Mapping[str, str], *, exclude: Collection[str] = (),
                   only: str | None = None) -> Found:
        """Leasable proxies matching `selector`, minus `exclude`; just `only` if given."""
        ...

    def upstream(self, key: str) -> Upstream | None:
        """How to dial proxy `key`, or None if it is gone or has no address."""
        ...


def _no_credentials(_proxy: Proxy) -> None:
    return None


class SourceFleet:
    """A `Fleet` over the informer cache."""

    def __init__(self, source: ProxySource, *,
                 credentials: Credentials = _no_credentials) -> None:
        self._source = source
        self._credentials = credentials

    def candidates(self, selector: Mapping[str, str], *, exclude: Collection[str] = (),
                   only: str | None = None) -> Found:
        if only is not None:
            proxy = self._source.get(only)
            ok = (proxy is not None and only not in exclude and matches(proxy, selector)
                  and leasable(proxy))
            return Found(considered=1, candidates=[_candidate(proxy)] if ok and proxy else [])
        considered = 0
        out: list[Candidate] = []
        for proxy in self._source.proxies():
            if selector and not matches(proxy, selector):
                continue
            considered += 1
            if leasable(proxy) and proxy.key not in exclude:
                out.append(_candidate(proxy))
        return Found(considered=considered, candidates=out)

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


def _candidate(proxy: Proxy) -> Candidate:
    return Candidate(key=proxy.key, max_leases=max_leases(proxy.spec),
                     latency_ms=proxy.status.latency_ms)
