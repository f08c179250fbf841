"""Only one controller acts: the sandbox's daemon campaigns for the leader Lease, so a
second `egressd run --kubeconfig <the sandbox's kubeconfig>` beside it (with no
providers config, as a developer would start one) stays a standby and never touches
the samples.

Before leader election was on by default, that second daemon reconciled too and
marked every Managed sample Failed ("no provider named 'local'").
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import trio

from egressd.kube.client import KubeClient, open_client
from egressd.kube.config import load_config
from egressd.kube.informer import Informer
from egressd.kube.resources import LEASES, PROXIES
from egressd.sandbox.command import SandboxInfo, serve_sandbox
from tests.sandbox.test_localproxy import installed

Obj = dict[str, Any]


class JsonLog:
    """A process's JSON log lines, as they arrive; a test waits for a message."""

    def __init__(self) -> None:
        self.lines: list[Obj] = []
        self._changed = trio.Event()

    async def read(self, stream: trio.abc.ReceiveStream) -> None:
        buffer = b""
        async for chunk in stream:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                self.lines.append(json.loads(line) if line.startswith(b"{") else
                                  {"msg": line.decode(errors="replace")})
            self._changed.set()
            self._changed = trio.Event()

    async def wait(self, check: Callable[[Obj], bool]) -> Obj:
        while True:
            for line in self.lines:
                if check(line):
                    return line
            await self._changed.wait()


def phase(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def provisioned_generation(obj: Obj) -> int:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Provisioned" and cond.get("status") == "True":
            return int(cond.get("observedGeneration") or 0)
    return 0


async def test_a_second_daemon_beside_the_sandbox_never_acts(tmp_path: Path) -> None:
    software = installed("tinyproxy")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            info: SandboxInfo = await nursery.start(functools.partial(
                serve_sandbox, proxies=2, discovery_addr="127.0.0.1:0",
                metrics_addr="127.0.0.1:0", ready_file=None, workdir=str(tmp_path),
                software=software))
            config = await load_config(kubeconfig=info.kubeconfig, context=None)
            async with open_client(config) as client:
                await _second_daemon_stays_standby(nursery, client, info, tmp_path)
            nursery.cancel_scope.cancel()


async def _second_daemon_stays_standby(nursery: trio.Nursery, client: KubeClient,
                                       info: SandboxInfo, tmp_path: Path) -> None:
    # Every phase any sample shows from now on.
    phases: dict[str, list[str]] = {key: [] for key in info.proxies}
    generation_seen = trio.Event()
    wanted_generation = [0]

    def record(obj: Obj) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if key in phases:
            phases[key].append(phase(obj))
        if key == info.proxies[0] and wanted_generation[0] and \
                provisioned_generation(obj) >= wanted_generation[0]:
            generation_seen.set()

    proxies = Informer(PROXIES)
    proxies.add_handler(on_add=record, on_update=lambda _old, new: record(new))
    await nursery.start(proxies.run, client)
    (lease,) = (await client.list(LEASES)).items
    sandbox_leader = lease["spec"]["holderIdentity"]
    assert sandbox_leader

    # The exact command a developer runs: the sandbox's kubeconfig, no providers config.
    log = JsonLog()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "DISCOVERY_TOKEN": "a-second-daemon-token"}
    second = await trio.lowlevel.open_process(
        [sys.executable, "-m", "egressd", "run", "--kubeconfig", info.kubeconfig,
         "--discovery-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
         "--log-format", "json"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert second.stderr is not None
        nursery.start_soon(log.read, second.stderr)
        started = await log.wait(lambda line: line["msg"] == "egressd started")
        assert started["leader_election"] == "default/egressd"
        # It has read the Lease and found it held by the sandbox's daemon.
        await log.wait(lambda line: line["msg"] == "lease holder changed"
                       and line["holder"] == sandbox_leader)
        # A spec edit: each leader's reconciler takes the Proxy up again. The sandbox's
        # daemon does (the condition follows the new generation); a second leader
        # would find no provider 'local' and mark it Failed.
        edited = await client.merge_patch(
            PROXIES, info.proxies[0].partition("/")[2],
            {"spec": {"attributes": {"edited": "yes"}}}, namespace="default")
        wanted_generation[0] = int(edited["metadata"]["generation"])
        await generation_seen.wait()
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{started['metrics']}/metrics")).text
        assert "egressd_leader 0.0" in metrics.splitlines()
        assert second.returncode is None
    finally:
        if second.returncode is None:
            second.terminate()
            with trio.move_on_after(10):
                await second.wait()
            if second.returncode is None:
                second.kill()
                await second.wait()
    assert not [line for line in log.lines if line["msg"] == "became leader"], log.lines
    for key, seen in phases.items():
        assert set(seen) == {"Ready"}, (key, seen)
    for key in info.proxies:
        assert phase(proxies.get(key) or {}) == "Ready", key
    (lease,) = (await client.list(LEASES)).items
    assert lease["spec"]["holderIdentity"] == sandbox_leader
