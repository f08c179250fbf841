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
from collections.abc import Callable, Mapping
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


async def stop_sandbox(process: trio.Process, log: Path) -> None:
    """After a failure midway: stop the sandbox as a user would, so it stops its
    proxies and removes its files itself; SIGKILL whatever is still there after."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
    for pid in started_proxies(log).values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


class Lines:
    """The output of a long-running command (`kubectl get px -w`), line by line."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""
        self.seen: list[str] = []

    async def until(self, predicate: Callable[[list[str]], bool]) -> str:
        """Read lines until one makes `predicate(cells)` true; that line."""
        while True:
            line, newline, rest = self._buffer.partition(b"\n")
            if newline:
                self._buffer = rest
                self.seen.append(line.decode())
                if predicate(line.decode().split()):
                    return line.decode()
                continue
            chunk = await self._stream.receive_some()
            assert chunk, self.seen  # the command ended
            self._buffer += chunk


async def test_sandbox_as_a_user(tmp_path: Path) -> None:
    _need_proxy_software()
    ready_file = tmp_path / "ready.json"
    log = tmp_path / "sandbox.log"
    home = tmp_path / "home"
    home.mkdir()
    with log.open("wb") as stderr:
        # Its own session, as a shell's foreground job is its own group: Ctrl-C
        # at the end goes to the whole group.
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "egressd", "sandbox", "--proxies", str(MANAGED),
             "--discovery-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
             "--gateway-addr", "127.0.0.1:0", "--ready-file", str(ready_file)],
            stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)
    try:
        with trio.fail_after(60):
            await _scenario(process, ready_file, log, home)
    finally:
        await stop_sandbox(process, log)


def guide_commands(output: str) -> list[str]:
    """The commands of the printed guide's "Try:" list, in order, as a user would copy them."""
    _, _, tried = output.partition("Try:\n")
    tried, _, _ = tried.partition("\n\n")
    return [line.strip() for line in tried.splitlines()
            if line.startswith("  ") and not line.strip().startswith("(")]


def guide_heredoc(output: str) -> str:
    """The guide's `kubectl apply -f - <<'EOF'` ... `EOF` block, as a user would paste it."""
    start = output.index("kubectl apply -f - <<'EOF'\n")
    end = output.index("\nEOF\n", start) + len("\nEOF\n")
    return output[start:end]


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
    # -o wide adds the provider ID and the IP (an External proxy has neither).
    wide_header, *wide_rows = (await run(env, "kubectl", "get", "px", "-o", "wide")
                               ).splitlines()
    assert wide_header.split()[-3:] == ["AGE", "PROVIDER-ID", "IP"]
    at = wide_header.index("PROVIDER-ID")
    wide = {row.split()[0]: row[at:].split() for row in wide_rows}
    assert wide["external-1"] == [], wide  # blank cells
    provider_id, ip = wide["sample-1"]
    assert provider_id.startswith("egressd-proxies/"), wide
    assert ip == table["sample-1"][4]  # the Pod's loopback address
    # Every field is described; the default probe URL says it needs internet.
    explained = await run(env, "kubectl", "explain", "proxy.spec.healthCheck.probeURL")
    assert "needs internet" in " ".join(explained.split()), explained
    for name, cells in table.items():
        phase, host, port, healthy = cells[3:7]
        assert (phase, port, healthy) == ("Ready", "3128", "True"), (name, cells)
        assert re.fullmatch(r"127\.0\.0\.\d+", host), cells
        assert cells[7].isdigit(), cells  # latency in ms
    assert table["sample-1"][2] == "Managed" and table["external-1"][2] == "External"
    assert len({cells[4] for cells in table.values()}) == 3  # one loopback address each

    # --- every command of the printed guide, as printed (bash, a fresh HOME)
    export, get, listing, lease_cmd, through, report, release, gateway = guide_commands(
        output.decode())
    assert export.startswith("export KUBECONFIG=") and get.startswith("kubectl get px -A")

    async def shell(command: str) -> str:
        return await run({"PATH": env["PATH"], "HOME": env["HOME"]}, "bash", "-euc",
                         f"{export}\n{command}")

    assert (await shell(get)).splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]
    items = json.loads(await shell(listing))["items"]
    assert sorted(item["name"] for item in items) == sorted(table)
    lease = json.loads(await shell(lease_cmd))
    assert lease["proxyUrl"] == "http://{}:3128".format(table[lease["proxy"]["name"]][4])
    # A real request through the leased proxy to the local TLS target (204, no body).
    assert await shell(through.replace("PROXY_URL", lease["proxyUrl"])) == ""
    assert await shell(report.replace("LEASE_ID", lease["leaseId"])) == ""  # 204
    assert await shell(release.replace("LEASE_ID", lease["leaseId"])) == ""  # 204
    # The gateway: the same request with only a proxy URL (the token as its password).
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", info["gatewayUrl"]), info
    assert gateway.startswith("curl -x http://egressd:$TOKEN@127.0.0.1:")
    assert await shell(gateway) == ""  # 204 from the probe target, through a sample
    # The report's cooldown is in the Proxy's status, for kubectl to see.
    await run(env, "kubectl", "wait", "px/{}".format(lease["proxy"]["name"]), "--timeout=20s",
              "--for=jsonpath={.status.cooldowns.example\\.org.reason}=rate_limited")

    # --- the discovery API with curl: the token is not optional; a refusal says why
    status, body = await curl(env, f"{api}/v1/proxies")
    assert status == 401, body
    status, body = await curl(env, "-X", "POST", f"{api}/v1/leases", "-H",
                              "Content-Type: application/json", "-d",
                              json.dumps({"target": "example.org", "ttlSeconds": 120,
                                          "selector": {"kind": "external"}}), token=token)
    if lease["proxy"]["name"] == "external-1":  # cooling down for example.org
        assert status == 409 and json.loads(body)["error"] == "no_proxy_available", body
    else:
        assert status == 201, body

    # --- the metrics endpoint
    status, metrics = await curl(env, f"{info['metricsUrl']}/metrics")
    assert status == 200
    assert 'egressd_proxies{phase="Ready"} 3.0' in metrics.splitlines()
    assert re.search(r"^egressd_leases_granted_total [1-9]", metrics, re.MULTILINE), metrics

    # --- kubectl get px -w, while a user applies a Proxy and deletes another
    watch = await trio.lowlevel.open_process(["kubectl", "get", "px", "-w"], env=env,
                                             stdout=subprocess.PIPE)
    try:
        assert watch.stdout is not None
        lines = Lines(watch.stdout)
        await lines.until(lambda cells: cells[:1] == ["external-1"])  # the initial table

        # The guide's own Proxy, pasted into a shell as printed: it probes the local target.
        pasted = guide_heredoc(output.decode())
        assert info["probeUrl"] in pasted
        await run(env, "bash", "-euc", pasted)
        await lines.until(lambda cells: cells[:3] == ["mine", "Managed", "Ready"])
        described = await run(env, "kubectl", "describe", "px", "mine")
        assert "Managed" in described and "Ready" in described, described

        # kubectl delete a Managed proxy: its Pod and its proxy process go
        victim = "sample-1"
        address = f"{table[victim][4]}:3128"
        pid = started_proxies(log)[address]
        assert alive(pid)
        pods_before = (await run(env, "kubectl", "get", "pods", "-n", "egressd-proxies",
                                 "-o", "name")).split()
        assert len(pods_before) == MANAGED + 1  # the samples and "mine"
        await run(env, "kubectl", "delete", "px", victim, "--timeout=20s")
        await lines.until(lambda cells: cells[:3] == [victim, "Managed", "Deleting"])
    finally:
        watch.kill()
        await watch.wait()
    pods_after = (await run(env, "kubectl", "get", "pods", "-n", "egressd-proxies",
                            "-o", "name")).split()
    assert len(pods_after) == MANAGED and set(pods_after) < set(pods_before)
    with trio.fail_after(10):
        await exited(pid)
    gone = await trio.run_process(["kubectl", "get", "px", victim], capture_stdout=True,
                                  capture_stderr=True, env=env, check=False)
    assert gone.returncode == 1 and "not found" in gone.stderr.decode()

    # --- Ctrl-C (SIGINT to the foreground group): exit 0, no proxy process, no files
    pids = started_proxies(log)
    assert len(pids) == MANAGED + 2  # the Managed samples, "mine" and the External one
    os.killpg(process.pid, signal.SIGINT)
    assert await process.wait() == 0, (await trio.Path(log).read_text())[-3000:]
    assert [p for p in pids.values() if alive(p)] == []
    assert not await trio.Path(ready_file).exists()
    assert not await trio.Path(info["kubeconfig"]).parent.exists()
