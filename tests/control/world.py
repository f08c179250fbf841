"""A reconciler wired to real peers for tests: the fake API server over HTTPS, the real
KubernetesProvider making Pods in it, real informers, queue, event recorder and a
real HealthEngine whose probe function is scripted per proxy host.

A Pod is marked Running the way a kubelet does it: a patch of its status
subresource with `phase: Running` and a `podIP`. Waits are on informer
events (`World.wait_proxy`), never on sleeps.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from egressd.control.feed import feed_instances, feed_queue, instance_informers
from egressd.control.queue import WorkQueue
from egressd.control.reconciler import Reconciler
from egressd.health.engine import HealthEngine
from egressd.health.probe import ProbeResult, ProbeTarget
from egressd.kube.client import KubeClient, RetryPolicy
from egressd.kube.config import KubeConfig
from egressd.kube.errors import AlreadyExists
from egressd.kube.events import EventRecorder
from egressd.kube.informer import Informer
from egressd.kube.resources import NAMESPACES, PODS, PROXIES, SECRETS
from egressd.model.constants import CLOUD_INIT_LABEL
from egressd.providers.config import KubernetesConfig, ProviderConfig, ProvidersConfig
from egressd.providers.kubernetes import KubernetesProvider
from egressd.providers.metrics import MeteredProvider
from egressd.providers.registry import ProviderRegistry
from egressd.sandbox.apiserver import FakeApiServer
from egressd.sandbox.apiserver.crd import proxy_crd
from egressd.settings import Settings
from tests.fixtures.kube import FAST_RETRY, hooked_client

NS = "default"
POD_NS = "egressd-proxies"
PROVIDER = "k8s"
# A second provider of the same type, in its own namespace (a provider change).
POD_NS_B = "egressd-proxies-b"
PROVIDER_B = "k8s-b"
PROBE_URL = "https://probe.test/generate_204"
Obj = dict[str, Any]


def managed_spec(**extra: Any) -> Obj:
    return {"mode": "Managed", "provider": PROVIDER,
            "cloudInit": {"inline": "#cloud-config\npackages: [squid]\n"},
            "healthCheck": {"probeURL": PROBE_URL, "intervalSeconds": 5, "timeoutSeconds": 1,
                            "failureThreshold": 1},
            **extra}


class Pulse:
    """Wakes every waiter on each informer change."""

    def __init__(self, *informers: Informer) -> None:
        self._event = trio.Event()
        for informer in informers:
            informer.add_handler(on_add=lambda _o: self.fire(),
                                 on_update=lambda _o, _n: self.fire(),
                                 on_delete=lambda _o: self.fire())

    def fire(self) -> None:
        event, self._event = self._event, trio.Event()
        event.set()

    async def wait(self) -> None:
        await self._event.wait()


@attrs.define
class World:
    server: FakeApiServer
    client: KubeClient
    settings: Settings
    proxies: Informer
    secrets: Informer
    pods: Informer
    queue: WorkQueue[str]
    engine: HealthEngine
    providers: ProviderRegistry
    reconciler: Reconciler
    pulse: Pulse
    reconciler_scope: trio.CancelScope
    health: dict[str, bool] = attrs.field(factory=dict)
    requests: list[tuple[str, str, Any]] = attrs.field(factory=list)

    async def wait_proxy(self, name: str, pred: Callable[[Obj], bool]) -> Obj:
        """The cached Proxy once `pred` holds for it."""
        while True:
            obj = self.proxies.get(f"{NS}/{name}")
            if obj is not None and pred(obj):
                return obj
            await self.pulse.wait()

    async def wait_gone(self, informer: Informer, key: str) -> None:
        while informer.get(key) is not None:
            await self.pulse.wait()

    async def wait_pod(self, name: str, pred: Callable[[Obj], bool] = lambda _p: True, *,
                       namespace: str = POD_NS) -> Obj:
        while True:
            obj = self.pods.get(f"{namespace}/{name}")
            if obj is not None and pred(obj):
                return obj
            await self.pulse.wait()

    async def until(self, pred: Callable[[], bool]) -> None:
        """For state no informer shows (queue, metrics): re-check on every change."""
        while not pred():
            with trio.move_on_after(0.01):
                await self.pulse.wait()

    async def create_proxy(self, name: str, spec: Obj) -> Obj:
        return await self.client.create(
            PROXIES, {"metadata": {"name": name, "namespace": NS}, "spec": spec}, namespace=NS)

    async def create_secret(self, name: str, data: dict[str, str]) -> Obj:
        return await self.client.create(SECRETS, {
            "metadata": {"name": name, "namespace": NS, "labels": {CLOUD_INIT_LABEL: "true"}},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}},
            namespace=NS)

    async def kubelet_runs(self, pod: str, ip: str, *, namespace: str = POD_NS) -> None:
        await self.client.patch_status(PODS, pod, {"status": {"phase": "Running", "podIP": ip}},
                                       namespace=namespace)

    def status_patches(self, name: str) -> list[Any]:
        path = PROXIES.path(namespace=NS, name=name, subresource="status")
        return [body for method, p, body in self.requests if method == "PATCH" and p == path]

    def events(self, reason: str | None = None) -> list[Obj]:
        found = self.server.list("v1", "Event", namespace=NS)
        return [e for e in found if reason is None or e["reason"] == reason]


def pod_of(proxy: Obj) -> str:
    provider_id: str = proxy["status"]["providerID"]
    return provider_id.partition("/")[2]


def condition(proxy: Obj, type: str) -> Obj | None:
    for cond in (proxy.get("status") or {}).get("conditions") or ():
        if cond["type"] == type:
            return dict(cond)
    return None


def phase(proxy: Obj) -> str | None:
    return (proxy.get("status") or {}).get("phase")


def loose_crd(*, any_condition_status: bool = False, **minimums: int) -> Obj:
    """The Proxy CRD with other `minimum`s for `spec.healthCheck` fields (and, with
    `any_condition_status`, no enum on a condition's status): what a cluster still
    running an older, looser CRD would accept."""
    crd = proxy_crd()
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]["properties"]
        fields = schema["spec"]["properties"]["healthCheck"]["properties"]
        for name, minimum in minimums.items():
            fields[name]["minimum"] = minimum
        if any_condition_status:
            condition = schema["status"]["properties"]["conditions"]["items"]["properties"]
            del condition["status"]["enum"]
    return crd


TEST_SETTINGS = Settings(workers=2, provisioning_poll=0.05, immediate_retry=0.02,
                         ready_resync=30.0, quota_retry=30.0, cluster_name="test")


PROVIDERS = ((PROVIDER, POD_NS), (PROVIDER_B, POD_NS_B))


@asynccontextmanager
async def open_world(server: FakeApiServer, config: KubeConfig, *,
                     settings: Settings = TEST_SETTINGS,
                     hold: Callable[[httpx.Request], Awaitable[None]] | None = None,
                     providers: tuple[str, ...] = (PROVIDER, PROVIDER_B),
                     retry: RetryPolicy = FAST_RETRY,
                     watch_instances: bool = True,
                     ) -> AsyncIterator[World]:
    """Start everything in a nursery; cancelled when the block ends.

    `providers`: the names the daemon's providers config lists (a daemon
    configured without one of them); `retry`: the client's own retries;
    `watch_instances=False`: no Pod events reach the queue (a provider without
    a watch, like gcp: only the resync and health transitions find a loss).
    A world may follow another on the same server (a second daemon).
    """
    requests: list[tuple[str, str, Any]] = []

    async def record(request: httpx.Request) -> None:
        # The client sends its body as a stream (no `request.content`); it can be
        # iterated again, so reading it here leaves what is sent untouched.
        stream = request.stream
        data = b"".join([chunk async for chunk in stream]
                        if isinstance(stream, httpx.AsyncByteStream) else [])
        body = json.loads(data) if data else None
        requests.append((request.method, request.url.path, body))
        if hold is not None:
            await hold(request)

    async with hooked_client(config, on_request=[record], retry=retry) as client, \
            trio.open_nursery() as nursery:
        for namespace in (POD_NS, POD_NS_B):
            with contextlib.suppress(AlreadyExists):
                await client.create(NAMESPACES, {"metadata": {"name": namespace}})
        proxies = Informer(PROXIES)
        secrets = Informer(SECRETS, label_selector=f"{CLOUD_INIT_LABEL}=true")
        pods = Informer(PODS)
        queue: WorkQueue[str] = WorkQueue(base_delay=0.05, max_delay=1.0)
        health: dict[str, bool] = {}

        async def probe(target: ProbeTarget) -> ProbeResult:
            ok = health.get(target.host, True)
            return ProbeResult(ok, 0.012, "status 204" if ok else "connect refused")

        engine = HealthEngine(probe, on_change=queue.add, concurrency=4, tick=0.02)
        config = ProvidersConfig(tuple(
            ProviderConfig(name=name, settings=KubernetesConfig(
                namespace=namespace, image="ubuntu/squid:6.6-24.04_edge"))
            for name, namespace in PROVIDERS if name in providers))
        registry = ProviderRegistry({
            entry.name: MeteredProvider(KubernetesProvider(entry.settings, client=client),
                                        name=entry.name)
            for entry in config.providers if isinstance(entry.settings, KubernetesConfig)})
        # The daemon's own Pod informers (app.py), beside the tests' unfiltered one.
        instances = (instance_informers(config, cluster_name=settings.cluster_name)
                     if watch_instances else [])
        reconciler = Reconciler(client=client, proxies=proxies, secrets=secrets,
                                providers=registry, engine=engine, queue=queue,
                                events=EventRecorder(client), settings=settings)
        reconciler_scope = trio.CancelScope()
        world = World(server=server, reconciler_scope=reconciler_scope, client=client,
                      settings=settings, proxies=proxies,
                      secrets=secrets, pods=pods, queue=queue, engine=engine,
                      providers=registry, reconciler=reconciler,
                      pulse=Pulse(proxies, secrets, pods),
                      health=health, requests=requests)
        feed_queue(queue, proxies=proxies, secrets=secrets)
        feed_instances(queue, proxies=proxies, instances=instances)
        for informer in (proxies, secrets, pods, *instances):
            await nursery.start(informer.run, client)
        await nursery.start(queue.run)
        await nursery.start(engine.run)

        async def run_reconciler(*, task_status: trio.TaskStatus[None]) -> None:
            with reconciler_scope:  # cancelled alone: a lost leadership term
                await reconciler.run(task_status=task_status)

        await nursery.start(run_reconciler)
        yield world
        nursery.cancel_scope.cancel()
