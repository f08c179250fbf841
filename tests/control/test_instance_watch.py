"""The kubernetes provider's Pods feed the work queue (issue 11 item 14): a Pod that
fails or disappears is replaced at once, not at the resync or after the health
verdict flips. The fake API server, the real kubernetes provider and the daemon's own
Pod informers (`instance_informers`, selected by the GC labels); the ready resync (30 s)
is beyond every deadline here and the probes never fail, so only a Pod event can bring
the pass."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from egressd.control.feed import OwnerIndex, instance_informers, instance_moved
from egressd.kube.config import KubeConfig
from egressd.kube.resources import PODS
from egressd.providers.config import (
    GcpConfig,
    KubernetesConfig,
    ProviderConfig,
    ProvidersConfig,
)
from egressd.sandbox.apiserver import FakeApiServer
from tests.control.world import (
    POD_NS,
    TEST_SETTINGS,
    World,
    managed_spec,
    open_world,
    phase,
    pod_of,
)


def has_pod(obj: dict[str, Any]) -> bool:
    return bool((obj.get("status") or {}).get("providerID"))


async def running(world: World, name: str, ip: str) -> tuple[str, dict[str, Any]]:
    """A Managed proxy made Ready at `ip`: its Pod's name and the Pod."""
    await world.create_proxy(name, managed_spec())
    proxy = await world.wait_proxy(name, has_pod)
    pod_name = pod_of(proxy)
    pod = await world.wait_pod(pod_name)
    await world.kubelet_runs(pod_name, ip)
    await world.wait_proxy(name, lambda o: phase(o) == "Ready")
    return pod_name, pod


async def test_a_deleted_pod_is_replaced_at_once(apiserver: FakeApiServer,
                                                 kube_config: KubeConfig) -> None:
    async with open_world(apiserver, kube_config) as world:
        with trio.fail_after(10):
            name, pod = await running(world, "w1", "10.0.3.1")
            await world.client.delete(PODS, name, namespace=POD_NS)
            await world.wait_pod(name, lambda p: p["metadata"]["uid"] != pod["metadata"]["uid"])
            assert world.events("InstanceMissing")
            proxy = await world.wait_proxy("w1", lambda o: "ip" not in o["status"])
            assert phase(proxy) == "Provisioning"


async def test_a_failed_pod_is_replaced_at_once(apiserver: FakeApiServer,
                                                kube_config: KubeConfig) -> None:
    async with open_world(apiserver, kube_config) as world:
        with trio.fail_after(10):
            name, pod = await running(world, "w2", "10.0.3.2")
            await world.client.patch_status(PODS, name, {"status": {"phase": "Failed"}},
                                            namespace=POD_NS)
            await world.wait_pod(name, lambda p: p["metadata"]["uid"] != pod["metadata"]["uid"])
            assert world.events("InstanceStopped")
            proxy = await world.wait_proxy("w2", lambda o: "ip" not in o["status"])
            assert phase(proxy) == "Provisioning"


async def test_a_pod_that_starts_running_is_published_without_the_poll(
        apiserver: FakeApiServer, kube_config: KubeConfig) -> None:
    # A provisioning poll beyond the deadline: the Pod's Running event brings the pass.
    settings = attrs.evolve(TEST_SETTINGS, provisioning_poll=30.0)
    async with open_world(apiserver, kube_config, settings=settings) as world:
        with trio.fail_after(10):
            await world.create_proxy("w3", managed_spec())
            proxy = await world.wait_proxy("w3", has_pod)
            await world.wait_pod(pod_of(proxy))
            await world.kubelet_runs(pod_of(proxy), "10.0.3.3")
            proxy = await world.wait_proxy("w3", lambda o: phase(o) == "Ready")
            assert proxy["status"]["ip"] == "10.0.3.3"


def pod(uid: str, *, phase: str = "Running", ip: str | None = "10.0.0.1",
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "px-a", "namespace": POD_NS,
                            "labels": {"egressd-proxy-uid": uid}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


def test_only_what_the_provider_reports_moves_an_instance() -> None:
    base = pod("u")
    assert not instance_moved(base, pod("u"))
    assert not instance_moved(base, {**pod("u"), "spec": {"nodeName": "n2"}})
    assert instance_moved(base, pod("u", phase="Failed"))
    assert instance_moved(base, pod("u", ip="10.0.0.2"))
    assert instance_moved(base, pod("u", deleting=True))
    assert instance_moved(pod("u", phase="Pending", ip=None), base)


def test_owner_index_follows_proxies_by_the_uid_label() -> None:
    owners = OwnerIndex()
    proxy = {"metadata": {"name": "p", "namespace": "ns", "uid": "ABC-1"}}
    owners.seen(proxy)
    # The label holds the uid as a label value (lower case).
    assert owners.owner(pod("abc-1")) == "ns/p"
    assert owners.owner(pod("other")) is None
    assert owners.owner({"metadata": {"name": "x"}}) is None
    owners.gone(proxy)
    assert owners.owner(pod("abc-1")) is None


def test_instance_informers_one_per_kubernetes_namespace() -> None:
    def k8s(name: str, namespace: str) -> ProviderConfig:
        return ProviderConfig(name=name, settings=KubernetesConfig(namespace=namespace,
                                                                   image="i"))

    gcp = ProviderConfig(name="g", settings=GcpConfig(project="p", zone="europe-west1-b",
                                                  machine_type="e2-micro", image="i"))
    informers = instance_informers(
        ProvidersConfig((k8s("a", "px"), k8s("b", "px"), gcp, k8s("c", "other"))),
        cluster_name="Prod.EU")
    assert [(i.resource, i.namespace) for i in informers] == [(PODS, "other"), (PODS, "px")]
    assert {i.label_selector for i in informers} == {
        "egressd-cluster=prod-eu,egressd-managed-by=egressd"}
    assert instance_informers(ProvidersConfig((gcp,)), cluster_name="x") == []
