"""Where the HTTP layer reads proxies from: the Proxy cache, indexed as requests need it.

`ProxyCache` holds every parsed Proxy of this replica with what the discovery
API asks per request, maintained as the cache changes, never per request:

* the keys in order and, per attribute pair (`region=eu`), the keys that have
  it, each a sorted set: a listing with a selector walks the smallest term's
  set in key order and checks the other terms, so it costs the matches of
  that term, not the fleet, and needs no sort;
* each proxy's encoded proxyView without its two per-request fields
  (activeLeases, cooldowns), made on first use after a change: a listing
  encodes no proxy again;
* the lease store's candidates: every change puts the proxy into the store's
  candidate index if it is leasable (docs/reference.md) and takes it out if not.

`InformerProxySource` feeds a `ProxyCache` from the Proxy informer, parsing
each object once, on its event. The API never lists from the Kubernetes API
per request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

import trio
from sortedcontainers import SortedSet

from egressd.http.wire import codec, leasable, proxy_view
from egressd.kube.informer import Informer
from egressd.kube.resources import object_key
from egressd.leases import Candidate
from egressd.model.convert import ModelError, parse_proxy
from egressd.model.helpers import max_leases
from egressd.model.proxy import Proxy

log = logging.getLogger(__name__)

PER_REQUEST_FIELDS = ("activeLeases", "cooldowns")
"""The proxyView fields the lease store fills per request; the rest is cached per version."""


class CandidatePool(Protocol):
    """The lease store's side of the cache: its leasable candidates."""

    def put_candidate(self, candidate: Candidate) -> None: ...

    def remove_candidate(self, key: str) -> None: ...


class ProxySource(Protocol):
    """A read-only, indexed view of every Proxy this replica knows."""

    @property
    def synced(self) -> trio.Event:
        """Set once the first full list has been loaded (drives `/readyz`)."""
        ...

    def proxies(self) -> Iterable[Proxy]:
        """Every Proxy currently known, in key ("namespace/name") order.

        Iterate without awaiting in between: the view is live.
        """
        ...

    def get(self, key: str) -> Proxy | None:
        """The Proxy with key "namespace/name", or None."""
        ...


class ProxyCache:
    """Parsed Proxies by key, indexed by attribute, feeding the lease store's candidates."""

    def __init__(self) -> None:
        self.synced = trio.Event()
        self._proxies: dict[str, Proxy] = {}
        self._order: SortedSet[str] = SortedSet()
        self._terms: dict[tuple[str, str], SortedSet[str]] = {}
        self._views: dict[str, str] = {}
        self._pools: list[CandidatePool] = []

    def feed(self, pool: CandidatePool) -> None:
        """Keep `pool`'s candidates in step with this cache, from now on (idempotent)."""
        if any(p is pool for p in self._pools):
            return
        self._pools.append(pool)
        for proxy in self._proxies.values():
            _offer(pool, proxy)

    # --- changes ----------------------------------------------------------------------------

    def put(self, proxy: Proxy) -> None:
        key = proxy.key
        old = self._proxies.get(key)
        if old is None:
            self._order.add(key)
        elif old.spec.attributes != proxy.spec.attributes:
            self._unindex(old)
        if old is None or old.spec.attributes != proxy.spec.attributes:
            for term in proxy.spec.attributes.items():
                self._terms.setdefault(term, SortedSet()).add(key)
        self._proxies[key] = proxy
        self._views.pop(key, None)
        for pool in self._pools:
            _offer(pool, proxy)

    def drop(self, key: str) -> None:
        old = self._proxies.pop(key, None)
        if old is None:
            return
        self._order.discard(key)
        self._unindex(old)
        self._views.pop(key, None)
        for pool in self._pools:
            pool.remove_candidate(key)

    def _unindex(self, proxy: Proxy) -> None:
        for term in proxy.spec.attributes.items():
            keys = self._terms[term]
            keys.discard(proxy.key)
            if not keys:
                del self._terms[term]

    # --- reads ------------------------------------------------------------------------------

    def proxies(self) -> Iterable[Proxy]:
        proxies = self._proxies
        return (proxies[key] for key in self._order)

    def get(self, key: str) -> Proxy | None:
        return self._proxies.get(key)

    def select(self, selector: Mapping[str, str]) -> Iterator[Proxy]:
        """The proxies whose attributes match every term, in key order."""
        if not selector:
            yield from self.proxies()
            return
        sets = []
        for term in selector.items():
            keys = self._terms.get(term)
            if keys is None:
                return
            sets.append(keys)
        sets.sort(key=len)
        first, rest = sets[0], sets[1:]
        for key in first:
            if all(key in keys for keys in rest):
                yield self._proxies[key]

    def count(self, selector: Mapping[str, str]) -> int:
        """How many proxies the selector matches: O(1) for zero or one term."""
        if not selector:
            return len(self._proxies)
        if len(selector) == 1:
            (term,) = selector.items()
            return len(self._terms.get(term, ()))
        return sum(1 for _ in self.select(selector))

    def view_prefix(self, proxy: Proxy) -> str:
        """The proxy's encoded proxyView up to its per-request fields (no closing brace)."""
        text = self._views.get(proxy.key)
        if text is None:
            view = codec.unstructure(proxy_view(proxy, None))
            for name in PER_REQUEST_FIELDS:
                del view[name]
            text = self._views[proxy.key] = json.dumps(view, separators=(",", ":"))[:-1]
        return text


def _offer(pool: CandidatePool, proxy: Proxy) -> None:
    if leasable(proxy):
        pool.put_candidate(Candidate(
            key=proxy.key, max_leases=max_leases(proxy.spec), latency_ms=proxy.status.latency_ms,
            attributes=proxy.spec.attributes))
    else:
        pool.remove_candidate(proxy.key)


class InformerProxySource(ProxyCache):
    """A ProxyCache fed by the Proxy informer: each object is parsed once, on its event.

    An object that does not parse is left out (and logged), never served half-read.
    """

    def __init__(self, informer: Informer) -> None:
        super().__init__()
        self._informer = informer
        self.synced = informer.synced
        informer.add_handler(
            on_add=self._on_object, on_update=lambda _old, new: self._on_object(new),
            on_delete=lambda obj: self.drop(object_key(obj)))

    def _on_object(self, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        try:
            proxy = parse_proxy(obj)
        except ModelError as exc:
            self.drop(key)
            log.warning("ignoring a Proxy that does not parse",
                        extra={"proxy": key, "error": str(exc)})
            return
        self.put(proxy)
