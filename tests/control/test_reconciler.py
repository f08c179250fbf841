"""The reconciler against real peers: the fake API server, the real kubernetes provider
making Pods in it, and a real health engine with a scripted probe (SPEC §5)."""

from __future__ import annotations

import base64
import random
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from egressd.control.reconciler import Reconciler
from egressd.control.spechash import spec_hash
from egressd.health.engine import HealthEngine
from egressd.health.probe import ProbeResult, ProbeTarget
from egressd.kube.config import KubeConfig
from egressd.kube.errors import NotFound
from egressd.kube.events import EventRecorder
from egressd.kube.resources import PODS, PROXIES, SECRETS
from egressd.metrics import REGISTRY
from egressd.model.constants import FINALIZER, SPEC_HASH_ANNOTATION
from egressd.sandbox.apiserver import FakeApiServer
from tests.control.world import (
    NS,
    POD_NS,
    POD_NS_B,
    PROBE_URL,
    PROVIDER,
    PROVIDER_B,
    TEST_SETTINGS,
    World,
    condition,
    loose_crd,
    managed_spec,
    open_world,
    phase,
    pod_of,
)


@pytest.fixture
async def world(apiserver: FakeApiServer, kube_config: KubeConfig) -> AsyncIterator[World]:
    async with open_world(apiserver, kube_config) as w:
        yield w


def has_pod(obj: dict[str, object]) -> bool:
    status = obj.get("status")
    return isinstance(status, dict) and bool(status.get("providerID"))


def gauge(phase_name: str) -> float:
    return REGISTRY.get_sample_value("egressd_proxies", {"phase": phase_name}) or 0.0


async def test_managed_lifecycle(world: World) -> None:
    with trio.fail_after(10):
        ready_before = gauge("Ready")
        await world.create_proxy("p1", managed_spec())
        proxy = await world.wait_proxy("p1", has_pod)
        assert FINALIZER in proxy["metadata"]["finalizers"]
        assert phase(proxy) == "Provisioning"
        provisioned = condition(proxy, "Provisioned")
        assert provisioned is not None and provisioned["status"] == "False"
        pod_name = pod_of(proxy)
        uid = proxy["metadata"]["uid"]
        want_hash = spec_hash(provider=PROVIDER, placement=None,
                              cloud_init="#cloud-config\npackages: [squid]\n",
                              port=3128)
        assert proxy["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == want_hash
        pod = await world.wait_pod(pod_name)
        assert pod["metadata"]["labels"]["egressd-proxy-uid"] == uid
        assert pod["metadata"]["labels"]["egressd-cluster"] == "test"
        assert pod["metadata"]["labels"]["egressd-proxy"] == "default_p1"
        # Still Pending: the poll keeps it Provisioning, no address, no probe.
        assert "default/p1" not in world.engine

        await world.kubelet_runs(pod_name, "10.0.0.7")
        proxy = await world.wait_proxy("p1", lambda o: phase(o) == "Ready")
        status = proxy["status"]
        assert (status["ip"], status["host"], status["port"]) == ("10.0.0.7", "10.0.0.7", 3128)
        assert status["latencyMs"] == 12 and status["lastHealthCheckTime"]
        assert status["observedGeneration"] == proxy["metadata"]["generation"]
        healthy = condition(proxy, "Healthy")
        assert healthy is not None
        assert (healthy["status"], healthy["reason"], healthy["message"]) == (
            "True", "ProbeSucceeded", "status 204")
        assert condition(proxy, "Provisioned")["status"] == "True"
        await world.until(lambda: gauge("Ready") == ready_before + 1)
        assert world.events("Created")

        conflicts = REGISTRY.get_sample_value("egressd_reconciles_total",
                                              {"result": "conflict"}) or 0.0
        await world.client.delete(PROXIES, "p1", namespace=NS)
        await world.wait_gone(world.proxies, "default/p1")
        with pytest.raises(NotFound):
            await world.client.get(PODS, pod_name, namespace=POD_NS)
        assert world.events("Deleted")
        assert "default/p1" not in world.engine
        # The finalizer patch carried the version the Deleting status write made.
        assert (REGISTRY.get_sample_value("egressd_reconciles_total", {"result": "conflict"})
                or 0.0) == conflicts
        await world.until(lambda: gauge("Ready") == ready_before)


async def test_external_ready_without_finalizer(world: World) -> None:
    with trio.fail_after(10):
        await world.create_proxy("ext", {
            "mode": "External", "endpoint": {"host": "192.0.2.10", "port": 8888},
            "healthCheck": {"probeURL": "https://probe.test/", "intervalSeconds": 5,
                            "timeoutSeconds": 1}})
        proxy = await world.wait_proxy("ext", lambda o: phase(o) == "Ready")
        assert not proxy["metadata"].get("finalizers")
        assert SPEC_HASH_ANNOTATION not in (proxy["metadata"].get("annotations") or {})
        status = proxy["status"]
        assert (status["host"], status["port"]) == ("192.0.2.10", 8888)
        assert "providerID" not in status and "ip" not in status
        provisioned = condition(proxy, "Provisioned")
        assert provisioned is not None and provisioned["reason"] == "External"
        assert not world.pods.items()


async def test_external_unhealthy(world: World) -> None:
    with trio.fail_after(10):
        world.health["192.0.2.11"] = False
        await world.create_proxy("bad", {
            "mode": "External", "endpoint": {"host": "192.0.2.11"},
            "healthCheck": {"probeURL": "https://probe.test/", "intervalSeconds": 5,
                            "timeoutSeconds": 1, "failureThreshold": 1}})
        proxy = await world.wait_proxy("bad", lambda o: phase(o) == "Unhealthy")
        healthy = condition(proxy, "Healthy")
        assert healthy is not None
        assert (healthy["status"], healthy["reason"], healthy["message"]) == (
            "False", "ProbeFailed", "connect refused")
        assert proxy["status"]["port"] == 3128
        assert "latencyMs" not in proxy["status"]


async def test_cloud_init_from_secret(world: World) -> None:
    with trio.fail_after(10):
        await world.create_proxy("s1", managed_spec(
            cloudInit={"secretRef": {"name": "ci", "key": "cloud.yaml"}}))
        proxy = await world.wait_proxy("s1", lambda o: (
            condition(o, "Provisioned") or {}).get("reason") == "CloudInitUnresolved")
        message = condition(proxy, "Provisioned")["message"]
        assert "default/ci" in message and "not found" in message
        assert not world.pods.items()
        # A Secret without the key: still unresolved, now naming the key.
        await world.create_secret("ci", {"other": "x"})
        await world.wait_proxy("s1", lambda o: "has no key 'cloud.yaml'" in (
            condition(o, "Provisioned") or {}).get("message", ""))
        text = "#cloud-config\nruncmd: [echo hi]\n"
        await world.client.merge_patch(
            SECRETS, "ci", {"data": {"cloud.yaml": base64.b64encode(text.encode()).decode()}},
            namespace=NS)
        proxy = await world.wait_proxy("s1", has_pod)
        assert proxy["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == spec_hash(
            provider=PROVIDER, placement=None, cloud_init=text, port=3128)
        # The cloud-init body is never in an event.
        assert all("runcmd" not in e["message"] for e in world.events())


async def test_spec_change_replaces_instance(world: World) -> None:
    with trio.fail_after(10):
        await world.create_proxy("r1", managed_spec())
        proxy = await world.wait_proxy("r1", has_pod)
        old_pod = pod_of(proxy)
        await world.wait_pod(old_pod)
        await world.kubelet_runs(old_pod, "10.0.0.8")
        await world.wait_proxy("r1", lambda o: phase(o) == "Ready")

        await world.client.merge_patch(PROXIES, "r1", {"spec": {"port": 3129}}, namespace=NS)
        proxy = await world.wait_proxy("r1", lambda o: has_pod(o) and pod_of(o) != old_pod)
        new_pod = pod_of(proxy)
        assert phase(proxy) == "Provisioning"
        assert condition(proxy, "Healthy") is None
        assert "latencyMs" not in proxy["status"] and "ip" not in proxy["status"]
        await world.wait_gone(world.pods, f"{POD_NS}/{old_pod}")
        pod = await world.wait_pod(new_pod)
        assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 3129
        assert world.events("Replaced")

        await world.kubelet_runs(new_pod, "10.0.0.9")
        proxy = await world.wait_proxy("r1", lambda o: phase(o) == "Ready")
        assert (proxy["status"]["host"], proxy["status"]["port"]) == ("10.0.0.9", 3129)


async def test_pod_deleted_underneath_is_recreated(apiserver: FakeApiServer,
                                                   kube_config: KubeConfig) -> None:
    # Without Pod events (a provider that cannot be watched), the ready resync finds
    # the loss; test_instance_watch.py has the same loss seen through the Pod watch.
    settings = attrs.evolve(TEST_SETTINGS, ready_resync=0.2)
    async with open_world(apiserver, kube_config, settings=settings,
                          watch_instances=False) as world:
        await pod_deleted_underneath(world)


async def pod_deleted_underneath(world: World) -> None:
    with trio.fail_after(10):
        await world.create_proxy("d1", managed_spec())
        proxy = await world.wait_proxy("d1", has_pod)
        name = pod_of(proxy)
        pod = await world.wait_pod(name)
        await world.kubelet_runs(name, "10.0.0.10")
        await world.wait_proxy("d1", lambda o: phase(o) == "Ready")

        await world.client.delete(PODS, name, namespace=POD_NS)
        # Same spec, same deterministic name; a new Pod (new uid).
        await world.wait_pod(name, lambda p: p["metadata"]["uid"] != pod["metadata"]["uid"])
        proxy = await world.wait_proxy("d1", lambda o: phase(o) == "Provisioning" and has_pod(o))
        assert pod_of(proxy) == name
        assert world.events("InstanceMissing")


async def test_terminated_pod_is_replaced(world: World) -> None:
    with trio.fail_after(10):
        await world.create_proxy("t1", managed_spec())
        proxy = await world.wait_proxy("t1", has_pod)
        name = pod_of(proxy)
        pod = await world.wait_pod(name)
        await world.client.patch_status(PODS, name, {"status": {"phase": "Failed"}},
                                        namespace=POD_NS)
        await world.wait_pod(name, lambda p: p["metadata"]["uid"] != pod["metadata"]["uid"])
        assert world.events("InstanceStopped")


async def test_permanent_failure_latches_until_generation_moves(world: World) -> None:
    with trio.fail_after(10):
        world.server.faults.fail_next(1, code=422, method="POST", resource="pods",
                                      message="pod is invalid")
        await world.create_proxy("f1", managed_spec())
        proxy = await world.wait_proxy("f1", lambda o: phase(o) == "Failed")
        provisioned = condition(proxy, "Provisioned")
        assert provisioned is not None and provisioned["reason"] == "PermanentFailure"
        assert provisioned["observedGeneration"] == proxy["metadata"]["generation"]
        assert world.events("Failed")
        # No retry is scheduled, and a later pass (a resync) sees the latch.
        await world.reconciler.reconcile("default/f1")
        await world.until(lambda: not world.queue.processing() and not len(world.queue))
        assert "default/f1" not in world.queue.waiting()
        assert not world.pods.items()

        await world.client.merge_patch(PROXIES, "f1", {"spec": {"attributes": {"a": "b"}}},
                                       namespace=NS)
        proxy = await world.wait_proxy("f1", has_pod)
        assert phase(proxy) == "Provisioning"


async def test_unknown_provider_is_failed(world: World) -> None:
    with trio.fail_after(10):
        await world.create_proxy("u1", managed_spec(provider="nope"))
        proxy = await world.wait_proxy("u1", lambda o: phase(o) == "Failed")
        assert "no provider named 'nope'" in condition(proxy, "Provisioned")["message"]


async def test_status_written_only_when_changed_and_never_cooldowns(world: World) -> None:
    with trio.fail_after(10):
        await world.create_proxy("c1", managed_spec())
        proxy = await world.wait_proxy("c1", has_pod)
        name = pod_of(proxy)
        await world.wait_pod(name)
        await world.kubelet_runs(name, "10.0.0.11")
        await world.wait_proxy("c1", lambda o: phase(o) == "Ready")
        await world.until(lambda: not world.queue.processing() and not len(world.queue))
        writes = len(world.status_patches("c1"))
        for _ in range(3):
            await world.reconciler.reconcile("default/c1")
        assert len(world.status_patches("c1")) == writes

        # The lease layer's cooldown: a status write of its own.
        until = "2099-01-01T00:00:00Z"
        await world.client.patch_status(PROXIES, "c1", {"status": {"cooldowns": {
            "example.org": {"until": until, "reason": "rate_limited"}}}}, namespace=NS)
        await world.wait_proxy("c1", lambda o: "cooldowns" in o["status"])
        # A real change (a new Pod IP) makes the reconciler write again.
        await world.kubelet_runs(name, "10.0.0.12")
        world.queue.add("default/c1")  # a resync (the Pod's event enqueues it too)
        proxy = await world.wait_proxy("c1", lambda o: o["status"].get("ip") == "10.0.0.12"
                                       and phase(o) == "Ready")
        ours = [b for b in world.status_patches("c1") if "phase" in b["status"]]
        assert len(ours) > writes
        assert all("cooldowns" not in body["status"] for body in ours)
        assert proxy["status"]["cooldowns"] == {
            "example.org": {"until": until, "reason": "rate_limited"}}


async def test_quota_retries_after_quota_retry(apiserver: FakeApiServer,
                                               kube_config: KubeConfig) -> None:
    settings = attrs.evolve(TEST_SETTINGS, quota_retry=30.0)
    async with open_world(apiserver, kube_config, settings=settings) as world:
        with trio.fail_after(10):
            apiserver.faults.fail_next(1, code=403, method="POST", resource="pods",
                                       message='pods "x" is forbidden: exceeded quota: q')
            await world.create_proxy("q1", managed_spec())
            await world.wait_proxy("q1", lambda o: (
                condition(o, "Provisioned") or {}).get("reason") == "QuotaExceeded")
            await world.until(lambda: "default/q1" in world.queue.waiting())
            due = world.queue.waiting()["default/q1"] - trio.current_time()
            assert 25.0 < due <= 30.0
            assert world.events("QuotaExceeded")
            assert not world.pods.items()


async def test_quota_then_created(apiserver: FakeApiServer, kube_config: KubeConfig) -> None:
    settings = attrs.evolve(TEST_SETTINGS, quota_retry=0.2)
    async with open_world(apiserver, kube_config, settings=settings) as world:
        with trio.fail_after(10):
            apiserver.faults.fail_next(1, code=403, method="POST", resource="pods",
                                       message="exceeded quota: q")
            await world.create_proxy("q2", managed_spec())
            proxy = await world.wait_proxy("q2", has_pod)
            assert phase(proxy) == "Provisioning"


async def test_worker_cancelled_mid_key_requeues_it(apiserver: FakeApiServer,
                                                    kube_config: KubeConfig) -> None:
    held = trio.Event()

    async def hold(request: httpx.Request) -> None:
        if request.method == "POST" and request.url.path.endswith("/pods"):
            held.set()
            await trio.sleep_forever()  # a create that never answers

    with trio.fail_after(10):
        async with open_world(apiserver, kube_config, hold=hold) as world:
            await world.create_proxy("x1", managed_spec())
            await held.wait()
            assert "default/x1" in world.queue.processing()
            # Leadership lost: only the reconciler's scope is cancelled.
            world.reconciler_scope.cancel()
            await world.until(lambda: "default/x1" not in world.queue.processing())
            assert len(world.queue) == 1
            assert world.queue.get_nowait() == "default/x1"


async def ready_managed(world: World, name: str, ip: str) -> dict[str, Any]:
    """Create a Managed proxy, run its Pod at `ip`; the proxy once Ready."""
    await world.create_proxy(name, managed_spec())
    proxy = await world.wait_proxy(name, has_pod)
    await world.wait_pod(pod_of(proxy))
    await world.kubelet_runs(pod_of(proxy), ip)
    return await world.wait_proxy(name, lambda o: phase(o) == "Ready")


async def test_unhealthy_proxy_whose_pod_is_gone_is_recreated(
        apiserver: FakeApiServer, kube_config: KubeConfig) -> None:
    # A 2 s probe interval (the CRD's minimum is 5) so the failing probe comes soon;
    # the ready resync (30 s) is beyond the deadline and Pod events are off: the
    # health transition alone brings the pass that finds the Pod gone.
    apiserver.install_crd(loose_crd(intervalSeconds=2))
    async with open_world(apiserver, kube_config, watch_instances=False) as world:
        with trio.fail_after(10):
            await world.create_proxy("h1", managed_spec(healthCheck={
                "probeURL": PROBE_URL, "intervalSeconds": 2, "timeoutSeconds": 1,
                "failureThreshold": 1}))
            proxy = await world.wait_proxy("h1", has_pod)
            name = pod_of(proxy)
            pod = await world.wait_pod(name)
            await world.kubelet_runs(name, "10.0.1.1")
            await world.wait_proxy("h1", lambda o: phase(o) == "Ready")

            world.health["10.0.1.1"] = False
            await world.client.delete(PODS, name, namespace=POD_NS)
            await world.wait_pod(name, lambda p: p["metadata"]["uid"] != pod["metadata"]["uid"])
            assert world.events("InstanceMissing")
            proxy = await world.wait_proxy("h1", lambda o: has_pod(o) and "ip" not in o["status"])
            assert phase(proxy) == "Provisioning" and condition(proxy, "Healthy") is None


async def test_invalid_health_check(apiserver: FakeApiServer, kube_config: KubeConfig) -> None:
    # Unreachable through today's CRD; a cluster with an older, looser one can hold it.
    apiserver.install_crd(loose_crd(failureThreshold=0))
    async with open_world(apiserver, kube_config) as world:
        with trio.fail_after(10):
            await world.create_proxy("ih", {
                "mode": "External", "endpoint": {"host": "192.0.2.20"},
                "healthCheck": {"probeURL": PROBE_URL, "intervalSeconds": 5,
                                "timeoutSeconds": 1, "failureThreshold": 0}})
            proxy = await world.wait_proxy("ih", lambda o: phase(o) == "Unhealthy")
            healthy = condition(proxy, "Healthy")
            assert healthy is not None
            assert (healthy["status"], healthy["reason"]) == ("False", "InvalidHealthCheck")
            assert "failure_threshold" in healthy["message"]
            assert "latencyMs" not in proxy["status"]
            assert "default/ih" not in world.engine
            # Fixed: probed at once (no seed from the invalid verdict), then Ready.
            await world.client.merge_patch(PROXIES, "ih", {"spec": {"healthCheck": {
                "failureThreshold": 1}}}, namespace=NS)
            proxy = await world.wait_proxy("ih", lambda o: phase(o) == "Ready")
            assert condition(proxy, "Healthy")["reason"] == "ProbeSucceeded"


async def test_new_term_seeds_the_engine_from_status(world: World) -> None:
    with trio.fail_after(10):
        await world.create_proxy("sd", {
            "mode": "External", "endpoint": {"host": "192.0.2.30"},
            "healthCheck": {"probeURL": PROBE_URL, "intervalSeconds": 5, "timeoutSeconds": 1}})
        proxy = await world.wait_proxy("sd", lambda o: phase(o) == "Ready")
        await world.until(lambda: not world.queue.processing() and not len(world.queue))
        world.reconciler_scope.cancel()  # the term ends
        writes = len(world.status_patches("sd"))

        probes: list[str] = []

        async def probe(target: ProbeTarget) -> ProbeResult:
            probes.append(target.key)
            return ProbeResult(True, 0.012, "status 204")

        # Random(0) puts the seeded first probe 4.2 s into the 5 s interval.
        engine = HealthEngine(probe, on_change=world.queue.add, concurrency=4, tick=0.02,
                              rng=random.Random(0))
        reconciler = Reconciler(client=world.client, proxies=world.proxies,
                                secrets=world.secrets, providers=world.providers,
                                engine=engine, queue=world.queue,
                                events=EventRecorder(world.client), settings=world.settings)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            await nursery.start(reconciler.run)  # enqueues every cached key
            await world.until(lambda: "default/sd" in engine and not world.queue.processing()
                              and not len(world.queue))
            verdict = engine.snapshot("default/sd")
            assert verdict is not None and verdict.healthy and verdict.latency_ms == 12
            assert verdict.checked_at.isoformat().replace("+00:00", "Z") == (
                proxy["status"]["lastHealthCheckTime"])
            assert probes == []  # seeded, not probed at once
            assert len(world.status_patches("sd")) == writes  # nothing changed, nothing written
            assert phase(world.proxies.get("default/sd") or {}) == "Ready"
            nursery.cancel_scope.cancel()


async def test_removed_finalizer_and_annotation_come_back(apiserver: FakeApiServer,
                                                          kube_config: KubeConfig) -> None:
    settings = attrs.evolve(TEST_SETTINGS, ready_resync=0.2)
    async with open_world(apiserver, kube_config, settings=settings) as world:
        with trio.fail_after(10):
            proxy = await ready_managed(world, "ed", "10.0.1.2")
            pod = await world.wait_pod(pod_of(proxy))
            want = proxy["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
            # A user's edit of metadata alone enqueues nothing: the resync sees it.
            await world.client.merge_patch(PROXIES, "ed", {"metadata": {
                "finalizers": None, "annotations": {SPEC_HASH_ANNOTATION: None}}},
                namespace=NS)
            proxy = await world.wait_proxy("ed", lambda o: FINALIZER in (
                o["metadata"].get("finalizers") or ()) and (
                o["metadata"].get("annotations") or {}).get(SPEC_HASH_ANNOTATION) == want)
            # The instance the spec names was kept, not replaced.
            assert pod_of(proxy) == pod["metadata"]["name"]
            assert world.pods.get(f"{POD_NS}/{pod_of(proxy)}")["metadata"]["uid"] == (
                pod["metadata"]["uid"])
            assert not world.events("Replaced")
            assert phase(proxy) == "Ready"


async def test_provider_change_moves_the_instance(world: World) -> None:
    with trio.fail_after(10):
        proxy = await ready_managed(world, "mv", "10.0.1.3")
        old_pod = pod_of(proxy)
        await world.client.merge_patch(PROXIES, "mv", {"spec": {"provider": PROVIDER_B}},
                                       namespace=NS)
        proxy = await world.wait_proxy("mv", lambda o: (o["status"].get("providerID") or "")
                                       .startswith(f"{POD_NS_B}/"))
        await world.wait_gone(world.pods, f"{POD_NS}/{old_pod}")
        new_pod = pod_of(proxy)
        assert new_pod != old_pod
        assert world.events("Replaced")
        await world.wait_pod(new_pod, namespace=POD_NS_B)
        await world.kubelet_runs(new_pod, "10.0.1.4", namespace=POD_NS_B)
        proxy = await world.wait_proxy("mv", lambda o: phase(o) == "Ready")
        assert proxy["status"]["host"] == "10.0.1.4"


async def test_create_waits_for_a_dying_instance_of_the_same_name(world: World) -> None:
    with trio.fail_after(10):
        await world.create_proxy("dy", managed_spec())
        proxy = await world.wait_proxy("dy", has_pod)
        name = pod_of(proxy)
        pod = await world.wait_pod(name)
        # A finalizer keeps the Pod in its deletion, like a real kubelet's grace period.
        await world.client.merge_patch(PODS, name, {"metadata": {"finalizers": ["test/hold"]}},
                                       namespace=POD_NS)
        await world.client.patch_status(PODS, name, {"status": {"phase": "Failed"}},
                                        namespace=POD_NS)
        proxy = await world.wait_proxy("dy", lambda o: "of that name is terminated" in (
            condition(o, "Provisioned") or {}).get("message", ""))
        assert "providerID" not in proxy["status"]
        assert phase(proxy) == "Provisioning"
        # Polled (and asked again to go) without recording the dying Pod or
        # replacing it over and over.
        pod_path = PODS.path(namespace=POD_NS, name=name)
        await world.until(lambda: sum(1 for m, path, _ in world.requests
                                      if m == "DELETE" and path == pod_path) >= 4)
        [stopped] = world.events("InstanceStopped")
        assert stopped["count"] == 1
        assert "providerID" not in (world.proxies.get("default/dy") or {})["status"]

        await world.client.merge_patch(PODS, name, {"metadata": {"finalizers": None}},
                                       namespace=POD_NS)
        await world.wait_pod(name, lambda p: p["metadata"]["uid"] != pod["metadata"]["uid"])
        await world.wait_proxy("dy", has_pod)


async def test_unparsable_status_is_looked_at_again(apiserver: FakeApiServer,
                                                    kube_config: KubeConfig) -> None:
    # A status the model refuses (an older CRD let it in): logged, and the resync
    # finds it once fixed, though a status edit alone enqueues nothing.
    apiserver.install_crd(loose_crd(any_condition_status=True))
    settings = attrs.evolve(TEST_SETTINGS, ready_resync=0.2)
    async with open_world(apiserver, kube_config, settings=settings) as world:
        with trio.fail_after(10):
            spec = {"mode": "External", "endpoint": {"host": "192.0.2.40"},
                    "healthCheck": {"probeURL": PROBE_URL, "intervalSeconds": 5,
                                    "timeoutSeconds": 1}}
            await world.create_proxy("bs", spec)
            await world.wait_proxy("bs", lambda o: phase(o) == "Ready")
            invalid = REGISTRY.get_sample_value("egressd_reconciles_total",
                                                {"result": "invalid"}) or 0.0
            await world.client.patch_status(PROXIES, "bs", {"status": {"phase": None,
                "conditions": [{"type": "Healthy", "status": "Maybe",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
                namespace=NS)
            await world.until(lambda: (REGISTRY.get_sample_value(
                "egressd_reconciles_total", {"result": "invalid"}) or 0.0) > invalid)
            await world.client.patch_status(PROXIES, "bs", {"status": {"conditions": []}},
                                            namespace=NS)
            await world.wait_proxy("bs", lambda o: phase(o) == "Ready")
