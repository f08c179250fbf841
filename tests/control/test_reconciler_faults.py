"""The reconciler when its provider or its own configuration fails: a delete that fails
during deletion, a provider's Retry-After, and a daemon configured without the Proxy's
provider (a condition another daemon clears, never a latch). Real peers as in
test_reconciler.py: the fake API server and the real kubernetes provider."""

from __future__ import annotations

import attrs
import pytest
import trio

from egressd.kube.client import RetryPolicy
from egressd.kube.config import KubeConfig
from egressd.kube.errors import NotFound
from egressd.kube.resources import PODS, PROXIES
from egressd.model.constants import FINALIZER
from egressd.sandbox.apiserver import FakeApiServer
from tests.control.world import (
    NS,
    POD_NS,
    TEST_SETTINGS,
    condition,
    managed_spec,
    open_world,
    phase,
    pod_of,
)


def has_pod(obj: dict[str, object]) -> bool:
    status = obj.get("status")
    return isinstance(status, dict) and bool(status.get("providerID"))


def provisioned_reason(obj: dict[str, object]) -> str | None:
    return (condition(obj, "Provisioned") or {}).get("reason")


async def test_failed_instance_delete_keeps_the_finalizer_and_retries(
        apiserver: FakeApiServer, kube_config: KubeConfig) -> None:
    async with open_world(apiserver, kube_config) as world:
        with trio.fail_after(10):
            await world.create_proxy("dl", managed_spec())
            proxy = await world.wait_proxy("dl", has_pod)
            pod = pod_of(proxy)
            await world.wait_pod(pod)
            refusal = apiserver.faults.fail_next(10_000, code=403, method="DELETE",
                                                 resource="pods", message="pods is forbidden")
            await world.client.delete(PROXIES, "dl", namespace=NS)
            # Refused, then tried again (backoff), and the object is kept all along.
            await world.until(lambda: refusal.hits >= 2 or world.proxies.get(f"{NS}/dl") is None)
            proxy = world.proxies.get(f"{NS}/dl")
            assert proxy is not None and proxy["metadata"].get("deletionTimestamp")
            assert FINALIZER in proxy["metadata"]["finalizers"]
            assert phase(proxy) == "Deleting"
            assert world.pods.get(f"{POD_NS}/{pod}") is not None
            assert world.events("DeleteFailed")
            assert not world.events("Deleted")

            apiserver.faults.clear()  # the delete works again: the next retry finishes
            await world.wait_gone(world.proxies, f"{NS}/dl")
            with pytest.raises(NotFound):
                await world.client.get(PODS, pod, namespace=POD_NS)
            assert world.events("Deleted")


async def test_a_providers_retry_after_sets_the_requeue_delay(
        apiserver: FakeApiServer, kube_config: KubeConfig) -> None:
    # One try per client call, so the 429 reaches the provider (Transient, retry_after=1)
    # instead of being retried by the client.
    async with open_world(apiserver, kube_config, retry=RetryPolicy(attempts=1)) as world:
        with trio.fail_after(10):
            apiserver.faults.fail_next(1, code=429, retry_after=1, method="POST",
                                       resource="pods")
            await world.create_proxy("ra", managed_spec())
            await world.until(lambda: bool(world.events("ProviderError")))
            await world.until(lambda: f"{NS}/ra" in world.queue.waiting())
            due = world.queue.waiting()[f"{NS}/ra"] - trio.current_time()
            # The per-key backoff alone would be 0.05 s (the world's base delay).
            assert 0.5 < due <= 1.0
            await world.wait_proxy("ra", has_pod)


async def test_daemon_without_the_provider_marks_a_condition_another_daemon_clears(
        apiserver: FakeApiServer, kube_config: KubeConfig) -> None:
    with trio.fail_after(10):
        async with open_world(apiserver, kube_config, providers=()) as lacking:
            await lacking.create_proxy("nc", managed_spec())
            proxy = await lacking.wait_proxy(
                "nc", lambda o: provisioned_reason(o) == "ProviderNotConfigured")
            generation = proxy["metadata"]["generation"]
            assert phase(proxy) == "Failed"
            assert "no provider named 'k8s'" in condition(proxy, "Provisioned")["message"]
            assert lacking.events("ProviderNotConfigured")
            assert not lacking.pods.items()
            # Not a latch: the pass scheduled its own re-evaluation.
            await lacking.until(lambda: f"{NS}/nc" in lacking.queue.waiting())

        # A daemon with the provider: its first term's first pass, no spec edit.
        async with open_world(apiserver, kube_config) as configured:
            proxy = await configured.wait_proxy("nc", has_pod)
            await configured.wait_pod(pod_of(proxy))
            await configured.kubelet_runs(pod_of(proxy), "10.0.2.1")
            proxy = await configured.wait_proxy("nc", lambda o: phase(o) == "Ready")
            assert proxy["metadata"]["generation"] == generation
            assert provisioned_reason(proxy) == "Running"


async def test_permission_refused_is_not_latched(apiserver: FakeApiServer,
                                                 kube_config: KubeConfig) -> None:
    # RBAC refusing the Pod create is this daemon's configuration, fixable while it
    # runs: a condition, looked at again at the resync, not PermanentFailure.
    settings = attrs.evolve(TEST_SETTINGS, ready_resync=0.2)
    async with open_world(apiserver, kube_config, settings=settings) as world:
        with trio.fail_after(10):
            apiserver.faults.fail_next(1, code=403, method="POST", resource="pods",
                                       message='pods "x" is forbidden: User cannot create')
            await world.create_proxy("rb", managed_spec())
            proxy = await world.wait_proxy(
                "rb", lambda o: provisioned_reason(o) == "ProviderNotConfigured")
            assert phase(proxy) == "Failed"
            generation = proxy["metadata"]["generation"]
            proxy = await world.wait_proxy("rb", has_pod)
            assert proxy["metadata"]["generation"] == generation
            assert phase(proxy) == "Provisioning"
