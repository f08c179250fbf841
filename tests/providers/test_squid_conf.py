"""The kubernetes provider's generated squid.conf, loaded by a real Squid.

`squid -k parse` checks the exact text a Pod gets; the Pod's own start
command (with only the config path moved out of /etc) runs a real Squid from
the env var with stdout/stderr as pipes, as in a container; a real Squid on a
free loopback port forwards a request and a CONNECT tunnel to a local target,
and refuses a client outside its allowed sources.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import yaml

from egressd.providers import CreateRequest
from egressd.providers.config import KubernetesConfig
from egressd.providers.kubernetes import CONF_ENV, pod_manifest, squid_conf

pytestmark = [
    pytest.mark.squid,
    pytest.mark.skipif(shutil.which("squid") is None, reason="needs squid (apt install squid)"),
]

CONFIG = KubernetesConfig(namespace="egressd-proxies", image="ubuntu/squid:6.6-24.04_edge")


def pod_conf(port: int = 3128) -> str:
    pod = pod_manifest(CONFIG, CreateRequest(name="px-abc", port=port))
    env = pod["spec"]["containers"][0]["env"]
    return next(e["value"] for e in env if e["name"] == CONF_ENV)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_pod_conf_parses(tmp_path: Path) -> None:
    conf = tmp_path / "squid.conf"
    conf.write_text(pod_conf(8080))
    result = subprocess.run(["squid", "-k", "parse", "-f", str(conf)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "http_port 8080" in result.stderr  # squid echoes what it processed
    assert "ERROR" not in result.stderr and "FATAL" not in result.stderr


def test_conf_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        squid_conf(0)
    with pytest.raises(ValueError):
        squid_conf(3128, allowed_sources=())
    with pytest.raises(ValueError):
        squid_conf(3128, allowed_sources=("10.0.0.0/8", "http_access allow all"))


async def serve_204(stream: trio.SocketStream) -> None:
    data = b""
    async with stream:
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return
            data += chunk
        await stream.send_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")


async def exchange(stream: trio.SocketStream, request: bytes) -> bytes:
    await stream.send_all(request)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        answer += chunk
    return answer


@asynccontextmanager
async def running_squid(**kwargs: object) -> AsyncIterator[int]:
    """Squid on a free 127.0.0.1 port with the generated conf; killed on exit."""
    port = free_port()
    # Started as root, Squid becomes user `proxy`, which must reach and write
    # its log directory: pytest's tmp_path (under a 0700 directory) will not do.
    with tempfile.TemporaryDirectory(prefix="egressd-squid-") as tmp:
        run_dir = Path(tmp)
        os.chmod(run_dir, 0o777)
        conf = run_dir / "squid.conf"
        conf.write_text(squid_conf(
            port, listen_address="127.0.0.1", access_log=f"stdio:{run_dir}/access.log",
            cache_log=f"{run_dir}/cache.log", **kwargs))  # type: ignore[arg-type]
        with open(run_dir / "stderr", "wb") as stderr:  # noqa: ASYNC230 - a local temp file
            proc = await trio.lowlevel.open_process(
                ["squid", "-N", "-f", str(conf)], stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            async with _until_up(proc, port, run_dir):
                yield port
        finally:
            proc.kill()  # SIGINT takes ~2 s to stop it; nothing here needs a clean stop
            with trio.CancelScope(shield=True):
                await proc.wait()


@asynccontextmanager
async def _until_up(proc: trio.Process, port: int, run_dir: Path) -> AsyncIterator[None]:
    while True:  # Squid is up in 20-45 ms (NOTES.md); wait for its port, not a guess
        assert proc.returncode is None, (run_dir / "stderr").read_text()
        try:
            probe = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.sleep(0.02)
            continue
        await probe.aclose()
        break
    yield


async def test_real_squid_forwards_and_tunnels(nursery: trio.Nursery) -> None:
    with trio.fail_after(20):
        listeners = await nursery.start(trio.serve_tcp, serve_204, 0)
        target = listeners[0].socket.getsockname()[1]
        async with running_squid() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                answer = await exchange(stream, (
                    f"GET http://127.0.0.1:{target}/generate_204 HTTP/1.1\r\n"
                    f"Host: 127.0.0.1:{target}\r\nConnection: close\r\n\r\n").encode())
            assert answer.startswith(b"HTTP/1.1 204"), answer
            assert b"Via:" not in answer

            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                answer = await exchange(stream, (
                    f"CONNECT 127.0.0.1:{target} HTTP/1.1\r\n"
                    f"Host: 127.0.0.1:{target}\r\n\r\n").encode())
                assert answer.startswith(b"HTTP/1.1 200"), answer
                answer = await exchange(stream, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert answer.startswith(b"HTTP/1.1 204"), answer


async def test_real_squid_refuses_other_sources() -> None:
    with trio.fail_after(20):
        async with running_squid(allowed_sources=("10.0.0.0/8",)) as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                answer = await exchange(stream, (
                    b"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"
                    b"Connection: close\r\n\r\n"))
    assert answer.startswith(b"HTTP/1.1 403"), answer


def test_the_docs_cloud_init_installs_a_squid_that_is_not_open(tmp_path: Path) -> None:
    """docs/providers.md's example: valid cloud-config whose squid.conf parses and
    serves only the listed sources."""

    doc = (Path(__file__).resolve().parents[2] / "docs" / "providers.md").read_text()
    block = next(b.split("\n", 1)[1] for b in doc.split("```yaml")[1:]
                 if b.split("\n", 1)[1].startswith("#cloud-config\npackage_update"))
    cloud_config = yaml.safe_load(block.split("```")[0])
    assert "squid" in cloud_config["packages"]
    (conf_file,) = [f for f in cloud_config["write_files"] if f["path"] == "/etc/squid/squid.conf"]
    text = conf_file["content"]
    lines = [line.strip() for line in text.splitlines() if not line.strip().startswith("#")]
    assert "http_access deny all" in lines
    assert [line for line in lines if line.startswith("http_access allow")] == [
        "http_access allow egressd_clients"]
    assert "0.0.0.0/0" not in text
    conf = tmp_path / "squid.conf"
    conf.write_text(text)
    result = subprocess.run(["squid", "-k", "parse", "-f", str(conf)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "FATAL" not in result.stderr


async def test_the_pod_start_command_runs_squid_from_the_env_var(nursery: trio.Nursery) -> None:
    """The container's `sh -c` writes $SQUID_CONF and execs Squid, which logs each
    request to stdout (a pipe, as in a container, even after it drops to `proxy`)."""
    port = free_port()
    pod = pod_manifest(CONFIG, CreateRequest(name="px-abc", port=port))
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    with tempfile.TemporaryDirectory(prefix="egressd-squid-") as tmp, trio.fail_after(20):
        conf = Path(tmp) / "squid.conf"
        command = container["command"][2].replace("/etc/squid/squid.conf", str(conf))
        assert command != container["command"][2]
        listeners = await nursery.start(trio.serve_tcp, serve_204, 0)
        target = listeners[0].socket.getsockname()[1]
        proc = await trio.lowlevel.open_process(
            [*container["command"][:2], command], env={**os.environ, **env},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = bytearray(), bytearray()
        logged = trio.Event()

        async def drain(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
            async for chunk in stream:
                into += chunk
                if b"TCP_MISS/204" in stdout:
                    logged.set()

        try:
            nursery.start_soon(drain, proc.stdout, stdout)
            nursery.start_soon(drain, proc.stderr, stderr)
            async with _until_up(proc, port, Path(tmp)):
                assert conf.read_text() == env[CONF_ENV] + "\n"
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    answer = await exchange(stream, (
                        f"GET http://127.0.0.1:{target}/generate_204 HTTP/1.1\r\n"
                        f"Host: 127.0.0.1:{target}\r\nConnection: close\r\n\r\n").encode())
                assert answer.startswith(b"HTTP/1.1 204"), answer
                await logged.wait()
        finally:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
    assert b"FATAL" not in stderr and b"Cannot write log file" not in stderr, stderr.decode()
