"""Orphan GC against the fake API server and the real kubernetes provider (SPEC §5).

The server's clock is set by the test, so Pod creation times (what the
provider reports as `created_at`) are exact and no test waits 10 minutes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
import trio
import trio.testing

from egressd.control.gc import collect_orphans, run_orphan_gc
from egressd.kube.client import KubeClient
from egressd.kube.informer import Informer
from egressd.kube.resources import NAMESPACES, PODS, PROXIES
from egressd.metrics import REGISTRY
from egressd.providers import CreateRequest, gc_labels
from egressd.providers.config import KubernetesConfig
from egressd.providers.kubernetes import KubernetesProvider
from egressd.providers.metrics import MeteredProvider
from egressd.providers.registry import ProviderRegistry
from egressd.sandbox.apiserver import FakeApiServer
from tests.fixtures.apiserver import API_TOKEN

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POD_NS = "egressd-proxies"
MIN_AGE = 600.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def apiserver(nursery: trio.Nursery, clock: Clock) -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer(token=API_TOKEN, now=clock)
    await nursery.start(server.serve)
    yield server


def deleted(provider: str) -> float:
    return REGISTRY.get_sample_value("egressd_orphans_deleted_total",
                                     {"provider": provider}) or 0.0


async def make_proxy(client: KubeClient, name: str, *, provider_id: str | None) -> str:
    obj = await client.create(PROXIES, {"metadata": {"name": name, "namespace": "default"},
                                        "spec": {"mode": "Managed", "provider": "k8s"}},
                              namespace="default")
    if provider_id:
        await client.patch_status(PROXIES, name, {"status": {"providerID": provider_id}},
                                  namespace="default")
    uid: str = obj["metadata"]["uid"]
    return uid


async def make_pod(provider: KubernetesProvider, name: str, *, uid: str,
                   cluster: str = "test") -> str:
    instance = await provider.create(CreateRequest(
        name=name, labels=gc_labels(cluster=cluster, proxy_uid=uid, namespace="default",
                                    name="whatever")))
    return instance.provider_id


async def test_orphan_gc(nursery: trio.Nursery, kube_client: KubeClient, clock: Clock) -> None:
    with trio.fail_after(10):
        await kube_client.create(NAMESPACES, {"metadata": {"name": POD_NS}})
        provider = KubernetesProvider(
            KubernetesConfig(namespace=POD_NS, image="squid"), client=kube_client)
        registry = ProviderRegistry({"k8s": MeteredProvider(provider, name="k8s")})

        live_uid = await make_proxy(kube_client, "live", provider_id=f"{POD_NS}/px-owned")
        new_uid = await make_proxy(kube_client, "new", provider_id=None)
        # Old enough (exactly min_age at GC time):
        await make_pod(provider, "px-orphan", uid="gone-uid")
        await make_pod(provider, "px-owned", uid=live_uid)
        await make_pod(provider, "px-stale", uid=live_uid)  # its Proxy moved on
        await make_pod(provider, "px-unrecorded", uid=new_uid)  # providerID not written yet
        await make_pod(provider, "px-other-cluster", uid="gone-uid", cluster="other")
        clock.now = T0 + timedelta(minutes=1)
        await make_pod(provider, "px-young", uid="gone-uid-2")

        proxies = Informer(PROXIES)
        before = deleted("k8s")
        gc_now = T0 + timedelta(seconds=MIN_AGE)
        await nursery.start(partial(
            run_orphan_gc, providers=registry, proxies=proxies, cluster_name="test",
            interval=3600.0, min_age=MIN_AGE, now=lambda: gc_now))
        await nursery.start(proxies.run, kube_client)
        while deleted("k8s") < before + 2:
            await trio.testing.wait_all_tasks_blocked()
        pods = {p["metadata"]["name"] for p in (await kube_client.list(
            PODS, namespace=POD_NS)).items}
        assert pods == {"px-owned", "px-unrecorded", "px-other-cluster", "px-young"}

        # The young one is collected once it is old enough.
        removed = await collect_orphans(
            providers=registry, proxies=proxies, cluster_name="test", min_age=MIN_AGE,
            now=lambda: T0 + timedelta(minutes=11))
        assert removed == 1
        assert deleted("k8s") == before + 3


async def test_gc_waits_for_the_cache(nursery: trio.Nursery, kube_client: KubeClient) -> None:
    with trio.fail_after(10):
        await kube_client.create(NAMESPACES, {"metadata": {"name": POD_NS}})
        provider = KubernetesProvider(
            KubernetesConfig(namespace=POD_NS, image="squid"), client=kube_client)
        registry = ProviderRegistry({"k8s": provider})
        uid = await make_proxy(kube_client, "live", provider_id=f"{POD_NS}/px-owned")
        await make_pod(provider, "px-owned", uid=uid)
        await make_pod(provider, "px-orphan", uid="gone-uid")
        proxies = Informer(PROXIES)
        await nursery.start(partial(
            run_orphan_gc, providers=registry, proxies=proxies, cluster_name="test",
            interval=3600.0, min_age=0.0, now=lambda: T0 + timedelta(days=1)))
        # Every task is idle and the cache is empty: an eager GC would have
        # taken px-owned for an orphan by now.
        await trio.testing.wait_all_tasks_blocked()
        names = {p["metadata"]["name"] for p in (await kube_client.list(
            PODS, namespace=POD_NS)).items}
        assert names == {"px-owned", "px-orphan"}
        await nursery.start(proxies.run, kube_client)
        while len((await kube_client.list(PODS, namespace=POD_NS)).items) > 1:
            await trio.testing.wait_all_tasks_blocked()
        assert [p["metadata"]["name"] for p in (await kube_client.list(
            PODS, namespace=POD_NS)).items] == ["px-owned"]


async def test_namespaced_cache_spares_other_namespaces(nursery: trio.Nursery,
                                                        kube_client: KubeClient) -> None:
    # With --namespace the cache holds one namespace's Proxies; an instance made for
    # a Proxy elsewhere (another egressd, maybe the same cluster name) is not ours.
    with trio.fail_after(10):
        await kube_client.create(NAMESPACES, {"metadata": {"name": POD_NS}})
        provider = KubernetesProvider(
            KubernetesConfig(namespace=POD_NS, image="squid"), client=kube_client)
        registry = ProviderRegistry({"k8s": provider})
        for pod, namespace in (("px-mine", "default"), ("px-theirs", "team-b"),
                               ("px-prefix", "default-2")):
            await provider.create(CreateRequest(name=pod, labels=gc_labels(
                cluster="test", proxy_uid="gone-uid", namespace=namespace, name="p")))
        proxies = Informer(PROXIES, namespace="default")
        await nursery.start(proxies.run, kube_client)
        removed = await collect_orphans(
            providers=registry, proxies=proxies, cluster_name="test", min_age=0.0,
            now=lambda: T0 + timedelta(days=1))
        assert removed == 1
        pods = {p["metadata"]["name"] for p in (await kube_client.list(
            PODS, namespace=POD_NS)).items}
        assert pods == {"px-theirs", "px-prefix"}
