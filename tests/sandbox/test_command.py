"""`egressd sandbox` as a user runs it: ready file, kubeconfig, SIGTERM (the full
scenario with kubectl and curl is in tests/e2e)."""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml

from egressd.backoff import Backoff
from egressd.cli import _parser, main
from egressd.errors import EgressdError
from egressd.kube.client import open_client
from egressd.kube.config import load_config
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES
from egressd.sandbox.apiserver import FakeApiServer
from egressd.sandbox.command import (
    DISCOVERY_ADDR,
    METRICS_ADDR,
    SandboxInfo,
    _leaves,
    guide,
    local_url,
    sample_proxies,
    sandbox_main,
    serve_sandbox,
)
from egressd.sandbox.localproxy import find_proxy_software
from egressd.settings import parse_settings
from tests.sandbox.test_localproxy import exited, installed, wait_unlocked


def test_samples_are_valid_proxies_and_the_guide_has_real_urls() -> None:
    server = FakeApiServer()
    samples = sample_proxies(3, probe_url="https://127.0.0.1:4443/generate_204",
                             external=("127.0.0.10", 3128))
    for sample in samples:
        server.create(sample)  # the CRD's schema and CEL rules accept it
    names = [s["metadata"]["name"] for s in samples]
    assert names == ["sample-1", "sample-2", "sample-3", "external-1"]
    info = SandboxInfo(discovery_url=local_url("http://0.0.0.0:8090"),
                       metrics_url="http://127.0.0.1:8080", token="t0k", kubeconfig="/k",
                       probe_url="https://127.0.0.1:4443/generate_204", probe_ca_file="/ca",
                       proxies=tuple(names))
    text = guide(info)
    assert "export KUBECONFIG=/k TOKEN=t0k" in text
    for call in ("/v1/proxies", "-X POST http://127.0.0.1:8090/v1/leases ",
                 "/v1/leases/LEASE_ID/report", "-X DELETE http://127.0.0.1:8090/v1/leases/"):
        assert call in text
    assert set(info.ready_file()) >= {"discoveryUrl", "metricsUrl", "token", "kubeconfig"}
    # The ready-to-paste Proxy: a here-document of a Proxy the CRD accepts, probing
    # the sandbox's own target (the default probe URL needs internet).
    _, _, heredoc = text.partition("kubectl apply -f - <<'EOF'\n")
    body, end, _ = heredoc.partition("\nEOF\n")
    assert end
    own = yaml.safe_load(body)
    assert own["spec"]["healthCheck"]["probeURL"] == info.probe_url
    assert server.create(own)["spec"]["provider"] == "local"


def test_negative_proxies_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert sandbox_main(api_only=False, ready_file=None, proxies=-1, log_level="info") == 2
    assert "--proxies" in capsys.readouterr().err


def test_a_malformed_address_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["sandbox", "--discovery-addr", "localhost"])
    assert exit_.value.code == 2
    assert "--discovery-addr: invalid address 'localhost'" in capsys.readouterr().err


def test_an_error_nested_in_nursery_groups_is_printed_as_itself() -> None:
    """What crosses nurseries arrives as groups in groups: the user reads the error."""
    first, second = EgressdError("port 3128 is in use"), EgressdError("other")
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [first]), second])
    assert _leaves(nested) == [first, second]


@pytest.mark.parametrize("flag", ["--discovery-addr", "--metrics-addr"])
def test_a_taken_port_is_one_clear_line_before_anything_starts(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Another sandbox already on :8090 / :8080: say which flag, and how to pick another."""
    installed("tinyproxy")  # the check comes after the search for proxy software
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        addrs = {"discovery_addr": "127.0.0.1:0", "metrics_addr": "127.0.0.1:0",
                 flag.lstrip("-").replace("-", "_"): addr}
        assert sandbox_main(api_only=False, ready_file=None, proxies=1, log_level="info",
                            **addrs) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"egressd sandbox: {flag} {addr}: cannot listen there: Address "
                                f"already in use (another egressd sandbox? pick another "
                                f"address, e.g. {flag} 127.0.0.1:0 for any free port)"]


async def test_without_squid_the_sandbox_runs_tinyproxy(tmp_path: Path) -> None:
    """Squid stays installed: the search path holds tinyproxy only, as on a machine
    without Squid, and the whole sandbox comes up Ready on tinyproxy."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tinyproxy").symlink_to(installed("tinyproxy").binary)
    software = find_proxy_software(str(bin_dir))
    assert software.kind == "tinyproxy"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            info: SandboxInfo = await nursery.start(functools.partial(
                serve_sandbox, proxies=1, discovery_addr="127.0.0.1:0",
                metrics_addr="127.0.0.1:0", ready_file=str(tmp_path / "ready.json"),
                workdir=str(tmp_path), software=software))
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {info.token}"}
                                         ) as client:
                for kind in ("managed", "external"):
                    lease = await client.post(f"{info.discovery_url}/v1/leases",
                                              json={"selector": {"kind": kind}})
                    assert lease.status_code == 201, lease.text
                    proxy_url = lease.json()["proxyUrl"]
                    async with httpx.AsyncClient(proxy=proxy_url, verify=ssl.create_default_context(
                            cafile=info.probe_ca_file)) as through:
                        assert (await through.get(info.probe_url)).status_code == 204
                        # Its error page names the program that answered.
                        refused = await through.get("http://127.0.0.1:1/")
                    assert refused.headers["server"].startswith("tinyproxy/"), refused.headers
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
async def test_sigterm_or_sighup_while_starting_stops_everything(
        tmp_path: Path, stop: signal.Signals) -> None:
    """A signal before the samples are Ready stops the sandbox too, with its proxies;
    a closed terminal (SIGHUP) is a stop like any other."""
    ready = tmp_path / "ready.json"
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "egressd", "sandbox", "--proxies", "1", "--discovery-addr",
             "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0",
             "--ready-file", str(ready)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert process.stderr is not None
            log = b""
            while b"local proxy started" not in log:
                chunk = await process.stderr.receive_some()
                assert chunk, log
                log += chunk
            process.send_signal(stop)
            async for chunk in process.stderr:
                log += chunk
            assert await process.wait() == 0, log.decode()
            pids = [int(pid) for pid in re.findall(rb"local proxy started .* pid=(\d+)", log)]
            assert pids
            assert [pid for pid in pids if await trio.Path(f"/proc/{pid}").exists()] == []
            assert not await trio.Path(ready).exists()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_api_only_serves_until_sigterm_or_ctrl_c(tmp_path: Path, stop: signal.Signals
                                                       ) -> None:
    ready = tmp_path / "ready.json"
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "egressd", "sandbox", "--api-only", "--ready-file",
             str(ready)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert process.stdout is not None
            output = b""
            while b"Stop with Ctrl-C" not in output:
                chunk = await process.stdout.receive_some()
                assert chunk, output
                output += chunk
            info = json.loads(await trio.Path(ready).read_text())
            assert set(info) == {"kubeconfig", "server"}
            assert f"KUBECONFIG={info['kubeconfig']}" in output.decode()
            config = yaml.safe_load(await trio.Path(info["kubeconfig"]).read_text())
            user = config["users"][0]["user"]
            assert config["clusters"][0]["cluster"]["server"] == info["server"]
            context = ssl.create_default_context(cadata=base64.b64decode(
                config["clusters"][0]["cluster"]["certificate-authority-data"]).decode())
            async with httpx.AsyncClient(verify=context, headers={
                    "Authorization": f"Bearer {user['token']}"}) as client:
                response = await client.get(
                    info["server"] + "/apis/crawl.example.com/v1alpha1/proxies")
            assert response.status_code == 200
            process.send_signal(stop)
            assert await process.wait() == 0
            # Nothing left behind: the ready file and the kubeconfig (with its token) go too.
            assert not ready.exists()
            assert not await trio.Path(info["kubeconfig"]).exists()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


def test_the_sandbox_listens_on_loopback_unless_told_otherwise() -> None:
    """It prints a token for this machine's user; `egressd run` keeps :8090/:8080."""
    args = _parser().parse_args(["sandbox"])
    assert (args.discovery_addr, args.metrics_addr) == (DISCOVERY_ADDR, METRICS_ADDR)
    assert (DISCOVERY_ADDR, METRICS_ADDR) == ("127.0.0.1:8090", "127.0.0.1:8080")
    run = parse_settings([], environ={})
    assert (run.discovery_addr, run.metrics_addr) == (":8090", ":8080")


async def test_a_sigkilled_sandbox_leaves_no_process_and_the_next_start_cleans_up(
        tmp_path: Path) -> None:
    installed("tinyproxy")
    argv = [sys.executable, "-m", "egressd", "sandbox", "--discovery-addr", "127.0.0.1:0",
            "--metrics-addr", "127.0.0.1:0"]
    ready, log_file = tmp_path / "ready.json", tmp_path / "sandbox.log"
    with trio.fail_after(60):
        with log_file.open("wb") as stderr:
            process = await trio.lowlevel.open_process(
                [*argv, "--proxies", "1", "--ready-file", str(ready)],
                stdout=subprocess.PIPE, stderr=stderr)
        try:
            assert process.stdout is not None
            output = b""
            while b"Stop with Ctrl-C" not in output:
                chunk = await process.stdout.receive_some()
                assert chunk, log_file.read_text()
                output += chunk
            kubeconfig = json.loads(ready.read_text())["kubeconfig"]
            started = re.findall(rb"local proxy started .* pid=(\d+) workdir=(\S+)",
                                 log_file.read_bytes())
            assert len(started) == 2  # the Managed sample's and the External one's
            process.kill()
            await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        for pid, _ in started:
            await exited(int(pid))
        # Its files stay until a sandbox starts again (a killed process removes nothing).
        left = [os.path.dirname(kubeconfig), *(d.decode() for _, d in started)]
        assert all([await trio.Path(d).is_dir() for d in left])
        for directory in left:  # the proxies' watchdogs let go once their kill is done
            await trio.to_thread.run_sync(wait_unlocked, directory)
        again = await trio.lowlevel.open_process(
            [*argv, "--api-only"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert again.stdout is not None
            output = b""
            while b"Stop with Ctrl-C" not in output:
                chunk = await again.stdout.receive_some()
                assert chunk, output
                output += chunk
            assert [d for d in left if await trio.Path(d).exists()] == []
            again.send_signal(signal.SIGTERM)
            assert await again.wait() == 0
        finally:
            if again.returncode is None:
                again.kill()
                await again.wait()


class Records(logging.Handler):
    """The sandbox's log records (it logs from the test's own thread)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []
        self.changed = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.changed.set()
        self.changed = trio.Event()

    def started(self, address: str) -> list[int]:
        """Pids of the proxies started on `address`, in order."""
        return [int(r.__dict__["pid"]) for r in self.records
                if r.getMessage() == "local proxy started" and r.__dict__["address"] == address]


@pytest.fixture
def records() -> Iterator[Records]:
    logger, handler = logging.getLogger("egressd"), Records()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def healthy(obj: dict[str, Any]) -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == "Healthy":
            return str(cond["status"])
    return ""


async def test_a_killed_external_proxy_goes_unhealthy_and_is_restarted(
        tmp_path: Path, records: Records) -> None:
    """SIGKILL the External sample's proxy: the sandbox keeps running, the Proxy goes
    Unhealthy like any External proxy whose process died, and the process comes back
    on the same address (here only once the port the test holds meanwhile is free)."""
    software = installed("tinyproxy")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            info: SandboxInfo = await nursery.start(functools.partial(
                serve_sandbox, proxies=0, discovery_addr="127.0.0.1:0",
                metrics_addr="127.0.0.1:0", ready_file=None, workdir=str(tmp_path),
                software=software, external_backoff=Backoff(initial=0.2, maximum=0.5)))
            config = await load_config(kubeconfig=info.kubeconfig, context=None)
            async with open_client(config) as client:
                proxies = Informer(PROXIES, namespace="default")
                changed = trio.Event()

                def wake(*_: object) -> None:
                    nonlocal changed
                    changed.set()
                    changed = trio.Event()

                proxies.add_handler(on_add=wake, on_update=wake)
                await nursery.start(proxies.run, client)

                async def until(check: Callable[[dict[str, Any]], bool]) -> None:
                    while not check(proxies.get("default/external-1") or {}):
                        await changed.wait()

                # One failed probe is enough to flip the verdict (default: three).
                await client.merge_patch(PROXIES, "external-1", {"spec": {"healthCheck": {
                    "failureThreshold": 1}}}, namespace="default")
                endpoint = (proxies.get("default/external-1") or {})["spec"]["endpoint"]
                address = f"{endpoint['host']}:{endpoint['port']}"
                (pid,) = records.started(address)
                with socket.socket() as squatter:
                    os.kill(pid, signal.SIGKILL)
                    await exited(pid)
                    # Hold the port: the restart cannot succeed until the test lets go.
                    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    squatter.bind((endpoint["host"], endpoint["port"]))
                    squatter.listen()
                    await until(lambda o: healthy(o) == "False" and
                                (o.get("status") or {}).get("phase") == "Unhealthy")
                    assert records.started(address) == [pid]
                while len(records.started(address)) < 2:
                    await records.changed.wait()
                await until(lambda o: healthy(o) == "True")
                assert [r for r in records.records if r.getMessage() ==
                        "the External sample's proxy did not start"], "the port was held"
            nursery.cancel_scope.cancel()
