"""What feeds the work queue: Proxy events that need a pass, and Secret events mapped to
the Proxies that reference them through an index (no scan of the fleet)."""

from __future__ import annotations

from functools import partial

import trio

from egressd.control.feed import SecretRefIndex, feed_queue, needs_pass, secret_ref_key
from egressd.control.queue import WorkQueue
from egressd.kube.client import KubeClient
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES, SECRETS
from egressd.model.constants import CLOUD_INIT_LABEL


def proxy(name: str, *, secret: str | None = None, generation: int = 1,
          deleting: bool = False, rv: str = "1") -> dict[str, object]:
    spec: dict[str, object] = {"mode": "Managed", "provider": "k8s"}
    if secret:
        spec["cloudInit"] = {"secretRef": {"name": secret}}
    meta: dict[str, object] = {"name": name, "namespace": "ns", "generation": generation,
                               "resourceVersion": rv}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": spec}


def test_secret_ref_key() -> None:
    assert secret_ref_key(proxy("a", secret="ci")) == "ns/ci"
    assert secret_ref_key(proxy("a")) is None
    assert secret_ref_key({"metadata": {"name": "a"}, "spec": {"cloudInit": "junk"}}) is None


def test_index_follows_changes() -> None:
    index = SecretRefIndex()
    index.set("ns/a", "ns/ci")
    index.set("ns/b", "ns/ci")
    index.set("ns/c", "ns/other")
    assert index.referrers("ns/ci") == {"ns/a", "ns/b"}
    index.set("ns/a", "ns/other")
    assert index.referrers("ns/ci") == {"ns/b"}
    assert index.referrers("ns/other") == {"ns/a", "ns/c"}
    index.set("ns/b", None)
    assert index.referrers("ns/ci") == frozenset()
    assert index.referrers("ns/missing") == frozenset()


def test_needs_pass() -> None:
    base = proxy("a")
    assert not needs_pass(base, proxy("a", rv="2"))  # a status or metadata write
    assert needs_pass(base, proxy("a", generation=2, rv="2"))
    assert needs_pass(base, proxy("a", deleting=True, rv="2"))


async def test_feed_queue_maps_secret_events(nursery: trio.Nursery,
                                             kube_client: KubeClient) -> None:
    with trio.fail_after(10):
        queue: WorkQueue[str] = WorkQueue()
        proxies = Informer(PROXIES, namespace="default")
        secrets = Informer(SECRETS, label_selector=f"{CLOUD_INIT_LABEL}=true")
        feed_queue(queue, proxies=proxies, secrets=secrets)
        await nursery.start(partial(proxies.run, kube_client))
        await nursery.start(partial(secrets.run, kube_client))
        for name, ref in (("a", "ci"), ("b", None), ("c", "ci")):
            spec: dict[str, object] = {"mode": "Managed", "provider": "k8s"}
            if ref:
                spec["cloudInit"] = {"secretRef": {"name": ref}}
            await kube_client.create(PROXIES, {"metadata": {"name": name}, "spec": spec},
                                     namespace="default")
        got: set[str] = set()
        while got != {"default/a", "default/b", "default/c"}:
            key = await queue.get()
            got.add(key)
            queue.done(key)
        await kube_client.create(SECRETS, {"metadata": {
            "name": "ci", "labels": {CLOUD_INIT_LABEL: "true"}}, "data": {}},
            namespace="default")
        got.clear()
        while len(got) < 2:
            key = await queue.get()
            got.add(key)
            queue.done(key)
        assert got == {"default/a", "default/c"}
        assert len(queue) == 0
