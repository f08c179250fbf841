"""`egressd sandbox` as a user runs it: ready file, kubeconfig, SIGTERM (the full
scenario with kubectl and curl is in tests/e2e)."""

from __future__ import annotations

import base64
import json
import re
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
import yaml

from egressd.sandbox.apiserver import FakeApiServer
from egressd.sandbox.command import (
    SandboxInfo,
    guide,
    local_url,
    sample_proxies,
    sandbox_main,
)


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


def test_negative_proxies_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert sandbox_main(api_only=False, ready_file=None, proxies=-1, log_level="info") == 2
    assert "--proxies" in capsys.readouterr().err


async def test_sigterm_while_starting_stops_everything(tmp_path: Path) -> None:
    """A signal before the samples are Ready stops the sandbox too, with its proxies."""
    ready = tmp_path / "ready.json"
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "egressd", "sandbox", "--proxies", "1", "--discovery-addr",
             "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--ready-file", str(ready)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert process.stderr is not None
            log = b""
            while b"local proxy started" not in log:
                chunk = await process.stderr.receive_some()
                assert chunk, log
                log += chunk
            process.send_signal(signal.SIGTERM)
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


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
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
