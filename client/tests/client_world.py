"""A real egressd for the client's tests, in a background thread of the test process.

The project's fake Kubernetes API server and the real daemon (`run_daemon`, the
code `egressd run` runs) on a trio loop of their own, three External proxies
(two Squids and a tinyproxy, each sending from its own loopback address), the
probe target and the test website. Tests reach it only as a crawler would: over
HTTP, with the discovery URL and token.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
from client_site import CRAWL_HOST, Site

from egressd.app import DaemonAddresses, Inputs, load_inputs, run_daemon
from egressd.kube.client import open_client
from egressd.kube.config import load_config
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES
from egressd.sandbox.apiserver import FakeApiServer
from egressd.settings import parse_settings
from tests.health.peers import ProxyProcess, run_squid, run_tinyproxy, serve_target

TOKEN = "client-tests-discovery-token"
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class TestProxy:
    name: str
    process: ProxyProcess
    egress: str  # the address it connects to sites from

    @property
    def url(self) -> str:
        return f"http://{self.process.host}:{self.process.port}"


@dataclass
class World:
    proxies: list[TestProxy]
    workdir: Path
    site: Site = field(default_factory=Site)
    discovery_url: str = ""
    metrics_url: str = ""
    token: str = TOKEN
    error: BaseException | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _trio_token: trio.lowlevel.TrioToken | None = None
    _cancel: trio.CancelScope | None = None
    _daemon_cancel: trio.CancelScope | None = None
    _daemon_done: trio.Event = field(default_factory=trio.Event)

    @property
    def site_url(self) -> str:
        return f"http://127.0.0.1:{self.site.port}"

    @property
    def crawl_url(self) -> str:
        return self.url_at(CRAWL_HOST)

    def url_at(self, host: str) -> str:
        """The site under another of its names (SITE_NAMES)."""
        return f"http://{host}:{self.site.ports[host]}"

    def proxy_by_egress(self, address: str) -> TestProxy:
        return next(p for p in self.proxies if p.egress == address)

    def proxy_views(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.discovery_url}/v1/proxies", timeout=10,
                             headers={"Authorization": f"Bearer {TOKEN}"})
        response.raise_for_status()
        return list(response.json()["items"])

    def active_leases(self) -> int:
        return sum(int(v["activeLeases"]) for v in self.proxy_views())

    def reports(self, result: str) -> float:
        """egressd_reports_total{result=...} as the daemon exports it."""
        text = httpx.get(f"{self.metrics_url}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(f'egressd_reports_total{{result="{result}"}}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    # --- the thread ------------------------------------------------------------------

    def start(self) -> None:
        thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True,
                                  name="egressd-world")
        thread.start()
        self._thread = thread
        if not self._ready.wait(START_TIMEOUT + 5):
            raise RuntimeError("the egressd test world did not start")
        if self.error is not None:
            raise RuntimeError("the egressd test world failed to start") from self.error

    def stop(self) -> None:
        if self._cancel is not None and self._trio_token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run(self._stop, trio_token=self._trio_token)
        self._thread.join(15)

    async def _stop(self) -> None:
        # The daemon first, so it can still give up its leader Lease on the API server.
        assert self._cancel is not None and self._daemon_cancel is not None
        self._daemon_cancel.cancel()
        with trio.move_on_after(10):
            await self._daemon_done.wait()
        self._cancel.cancel()

    async def _main(self) -> None:
        self._trio_token = trio.lowlevel.current_trio_token()
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                with trio.fail_after(START_TIMEOUT):
                    await self._start(nursery)
                self._ready.set()
                await trio.sleep_forever()
        except BaseException as exc:  # reported to the starting thread, then re-raised
            self.error = exc
            raise
        finally:
            self._ready.set()

    async def _daemon(self, inputs: Inputs, *,
                      task_status: trio.TaskStatus[DaemonAddresses]) -> None:
        try:
            with trio.CancelScope() as self._daemon_cancel:
                await run_daemon(inputs, environ={}, task_status=task_status)
        finally:
            self._daemon_done.set()

    async def _start(self, nursery: trio.Nursery) -> None:
        apiserver = FakeApiServer(token="client-tests-apiserver")
        await nursery.start(apiserver.serve)
        kubeconfig = self.workdir / "kubeconfig"
        apiserver.write_kubeconfig(kubeconfig)
        token_file = self.workdir / "token"
        token_file.write_text(TOKEN + "\n")
        probe = await nursery.start(serve_target, 204)
        await nursery.start(self.site.serve)
        settings = parse_settings(
            ["--kubeconfig", str(kubeconfig), "--discovery-addr", "127.0.0.1:0",
             "--metrics-addr", "127.0.0.1:0", "--shutdown-grace", "1s",
             "--discovery-token-file", str(token_file)], environ={})
        addrs: DaemonAddresses = await nursery.start(self._daemon, load_inputs(settings, {}))
        self.discovery_url, self.metrics_url = addrs.discovery_url, addrs.metrics_url
        async with open_client(await load_config(kubeconfig=str(kubeconfig), context=None)
                               ) as kube, trio.open_nursery() as watch:
            informer = Informer(PROXIES)
            ready: set[str] = set()
            all_ready = trio.Event()

            def look(obj: dict[str, Any]) -> None:
                if (obj.get("status") or {}).get("phase") == "Ready":
                    ready.add(obj["metadata"]["name"])
                if ready >= {p.name for p in self.proxies}:
                    all_ready.set()

            informer.add_handler(on_add=look, on_update=lambda _old, new: look(new))
            await watch.start(informer.run, kube)
            for proxy in self.proxies:
                apiserver.create({
                    "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                    "metadata": {"name": proxy.name, "namespace": "default"},
                    "spec": {"mode": "External", "attributes": {"pool": "test"},
                             "endpoint": {"host": proxy.process.host,
                                          "port": proxy.process.port},
                             "healthCheck": {"probeURL": f"http://127.0.0.1:{probe.port}/",
                                             "intervalSeconds": 5, "timeoutSeconds": 2}}})
            await all_ready.wait()
            watch.cancel_scope.cancel()


EGRESS = ("127.0.0.201", "127.0.0.202", "127.0.0.203")


@contextlib.contextmanager
def running_world(workdir: Path) -> Iterator[World]:
    """Three real proxies with distinct egress addresses, then the world around them."""
    with contextlib.ExitStack() as stack:
        proxies = [
            TestProxy("squid-a", stack.enter_context(run_squid(
                extra=f"tcp_outgoing_address {EGRESS[0]}\n")), EGRESS[0]),
            TestProxy("squid-b", stack.enter_context(run_squid(
                extra=f"tcp_outgoing_address {EGRESS[1]}\n")), EGRESS[1]),
            TestProxy("tiny-c", stack.enter_context(run_tinyproxy(
                extra=f"Bind {EGRESS[2]}\n")), EGRESS[2]),
        ]
        world = World(proxies=proxies, workdir=workdir)
        world.start()
        try:
            yield world
        finally:
            world.stop()
