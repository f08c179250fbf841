"""End-to-end: `egressd sandbox` driven as a user drives it, with kubectl and curl (SPEC §12).

One scenario, in the order a newcomer would try things: start the sandbox,
see every proxy Ready in `kubectl get px`, list and lease over the discovery
API with curl, send a real request through the leased proxy, report a rate
limit and see the cooldown in the Proxy's status, release the lease, apply a
proxy of one's own and see it Ready, delete a Managed proxy and see its Pod
and process go, then SIGTERM and see nothing left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import trio

from egressd.sandbox.localproxy import ProxySoftwareMissing, find_proxy_software

pytestmark = [
    pytest.mark.kubectl,
    pytest.mark.skipif(shutil.which("kubectl") is None,
                       reason="kubectl is not installed (1.32 expected at /usr/bin/kubectl)"),
    pytest.mark.skipif(shutil.which("curl") is None,
                       reason="curl is not installed (apt-get install curl)"),
]

MANAGED = 2
PROXY_YAML = """\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: mine, namespace: default}}
spec:
  mode: Managed
  provider: local
  attributes: {{team: me}}
  healthCheck: {{probeURL: "{probe_url}", intervalSeconds: 5, timeoutSeconds: 2}}
"""
STARTED = re.compile(r"local proxy started kind=\S+ address=(\S+) pid=(\d+)")


def _need_proxy_software() -> None:
    try:
        find_proxy_software()
    except ProxySoftwareMissing as exc:
        pytest.skip(str(exc))


async def run(env: Mapping[str, str], *argv: str, stdin: bytes = b"") -> str:
    """Run a command like a user at a shell; its stdout (a failure shows its stderr)."""
    with trio.fail_after(40):
        result = await trio.run_process(list(argv), stdin=stdin, capture_stdout=True,
                                        capture_stderr=True, env=env, check=False)
    assert result.returncode == 0, (argv, result.stdout.decode(), result.stderr.decode())
    return str(result.stdout.decode())


async def curl(env: Mapping[str, str], *argv: str, token: str | None = None
               ) -> tuple[int, str]:
    """curl with `-w` for the status; (status, body)."""
    auth = ["-H", f"Authorization: Bearer {token}"] if token else []
    out = await run(env, "curl", "-sS", "-w", "\n%{http_code}", *auth, *argv)
    body, _, status = out.rpartition("\n")
    return int(status), body


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def started_proxies(log: Path) -> dict[str, int]:
    """address → pid of every proxy process the sandbox logged as started."""
    return {address: int(pid) for address, pid in STARTED.findall(log.read_text())}


async def exited(pid: int) -> None:
    """Return when process `pid` (not our child) has exited: its pidfd turns readable."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


async def test_sandbox_as_a_user(tmp_path: Path) -> None:
    _need_proxy_software()
    ready_file = tmp_path / "ready.json"
    log = tmp_path / "sandbox.log"
    home = tmp_path / "home"
    home.mkdir()
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "egressd", "sandbox", "--proxies", str(MANAGED),
             "--discovery-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
             "--ready-file", str(ready_file)],
            stdout=subprocess.PIPE, stderr=stderr)
    try:
        with trio.fail_after(60):
            await _scenario(process, ready_file, log, home)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
            for pid in started_proxies(log).values():
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


async def _scenario(process: trio.Process, ready_file: Path, log: Path, home: Path) -> None:
    # --- start: the guide's last line says it is ready
    assert process.stdout is not None
    output = b""
    while b"Stop with Ctrl-C" not in output:
        chunk = await process.stdout.receive_some()
        assert chunk, (output.decode(), started_proxies(log))
        output += chunk
    info = json.loads(await trio.Path(ready_file).read_text())
    api, token = info["discoveryUrl"], info["token"]
    assert f"KUBECONFIG={info['kubeconfig']}" in output.decode()
    assert token in output.decode()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "KUBECONFIG": info["kubeconfig"]}

    # --- kubectl get px -A: every sample Ready, with host, port and latency
    header, *rows = (await run(env, "kubectl", "get", "px", "-A")).splitlines()
    assert header.split() == ["NAMESPACE", "NAME", "MODE", "PHASE", "HOST", "PORT", "HEALTHY",
                              "LATENCY", "AGE"]
    table = {cells[1]: cells for cells in (row.split() for row in rows)}
    assert sorted(table) == ["external-1", "sample-1", "sample-2"]
    for name, cells in table.items():
        phase, host, port, healthy = cells[3:7]
        assert (phase, port, healthy) == ("Ready", "3128", "True"), (name, cells)
        assert re.fullmatch(r"127\.0\.0\.\d+", host), cells
        assert cells[7].isdigit(), cells  # latency in ms
    assert table["sample-1"][2] == "Managed" and table["external-1"][2] == "External"
    assert len({cells[4] for cells in table.values()}) == 3  # one loopback address each

    # --- the discovery API with curl: list, lease
    status, body = await curl(env, f"{api}/v1/proxies?selector=sandbox=true&healthy=true",
                              token=token)
    assert status == 200, body
    assert sorted(item["name"] for item in json.loads(body)["items"]) == sorted(table)
    status, body = await curl(env, f"{api}/v1/proxies")
    assert status == 401, body  # the token is not optional
    status, body = await curl(env, "-X", "POST", f"{api}/v1/leases", "-H",
                              "Content-Type: application/json", "-d",
                              json.dumps({"target": "example.org", "ttlSeconds": 120,
                                          "selector": {"kind": "managed"}}), token=token)
    assert status == 201, body
    lease = json.loads(body)
    proxy_name = lease["proxy"]["name"]
    assert lease["proxyUrl"] == f"http://{table[proxy_name][4]}:3128"

    # --- a real request through the leased proxy to the local TLS target
    status, _ = await curl(env, "--proxy", lease["proxyUrl"], "--cacert", info["probeCaFile"],
                           info["probeUrl"])
    assert status == 204

    # --- report a rate limit: the cooldown is in the Proxy's status
    status, body = await curl(env, "-X", "POST", f"{api}/v1/leases/{lease['leaseId']}/report",
                              "-H", "Content-Type: application/json", "-d",
                              json.dumps({"result": "rate_limited", "retryAfterSeconds": 120}),
                              token=token)
    assert status == 204, body
    await run(env, "kubectl", "wait", f"px/{proxy_name}", "--timeout=20s",
              "--for=jsonpath={.status.cooldowns.example\\.org.reason}=rate_limited")
    obj = json.loads(await run(env, "kubectl", "get", "px", proxy_name, "-o", "json"))
    assert obj["status"]["cooldowns"]["example.org"]["reason"] == "rate_limited"

    # --- release: 204
    status, body = await curl(env, "-X", "DELETE", f"{api}/v1/leases/{lease['leaseId']}",
                              token=token)
    assert status == 204, body

    # --- kubectl apply a Managed proxy of one's own: it becomes Ready too
    manifest = PROXY_YAML.format(probe_url=info["probeUrl"])
    await run(env, "kubectl", "apply", "-f", "-", stdin=manifest.encode())
    await run(env, "kubectl", "wait", "px/mine", "--for=jsonpath={.status.phase}=Ready",
              "--timeout=30s")
    described = await run(env, "kubectl", "describe", "px", "mine")
    assert "Managed" in described and "Ready" in described, described

    # --- kubectl delete a Managed proxy: its Pod and its proxy process go
    victim = "sample-1"
    address = f"{table[victim][4]}:3128"
    pid = started_proxies(log)[address]
    assert alive(pid)
    pods_before = (await run(env, "kubectl", "get", "pods", "-n", "egressd-proxies",
                             "-o", "name")).split()
    assert len(pods_before) == MANAGED + 1  # the samples and "mine"
    await run(env, "kubectl", "delete", "px", victim, "--timeout=20s")
    pods_after = (await run(env, "kubectl", "get", "pods", "-n", "egressd-proxies",
                            "-o", "name")).split()
    assert len(pods_after) == MANAGED and set(pods_after) < set(pods_before)
    with trio.fail_after(10):
        await exited(pid)
    gone = await trio.run_process(["kubectl", "get", "px", victim], capture_stdout=True,
                                  capture_stderr=True, env=env, check=False)
    assert gone.returncode == 1 and "not found" in gone.stderr.decode()

    # --- SIGTERM: exit 0, no proxy process, ready file and kubeconfig gone
    pids = started_proxies(log)
    assert len(pids) == MANAGED + 2  # the Managed samples, "mine" and the External one
    process.send_signal(signal.SIGTERM)
    assert await process.wait() == 0, (await trio.Path(log).read_text())[-3000:]
    assert [p for p in pids.values() if alive(p)] == []
    assert not await trio.Path(ready_file).exists()
    assert not await trio.Path(info["kubeconfig"]).exists()
