"""`egressd sandbox --api-only` as a user runs it: ready file, kubeconfig, SIGTERM."""

from __future__ import annotations

import base64
import json
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
import yaml

from egressd.sandbox.command import sandbox_main


def test_full_sandbox_is_not_built_yet(capsys: pytest.CaptureFixture[str]) -> None:
    assert sandbox_main(api_only=False, ready_file=None, proxies=3, log_level="info") == 1
    assert "--api-only" in capsys.readouterr().err


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
