"""The sandbox's stand-in for a kubelet: Pods become real proxy processes on loopback.

    kubelet = LocalKubelet(client, namespace="egressd-proxies", software=software,
                           addresses=AddressPool())
    await nursery.start(kubelet.run)

It watches the Pods of one namespace through the API (an Informer). Each new
Pod gets its own loopback address (127.0.0.10 upward, never reused, so an
address always names one Pod; one whose port another program holds is
skipped) and a Squid or tinyproxy there on the Pod's container port,
configured for the sources the Pod's SQUID_CONF allows. Once the process
listens the Pod's status becomes what a kubelet writes (phase Running,
podIP, Ready conditions). Deleting the Pod, or marking it for deletion,
stops the process. A process that dies by itself
makes its Pod `Failed` (the kubernetes provider reads that as Terminated,
and the reconciler replaces the instance) instead of being restarted in
place: the failure stays visible.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import trio

from egressd import timestamps
from egressd.backoff import Backoff, Retries
from egressd.errors import EgressdError
from egressd.kube.client import KubeClient
from egressd.kube.errors import ApiError, ApiUnavailable, NotFound
from egressd.kube.informer import Informer
from egressd.kube.resources import PODS, object_key
from egressd.providers.kubernetes import CONF_ENV
from egressd.sandbox.localproxy import (
    LOOPBACK_SOURCES,
    AddressInUse,
    LocalProxy,
    ProxySoftware,
    ProxyStartFailed,
    open_local_proxy,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]

FIRST_ADDRESS = "127.0.0.10"
LAST_ADDRESS = ipaddress.IPv4Address("127.255.255.254")
DEFAULT_PORT = 3128
ADDRESS_SCAN = 256
"""Addresses `take` tries for a free port before it gives up: a program listening
on the port on every address (a system squid on *:3128) would otherwise make it
try all sixteen million."""
START_ATTEMPTS = 8
"""Addresses tried when another process takes one between our check and our start."""
_ACL_SOURCES = re.compile(r"^acl\s+\S+\s+src\s+(.+)$", re.MULTILINE)
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class AddressesExhausted(EgressdError):
    """Raised when the pool has no address left with the wanted port free."""


class AddressPool:
    """Loopback addresses from `first` upward, each handed out once.

    Linux routes all of 127.0.0.0/8 to loopback, so they bind with no set-up.
    Addresses are not reused: a probe or client that still holds an old
    Pod's address never reaches a newer Pod by mistake.
    """

    def __init__(self, first: str = FIRST_ADDRESS) -> None:
        self._next = ipaddress.IPv4Address(first)

    def take(self, *, port: int | None = None) -> str:
        """The next address; with `port`, the next one where that port is free.

        Skipping taken ones lets two sandboxes (or a sandbox and the test
        suite) share the machine.
        """
        first = self._next
        for _ in range(ADDRESS_SCAN):
            address = self._next
            if address > LAST_ADDRESS:
                raise AddressesExhausted("no loopback address left")
            self._next = address + 1
            if port is None or port_free(str(address), port):
                return str(address)
        raise AddressesExhausted(
            f"port {port} is in use on every loopback address from {first} to {address}: "
            f"a program listens on *:{port} (a system squid? stop it: "
            "systemctl disable --now squid)")


def port_free(host: str, port: int) -> bool:
    """Whether `host:port` can be bound now (as a proxy binds it: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


@asynccontextmanager
async def open_pooled_proxy(software: ProxySoftware, *, addresses: AddressPool, port: int,
                            allowed_sources: Sequence[str] = LOOPBACK_SOURCES
                            ) -> AsyncIterator[LocalProxy]:
    """`open_local_proxy` on the pool's next address where `port` is free.

    An address that another process (another sandbox on this machine) takes
    between the pool's check and our proxy's start is skipped as well.
    """
    async with AsyncExitStack() as stack:
        proxy: LocalProxy | None = None
        for _ in range(START_ATTEMPTS):
            host = addresses.take(port=port)
            try:
                proxy = await stack.enter_async_context(open_local_proxy(
                    software, host=host, port=port, allowed_sources=allowed_sources))
                break
            except AddressInUse:
                log.info("address taken meanwhile, trying the next",
                         extra={"address": f"{host}:{port}"})
        if proxy is None:
            raise AddressesExhausted(f"{START_ATTEMPTS} loopback addresses in a row were taken "
                                     f"by other processes before our proxy on port {port} "
                                     "could listen")
        yield proxy


def pod_port(pod: Mapping[str, Any]) -> int:
    """The first container port of the Pod (the kubernetes provider sets one), else 3128."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            value = port.get("containerPort")
            if isinstance(value, int) and 1 <= value <= 65535:
                return value
    return DEFAULT_PORT


def allowed_sources(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The client CIDRs of the Pod's SQUID_CONF `acl ... src` line, else loopback only."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        for env in container.get("env") or ():
            if env.get("name") == CONF_ENV and isinstance(env.get("value"), str):
                match = _ACL_SOURCES.search(env["value"])
                if match:
                    sources = tuple(match.group(1).split())
                    for source in sources:
                        ipaddress.ip_network(source, strict=False)
                    return sources
    return LOOPBACK_SOURCES


def _now() -> str:
    return timestamps.now(precision="seconds")


def running_status(pod: Mapping[str, Any], proxy: LocalProxy) -> Obj:
    """The status a kubelet writes for a Pod whose one container runs and is ready."""
    now = _now()
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    first = containers[0]
    return {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": proxy.host,
        "podIPs": [{"ip": proxy.host}],
        "startTime": now,
        "conditions": [{"type": kind, "status": "True", "lastTransitionTime": now}
                       for kind in ("PodReadyToStartContainers", "Initialized", "Ready",
                                    "ContainersReady", "PodScheduled")],
        "containerStatuses": [{
            "name": first.get("name", "proxy"),
            "image": first.get("image", ""),
            "imageID": f"sandbox://{proxy.kind}",
            "containerID": f"sandbox://{proxy.pid}",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }],
    }


def failed_status(message: str) -> Obj:
    """The status of a Pod whose proxy could not start or died."""
    now = _now()
    return {
        "phase": "Failed",
        "reason": "ProxyFailed",
        "message": message,
        "conditions": [{"type": kind, "status": "False", "reason": "ProxyFailed",
                        "lastTransitionTime": now}
                       for kind in ("Ready", "ContainersReady")],
    }


@attrs.define
class _PodRun:
    uid: str
    scope: trio.CancelScope
    proxy: LocalProxy | None = None


class LocalKubelet:
    """Runs one local proxy process per Pod of `namespace` while the Pod exists."""

    def __init__(self, client: KubeClient, *, namespace: str, software: ProxySoftware,
                 addresses: AddressPool) -> None:
        self._client = client
        self.namespace = namespace
        self._software = software
        self._addresses = addresses
        self._runs: dict[str, _PodRun] = {}
        self._nursery: trio.Nursery | None = None

    @property
    def proxies(self) -> dict[str, LocalProxy]:
        """The running proxy of each Pod key (`namespace/name`)."""
        return {key: run.proxy for key, run in self._runs.items() if run.proxy is not None}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Watch Pods and run their proxies until cancelled (which stops every process)."""
        informer = Informer(PODS, namespace=self.namespace)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            informer.add_handler(on_add=self._seen, on_update=lambda _old, new: self._seen(new),
                                 on_delete=self._gone)
            await nursery.start(informer.run, self._client)
            task_status.started()

    # -- informer callbacks (synchronous) -----------------------------------

    def _seen(self, pod: Obj) -> None:
        key = object_key(pod)
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        run = self._runs.get(key)
        if meta.get("deletionTimestamp"):
            self._stop(key)
            return
        if run is not None and run.uid == uid:
            return
        if run is not None:
            self._stop(key)  # the same name with a new uid: a new Pod
        if (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
            return
        assert self._nursery is not None
        run = _PodRun(uid=uid, scope=trio.CancelScope())
        self._runs[key] = run
        self._nursery.start_soon(self._run_pod, pod, run)

    def _gone(self, pod: Obj) -> None:
        key = object_key(pod)
        run = self._runs.get(key)
        if run is not None and run.uid == str((pod.get("metadata") or {}).get("uid") or ""):
            self._stop(key)

    def _stop(self, key: str) -> None:
        run = self._runs.pop(key, None)
        if run is not None:
            run.scope.cancel()

    # -- one Pod ------------------------------------------------------------

    async def _run_pod(self, pod: Obj, run: _PodRun) -> None:
        meta = pod["metadata"]
        name = meta["name"]
        with run.scope:
            try:
                async with open_pooled_proxy(self._software, addresses=self._addresses,
                                             port=pod_port(pod),
                                             allowed_sources=allowed_sources(pod)) as proxy:
                    run.proxy = proxy
                    address = f"{proxy.host}:{proxy.port}"
                    log.info("pod running", extra={"pod": f"{self.namespace}/{name}",
                                                   "address": address})
                    if not await self._write_status(name, running_status(pod, proxy)):
                        return
                    code = await proxy.wait()
                    raise ProxyStartFailed(f"{proxy.kind} on {address} exited with code {code}")
            except (ProxyStartFailed, AddressesExhausted) as exc:
                log.warning("pod failed", extra={"pod": f"{self.namespace}/{name}",
                                                  "error": str(exc)})
                run.proxy = None
                await self._write_status(name, failed_status(str(exc)))
            except ValueError as exc:  # a Pod spec no proxy can be built from
                await self._write_status(name, failed_status(str(exc)))

    async def _write_status(self, name: str, status: Obj) -> bool:
        """Patch the Pod's status until it lands; False if the Pod is gone."""
        backoff = Retries(Backoff(0.5, 10.0, jitter=(1.0, 1.5)))
        while True:
            try:
                await self._client.patch_status(PODS, name, {"status": status},
                                                namespace=self.namespace)
                return True
            except NotFound:
                return False
            except (ApiError, ApiUnavailable) as exc:
                delay = backoff.next()
                log.warning("pod status write failed, retrying",
                            extra={"pod": f"{self.namespace}/{name}", "error": str(exc),
                                   "delay": round(delay, 2)})
                await trio.sleep(delay)
