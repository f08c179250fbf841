"""What is to feed the pool controller's work queue, once per process (issue 13; not
wired into app.py until the controller lands).

ProxyPool events enqueue the pool. Proxy events enqueue the pool a Proxy
belongs to: the one its controller ownerReference names, or, for an orphan
carrying the pool label, the pool that may adopt it. `PoolMembers` is the index
from a pool to its candidate Proxies, kept from Proxy events, so a pass costs
O(the pool), never a scan of the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from egressd.control.queue import WorkQueue
from egressd.kube.informer import Informer
from egressd.kube.resources import object_key
from egressd.model.constants import POOL_KIND, POOL_LABEL

Obj = dict[str, Any]


def pool_of(obj: Obj) -> str | None:
    """`namespace/name` of the pool a raw Proxy belongs to or may be adopted by."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return f"{namespace}/{ref.get('name')}" if ref.get("kind") == POOL_KIND else None
    name = (meta.get("labels") or {}).get(POOL_LABEL)
    return f"{namespace}/{name}" if isinstance(name, str) and name else None


class PoolMembers:
    """Pool key → the keys of the Proxies that name it (owner or label)."""

    def __init__(self) -> None:
        self._by_pool: dict[str, set[str]] = {}
        self._by_proxy: dict[str, str] = {}

    def set(self, proxy_key: str, pool_key: str | None) -> None:
        old = self._by_proxy.get(proxy_key)
        if old == pool_key:
            return
        if old is not None:
            members = self._by_pool[old]
            members.discard(proxy_key)
            if not members:
                del self._by_pool[old]
            del self._by_proxy[proxy_key]
        if pool_key is not None:
            self._by_pool.setdefault(pool_key, set()).add(proxy_key)
            self._by_proxy[proxy_key] = pool_key

    def of(self, pool_key: str) -> Iterable[str]:
        return sorted(self._by_pool.get(pool_key, ()))


def feed_pools(queue: WorkQueue[str], *, pools: Informer, proxies: Informer,
               members: PoolMembers) -> None:
    """Register the handlers; before the informers run, so none misses the first list."""
    pools.add_key_handler(queue.add)

    def proxy_seen(obj: Obj) -> None:
        pool = pool_of(obj)
        members.set(object_key(obj), pool)
        if pool is not None:
            queue.add(pool)

    def proxy_updated(old: Obj, new: Obj) -> None:
        before = pool_of(old)
        proxy_seen(new)
        if before is not None and before != pool_of(new):
            queue.add(before)

    def proxy_gone(obj: Obj) -> None:
        pool = pool_of(obj)
        members.set(object_key(obj), None)
        if pool is not None:
            queue.add(pool)

    proxies.add_handler(on_add=proxy_seen, on_update=proxy_updated, on_delete=proxy_gone)
