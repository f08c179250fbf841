"""What feeds the reconciler's work queue (docs/architecture.md), once per process.

Proxy events that need a pass (`needs_pass`); Secret events mapped to the
Proxies whose cloud-init names the Secret; and the kubernetes provider's Pods
(`feed_instances`): a Pod that fails, loses its IP, starts running or
disappears enqueues the Proxy named by its `egressd-proxy-uid` label, so it
is replaced at once rather than after the health verdict flips or the
resync. Both mappings are indexes kept from Proxy events: an event costs
O(the Proxies it concerns), never a scan of the fleet. Health transitions and
timers are the other sources; the health engine and the passes add those.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from egressd.control.queue import WorkQueue
from egressd.kube.informer import Informer
from egressd.kube.resources import PODS, object_key
from egressd.providers import cluster_selector, label_value
from egressd.providers.config import KubernetesConfig, ProvidersConfig
from egressd.providers.kubernetes import instance_state
from egressd.providers.naming import PROXY_UID

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


# --- the kubernetes provider's Pods --------------------------------------------


def instance_informers(config: ProvidersConfig, *, cluster_name: str) -> list[Informer]:
    """One Pod informer per namespace a kubernetes provider creates Pods in, selecting
    this cluster's instances by their GC labels (none without a kubernetes provider)."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(cluster_selector(cluster_name).items()))
    namespaces = sorted({entry.settings.namespace for entry in config.providers
                         if isinstance(entry.settings, KubernetesConfig)})
    return [Informer(PODS, namespace=ns, label_selector=selector) for ns in namespaces]


class OwnerIndex:
    """The GC label value of each Proxy's uid → its key, kept from Proxy events."""

    def __init__(self) -> None:
        self._by_uid: dict[str, str] = {}

    def seen(self, obj: Obj) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        if isinstance(uid, str) and uid:
            self._by_uid[label_value(uid)] = object_key(obj)

    def gone(self, obj: Obj) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        if isinstance(uid, str) and uid:
            self._by_uid.pop(label_value(uid), None)

    def owner(self, instance: Obj) -> str | None:
        """The key of the Proxy whose instance this is, if that Proxy is cached."""
        labels = (instance.get("metadata") or {}).get("labels") or {}
        uid = labels.get(PROXY_UID)
        return self._by_uid.get(uid) if isinstance(uid, str) else None


def instance_moved(old: Obj, new: Obj) -> bool:
    """Whether a Pod update changes what the provider reports for it (state or IP)."""
    def view(pod: Obj) -> tuple[object, object]:
        return instance_state(pod), (pod.get("status") or {}).get("podIP")

    return view(old) != view(new)


def feed_instances(queue: WorkQueue[str], *, proxies: Informer,
                   instances: Iterable[Informer]) -> None:
    """Register the handlers that enqueue a Proxy when its Pod moves or goes (once per
    process, before the informers run). A Pod's add is the reconciler's own create."""
    owners = OwnerIndex()

    def enqueue_owner(pod: Obj) -> None:
        key = owners.owner(pod)
        if key is not None:
            queue.add(key)

    def pod_updated(old: Obj, new: Obj) -> None:
        if instance_moved(old, new):
            enqueue_owner(new)

    proxies.add_handler(on_add=owners.seen, on_update=lambda _old, new: owners.seen(new),
                        on_delete=owners.gone)
    for informer in instances:
        informer.add_handler(on_update=pod_updated, on_delete=enqueue_owner)
