"""Orphan GC (docs/architecture.md): delete instances this cluster made that no Proxy owns any more.

Leader only, every `--gc-interval`, and only after the Proxy cache synced (an
empty cache would make every instance look orphaned). Every provider is
listed with this cluster's labels; an instance older than `min_age` is
deleted when the Proxy UID on its labels has no Proxy, or that Proxy's
`status.providerID` names another instance. The age bound protects an
instance whose providerID write is still in flight (create, then status).
A Proxy with no providerID yet is left to the reconciler, which re-finds its
instance by the deterministic name. With a namespace-restricted cache
(`--namespace`), only instances made for Proxies of that namespace are
candidates: the Proxies of other namespaces are not in the cache, so their
instances would all look orphaned (two such deployments may share a cluster
name, e.g. the default one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import trio

from egressd.kube.informer import Informer
from egressd.metrics import ORPHANS_DELETED
from egressd.providers import Instance, cluster_selector, label_value
from egressd.providers.naming import PROXY, PROXY_UID
from egressd.providers.registry import ProviderRegistry

log = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _owners(proxies: Informer) -> dict[str, Mapping[str, Any]]:
    """GC label value of each cached Proxy's UID → that Proxy (once per GC pass)."""
    owners: dict[str, Mapping[str, Any]] = {}
    for obj in proxies.items():
        uid = (obj.get("metadata") or {}).get("uid")
        if isinstance(uid, str) and uid:
            owners[label_value(uid)] = obj
    return owners


def orphan_reason(instance: Instance, owners: Mapping[str, Mapping[str, Any]], *,
                  namespace: str | None = None) -> str | None:
    """Why `instance` is an orphan, or None if a Proxy still owns it (or may).

    `namespace`: the one namespace the cache holds (None: all). An instance
    whose `egressd-proxy` label does not begin with it belongs to a Proxy
    this cache cannot see, and is never an orphan here.
    """
    uid = instance.labels.get(PROXY_UID)
    if not uid:
        return None  # not attributable: never delete what we cannot account for
    if namespace is not None and not instance.labels.get(PROXY, "").startswith(
            label_value(namespace) + "_"):
        return None
    owner = owners.get(uid)
    if owner is None:
        return "no Proxy has its uid"
    provider_id = (owner.get("status") or {}).get("providerID")
    if provider_id and provider_id != instance.provider_id:
        meta = owner.get("metadata") or {}
        return (f"Proxy {meta.get('namespace')}/{meta.get('name')} uses "
                f"{provider_id} instead")
    return None


async def collect_orphans(
    *, providers: ProviderRegistry, proxies: Informer, cluster_name: str, min_age: float,
    now: Callable[[], datetime] = _utcnow,
) -> int:
    """One GC pass over every provider; returns how many instances it deleted.

    A provider that fails to list or delete is logged and skipped: the next
    pass tries again, and the other providers are still collected.
    """
    owners = _owners(proxies)
    selector = cluster_selector(cluster_name)
    deleted = 0
    for name, provider in providers.items():
        try:
            instances = await provider.list_by_labels(selector)
        except Exception as exc:
            log.warning("orphan GC: listing failed",
                        extra={"provider": name, "error": str(exc)})
            continue
        current = now()
        for instance in instances:
            reason = orphan_reason(instance, owners, namespace=proxies.namespace)
            if reason is None:
                continue
            age = (current - instance.created_at).total_seconds()
            if age < min_age:
                continue
            try:
                await provider.delete(instance.provider_id)
            except Exception as exc:
                log.warning("orphan GC: delete failed",
                            extra={"provider": name, "instance": instance.provider_id,
                                   "error": str(exc)})
                continue
            deleted += 1
            ORPHANS_DELETED.labels(provider=name).inc()
            log.info("orphan deleted", extra={"provider": name,
                                              "instance": instance.provider_id,
                                              "reason": reason, "age": round(age)})
    return deleted


async def run_orphan_gc(
    *, providers: ProviderRegistry, proxies: Informer, cluster_name: str, interval: float,
    min_age: float, now: Callable[[], datetime] = _utcnow,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Collect orphans every `interval` seconds until cancelled, the first pass once
    the Proxy cache has synced. `started()` is called before the first wait."""
    task_status.started()
    await proxies.synced.wait()
    while True:
        await collect_orphans(providers=providers, proxies=proxies, cluster_name=cluster_name,
                              min_age=min_age, now=now)
        await trio.sleep(interval)
