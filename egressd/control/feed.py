"""What feeds the reconciler's work queue (SPEC §5), once per process.

Proxy events that need a pass (`needs_pass`), and Secret events mapped to the
Proxies whose cloud-init names the Secret through an index kept from Proxy
events, so a Secret event costs O(its referrers), never a scan of the fleet.
Health transitions and timers are the other sources; the health engine and
the passes themselves add those keys.
"""

from __future__ import annotations

from typing import Any

from egressd.control.queue import WorkQueue
from egressd.kube.informer import Informer
from egressd.kube.resources import object_key

Obj = dict[str, Any]


def secret_ref_key(obj: Obj) -> str | None:
    """`namespace/name` of the Secret a raw Proxy takes its cloud-init from, if any."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    cloud_init = spec.get("cloudInit") if isinstance(spec, dict) else None
    ref = cloud_init.get("secretRef") if isinstance(cloud_init, dict) else None
    name = ref.get("name") if isinstance(ref, dict) else None
    if not isinstance(name, str) or not name:
        return None
    return f"{meta.get('namespace') or ''}/{name}"


class SecretRefIndex:
    """Secret key → the Proxy keys whose cloud-init names it, kept from Proxy events.

    A Secret event then costs O(its referrers), never a scan of the fleet.
    """

    def __init__(self) -> None:
        self._by_secret: dict[str, set[str]] = {}
        self._by_proxy: dict[str, str] = {}

    def set(self, proxy_key: str, secret_key: str | None) -> None:
        """Record that `proxy_key` refers to `secret_key` (None: to no Secret)."""
        old = self._by_proxy.get(proxy_key)
        if old == secret_key:
            return
        if old is not None:
            referrers = self._by_secret[old]
            referrers.discard(proxy_key)
            if not referrers:
                del self._by_secret[old]
            del self._by_proxy[proxy_key]
        if secret_key is not None:
            self._by_proxy[proxy_key] = secret_key
            self._by_secret.setdefault(secret_key, set()).add(proxy_key)

    def referrers(self, secret_key: str) -> frozenset[str]:
        """The Proxy keys that take their cloud-init from `secret_key`."""
        return frozenset(self._by_secret.get(secret_key, ()))


def _generation(obj: Obj) -> object:
    return (obj.get("metadata") or {}).get("generation")


def _deletion(obj: Obj) -> object:
    return (obj.get("metadata") or {}).get("deletionTimestamp")


def needs_pass(old: Obj, new: Obj) -> bool:
    """Whether an update needs a pass now: the spec (generation) moved, or deletion began.

    Every other update is the reconciler's own write (finalizer, annotation,
    status), a health verdict it wrote or the lease layer's cooldowns. Reacting
    to them would undo the delay a pass scheduled (a quota retry in 5 min
    would become immediate, its own finalizer patch re-queuing the key); what
    else a user edits is seen at the next scheduled pass or resync.
    """
    return _generation(old) != _generation(new) or _deletion(old) != _deletion(new)


def feed_queue(queue: WorkQueue[str], *, proxies: Informer, secrets: Informer) -> None:
    """Register the informer handlers that enqueue Proxy keys (once per process).

    Proxy add/delete enqueue the Proxy, and so does an update that moves the
    generation or starts the deletion (`needs_pass`);
    a Secret event enqueues every Proxy whose `spec.cloudInit.secretRef`
    names that Secret.
    """
    index = SecretRefIndex()

    def proxy_seen(obj: Obj) -> None:
        key = object_key(obj)
        index.set(key, secret_ref_key(obj))
        queue.add(key)

    def proxy_gone(obj: Obj) -> None:
        key = object_key(obj)
        index.set(key, None)
        queue.add(key)

    def secret_changed(secret_key: str) -> None:
        for key in index.referrers(secret_key):
            queue.add(key)

    def proxy_updated(old: Obj, new: Obj) -> None:
        if needs_pass(old, new):
            proxy_seen(new)

    proxies.add_handler(on_add=proxy_seen, on_update=proxy_updated, on_delete=proxy_gone)
    secrets.add_key_handler(secret_changed)
