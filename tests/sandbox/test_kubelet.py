"""The local kubelet against the fake API server: Pods made by the real kubernetes
provider become real Squid / tinyproxy processes on their own loopback address."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from egressd.health.probe import Prober, ProbeTarget
from egressd.kube.client import KubeClient
from egressd.kube.informer import Informer
from egressd.kube.resources import NAMESPACES, PODS
from egressd.providers import CreateRequest, InstanceState, gc_labels
from egressd.providers.config import KubernetesConfig
from egressd.providers.kubernetes import KubernetesProvider
from egressd.sandbox.kubelet import (
    ADDRESS_SCAN,
    AddressesExhausted,
    AddressPool,
    LocalKubelet,
    allowed_sources,
    open_pooled_proxy,
    pod_port,
)
from egressd.sandbox.localproxy import ProxySoftware
from egressd.sandbox.probe_target import ProbeTargetServer
from tests.sandbox.test_localproxy import installed

NS = "egressd-proxies"
CONFIG = KubernetesConfig(namespace=NS, image="ubuntu/squid:6.6-24.04_edge")


def request(name: str, port: int = 3128) -> CreateRequest:
    return CreateRequest(name=name, port=port, cloud_init="", labels=gc_labels(
        cluster="sandbox", proxy_uid=f"uid-{name}", namespace="default", name=name))


# --- pure parts ----------------------------------------------------------------


def test_addresses_start_at_ten_and_are_never_reused() -> None:
    pool = AddressPool()
    assert [pool.take() for _ in range(3)] == ["127.0.0.10", "127.0.0.11", "127.0.0.12"]
    pool = AddressPool("127.0.0.255")
    assert [pool.take(), pool.take()] == ["127.0.0.255", "127.0.1.0"]
    with pytest.raises(AddressesExhausted):
        AddressPool("127.255.255.255").take()


def test_an_address_whose_port_is_taken_is_skipped() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.77", 0))
        busy.listen()
        port = busy.getsockname()[1]
        pool = AddressPool("127.0.0.77")
        assert pool.take(port=port) == "127.0.0.78"


def test_a_port_taken_on_every_address_is_a_clear_error_not_a_long_scan() -> None:
    """A system squid on *:3128 holds the port on every loopback address."""
    with socket.socket() as everywhere:
        everywhere.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        everywhere.bind(("0.0.0.0", 0))
        everywhere.listen()
        port = everywhere.getsockname()[1]
        pool = AddressPool()
        with pytest.raises(AddressesExhausted, match=rf"port {port} is in use on every "
                                                     r"loopback address .*systemctl"):
            pool.take(port=port)
        assert pool.take() == str(ipaddress.IPv4Address("127.0.0.10") + ADDRESS_SCAN)


class BlindPool(AddressPool):
    """A pool whose check cannot see the listener: another sandbox binding the
    address between our check and our proxy's start."""

    def take(self, *, port: int | None = None) -> str:
        return super().take()


async def test_an_address_taken_before_the_proxy_listens_is_skipped() -> None:
    software = installed("tinyproxy")
    with trio.fail_after(20), socket.socket() as other:
        other.bind(("127.0.0.90", 0))
        other.listen()
        port = other.getsockname()[1]
        async with open_pooled_proxy(software, addresses=BlindPool("127.0.0.90"),
                                     port=port) as proxy:
            assert (proxy.host, proxy.port) == ("127.0.0.91", port)
            assert proxy.pid != os.getpid()


def test_port_and_sources_come_from_the_providers_pod() -> None:
    from egressd.providers.kubernetes import pod_manifest

    pod = pod_manifest(KubernetesConfig(namespace=NS, image="i", allowed_sources=(
        "10.0.0.0/8", "127.0.0.0/8")), request("px-a", port=8888))
    assert pod_port(pod) == 8888
    assert allowed_sources(pod) == ("10.0.0.0/8", "127.0.0.0/8")
    bare = {"spec": {"containers": [{"name": "c"}]}}
    assert pod_port(bare) == 3128
    assert allowed_sources(bare) == ("127.0.0.0/8",)


# --- against the API server ----------------------------------------------------


@attrs.define
class World:
    client: KubeClient
    provider: KubernetesProvider
    kubelet: LocalKubelet
    pods: Informer
    changed: trio.Event
    prober: Prober
    probe_url: str

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Wait for a Pod event after which `predicate()` holds."""
        while not predicate():
            await self.changed.wait()
            self.changed = trio.Event()

    def pod(self, name: str) -> dict[str, Any] | None:
        return self.pods.get(f"{NS}/{name}")


async def _world(kube_client: KubeClient, nursery: trio.Nursery, software: ProxySoftware,
                 tmp_path: Path) -> World:
    await kube_client.create(NAMESPACES, {"metadata": {"name": NS}})
    target = ProbeTargetServer()
    url = await nursery.start(target.serve)
    kubelet = LocalKubelet(kube_client, namespace=NS, software=software,
                           addresses=AddressPool())
    await nursery.start(kubelet.run)
    pods = Informer(PODS, namespace=NS)
    world = World(kube_client, KubernetesProvider(CONFIG, client=kube_client), kubelet, pods,
                  trio.Event(), Prober(ca_file=target.write_ca(str(tmp_path / "ca.pem"))), url)

    def changed(*_: object) -> None:
        world.changed.set()

    pods.add_handler(on_add=changed, on_update=changed, on_delete=changed)
    await nursery.start(pods.run, kube_client)
    return world


@pytest.fixture(params=["squid", "tinyproxy"])
async def world(request: pytest.FixtureRequest, kube_client: KubeClient, nursery: trio.Nursery,
                tmp_path: Path) -> AsyncIterator[World]:
    yield await _world(kube_client, nursery, installed(request.param), tmp_path)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def test_a_pod_becomes_a_proxy_and_deleting_it_stops_the_process(world: World) -> None:
    with trio.fail_after(30):
        created = await world.provider.create(request("px-one"))
        assert created.state is InstanceState.PROVISIONING
        await world.until(lambda: (world.pod("px-one") or {}).get("status", {}).get(
            "phase") == "Running")
        instance = await world.provider.get(created.provider_id)
        assert instance.state is InstanceState.RUNNING
        status = world.pod("px-one")["status"]  # type: ignore[index]
        ready = {c["type"]: c["status"] for c in status["conditions"]}
        assert ready["Ready"] == "True"
        (proxy,) = world.kubelet.proxies.values()
        # 127.0.0.10 unless something else on this machine holds its port 3128.
        assert instance.ip == proxy.host and proxy.host.startswith("127.0.")
        assert proxy.port == 3128
        result = await world.prober.probe(ProbeTarget(key="k", host=proxy.host, port=3128,
                                                      url=world.probe_url, timeout=5))
        assert result.ok, result.reason

        # A second Pod gets another address, on its own port.
        await world.provider.create(request("px-two", port=8000))
        await world.until(lambda: (world.pod("px-two") or {}).get("status", {}).get(
            "phase") == "Running")
        second = world.pod("px-two")["status"]["podIP"]  # type: ignore[index]
        assert second != proxy.host
        assert world.kubelet.proxies[f"{NS}/px-two"].port == 8000

        await world.provider.delete(created.provider_id)
        await world.until(lambda: world.pod("px-one") is None)
        await proxy.stopped.wait()
        assert not _alive(proxy.pid)
        # (Not "the port refuses": once free, another sandbox or test process
        # on this machine may rightly start a proxy there.)
        assert list(world.kubelet.proxies) == [f"{NS}/px-two"]


async def test_a_dead_process_fails_its_pod(world: World) -> None:
    with trio.fail_after(30):
        created = await world.provider.create(request("px-dies"))
        await world.until(lambda: (world.pod("px-dies") or {}).get("status", {}).get(
            "phase") == "Running")
        (proxy,) = world.kubelet.proxies.values()
        os.kill(proxy.pid, signal.SIGKILL)
        await world.until(lambda: (world.pod("px-dies") or {}).get("status", {}).get(
            "phase") == "Failed")
        assert "exited" in world.pod("px-dies")["status"]["message"]  # type: ignore[index]
        assert (await world.provider.get(created.provider_id)).state is (
            InstanceState.TERMINATED)
        assert world.kubelet.proxies == {}


async def test_a_proxy_that_cannot_start_fails_its_pod(kube_client: KubeClient,
                                                       nursery: trio.Nursery,
                                                       tmp_path: Path) -> None:
    broken = ProxySoftware(kind="tinyproxy", binary="/bin/false")
    with trio.fail_after(30):
        world = await _world(kube_client, nursery, broken, tmp_path)
        await world.provider.create(request("px-broken"))
        await world.until(lambda: (world.pod("px-broken") or {}).get("status", {}).get(
            "phase") == "Failed")
        assert "exited with code 1" in world.pod("px-broken")["status"]["message"]  # type: ignore[index]
