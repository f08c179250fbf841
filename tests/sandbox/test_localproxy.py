"""Local proxy processes and the local probe target, for real on loopback."""

from __future__ import annotations

import fcntl
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from egressd.health.probe import Prober, ProbeTarget
from egressd.sandbox.localproxy import (
    AddressInUse,
    ProxySoftware,
    ProxySoftwareMissing,
    ProxyStartFailed,
    find_proxy_software,
    listener_owned,
    open_local_proxy,
)
from egressd.sandbox.orphans import (
    LOCK_NAME,
    claim_temp_dir,
    release_temp_dir,
    remove_stale_temp_dirs,
)
from egressd.sandbox.probe_target import ProbeTargetServer

SBIN = os.pathsep.join(["/usr/sbin", "/usr/bin", "/sbin", "/bin"])


def installed(kind: str) -> ProxySoftware:
    import shutil

    binary = shutil.which(kind, path=SBIN)
    if binary is None:
        pytest.skip(f"{kind} is not installed (apt-get install {kind})")
    return ProxySoftware(kind=kind, binary=binary)  # type: ignore[arg-type]


def free_port(host: str) -> int:
    # Another process may bind it before the proxy does; unlikely on 127.0.0.9.
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def test_missing_software_names_the_packages(tmp_path: Path) -> None:
    with pytest.raises(ProxySoftwareMissing, match=r"apt-get install squid.*apt-get install "
                                                    r"tinyproxy"):
        find_proxy_software(str(tmp_path))


def test_squid_is_preferred_then_tinyproxy(tmp_path: Path) -> None:
    for name in ("tinyproxy", "squid"):
        exe = tmp_path / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        assert find_proxy_software(str(tmp_path)) == ProxySoftware(kind=name, binary=str(exe))


async def test_probe_target_answers_204_on_its_path_only(tmp_path: Path) -> None:
    with trio.fail_after(20):
        target = ProbeTargetServer()
        async with trio.open_nursery() as nursery:
            url = await nursery.start(target.serve)
            assert url == f"https://127.0.0.1:{target.port}/generate_204"
            ca = target.write_ca(str(tmp_path / "ca.pem"))
            async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=ca)) as client:
                ok = await client.get(url)
                other = await client.get(url.replace("generate_204", "nope"))
                again = await client.get(url)  # on the kept-alive connection
            assert (ok.status_code, other.status_code, again.status_code) == (204, 404, 204)
            assert target.hits == 2
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("kind", ["squid", "tinyproxy"])
async def test_local_proxy_tunnels_to_the_target_and_stops(kind: str, tmp_path: Path) -> None:
    software = installed(kind)
    with trio.fail_after(20):
        target = ProbeTargetServer()
        async with trio.open_nursery() as nursery:
            url = await nursery.start(target.serve)
            prober = Prober(ca_file=target.write_ca(str(tmp_path / "ca.pem")))
            port = free_port("127.0.0.9")
            async with open_local_proxy(software, host="127.0.0.9", port=port) as proxy:
                assert proxy.url == f"http://127.0.0.9:{port}"
                result = await prober.probe(ProbeTarget(key="k", host=proxy.host,
                                                        port=proxy.port, url=url, timeout=5))
                assert result.ok, result.reason
                pid = proxy.pid
                assert alive(pid)
            # Stopped and reaped: the pid no longer exists and the port refuses.
            assert proxy.stopped.is_set()
            assert not alive(pid)
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.9", port)
            nursery.cancel_scope.cancel()


async def test_a_proxy_that_exits_at_once_is_a_start_failure() -> None:
    with trio.fail_after(20):
        with pytest.raises(ProxyStartFailed, match="exited with code 1"):
            async with open_local_proxy(ProxySoftware(kind="squid", binary="/bin/false"),
                                        host="127.0.0.9", port=free_port("127.0.0.9")):
                pytest.fail("a process that exited cannot be ready")


@pytest.mark.parametrize("bind_host", ["127.0.0.9", "0.0.0.0"])
async def test_another_programs_listener_is_not_our_proxy(bind_host: str) -> None:
    """A connect would succeed (someone listens there), but the proxy is not ready:
    it cannot listen where another program does (another sandbox took the
    address, or a system squid holds the port on every address)."""
    software = installed("tinyproxy")
    with trio.fail_after(20), socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind((bind_host, 0))
        other.listen()
        port = other.getsockname()[1]
        assert listener_owned(os.getpid(), host="127.0.0.9", port=port)
        with pytest.raises(AddressInUse, match=f"127.0.0.9:{port}"):
            async with open_local_proxy(software, host="127.0.0.9", port=port):
                pytest.fail("another program's listener is not our proxy")


def test_listener_owned_says_whose_listener_it_is() -> None:
    with socket.socket() as bound:
        bound.bind(("127.0.0.9", 0))
        port = bound.getsockname()[1]
        assert listener_owned(os.getpid(), host="127.0.0.9", port=port) is False  # not listening
        bound.listen()
        assert listener_owned(os.getpid(), host="127.0.0.9", port=port) is True
        with subprocess.Popen(["sleep", "30"]) as child:  # alive, listening elsewhere
            try:
                with pytest.raises(AddressInUse):
                    listener_owned(child.pid, host="127.0.0.9", port=port)
            finally:
                child.kill()
        with pytest.raises(AddressInUse):  # gone (exited: it could not bind, say)
            listener_owned(child.pid, host="127.0.0.9", port=port)


async def exited(pid: int) -> None:
    """Return once process `pid` (not necessarily our child) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


def wait_unlocked(workdir: str) -> None:
    """Block until nobody holds the dir's lock (a blocking flock, then let go)."""
    fd = os.open(os.path.join(workdir, LOCK_NAME), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)


# A stand-in for a sandbox: it starts one proxy, says where, and waits to be killed.
OWNER = """\
import sys, trio
from egressd.sandbox.localproxy import ProxySoftware, open_local_proxy
async def main():
    software = ProxySoftware(kind=sys.argv[1], binary=sys.argv[2])
    async with open_local_proxy(software, host="127.0.0.9", port=int(sys.argv[3])) as proxy:
        print(proxy.pid, proxy.workdir, flush=True)
        await trio.sleep_forever()
trio.run(main)
"""


@pytest.mark.parametrize("kind", ["squid", "tinyproxy"])
async def test_a_sigkilled_owner_takes_its_proxy_with_it_and_leaves_a_stale_dir(
        kind: str, tmp_path: Path) -> None:
    software = installed(kind)
    with trio.fail_after(30):
        owner = await trio.lowlevel.open_process(
            [sys.executable, "-c", OWNER, kind, software.binary, str(free_port("127.0.0.9"))],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert owner.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                chunk = await owner.stdout.receive_some()
                assert chunk, line
                line += chunk
            pid_text, workdir = line.decode().split()
            pid = int(pid_text)
            assert alive(pid)
            # A live proxy's dir is in use: never removed.
            assert workdir not in remove_stale_temp_dirs()
            owner.kill()  # SIGKILL: no chance to stop anything
            await owner.wait()
            await exited(pid)  # its watchdog killed it
        finally:
            if owner.returncode is None:
                owner.kill()
                await owner.wait()
        # Left behind, and removed by the next start once the proxy's lock is free
        # (its watchdog holds it until the kill is done).
        assert await trio.Path(workdir).is_dir()
        await trio.to_thread.run_sync(wait_unlocked, workdir)
        assert workdir in remove_stale_temp_dirs()
        assert not await trio.Path(workdir).exists()


def test_only_claimed_dirs_nobody_holds_are_removed(tmp_path: Path) -> None:
    unclaimed = tmp_path / "egressd-squid-unclaimed"  # an older egressd's, or not ours
    unclaimed.mkdir()
    foreign = tmp_path / "something-else"
    foreign.mkdir()
    (foreign / LOCK_NAME).write_text("")
    held, fd = claim_temp_dir("egressd-tinyproxy-", str(tmp_path))
    stale, stale_fd = claim_temp_dir("egressd-sandbox-", str(tmp_path))
    os.close(stale_fd)  # its owner died
    assert held.startswith(str(tmp_path))
    assert remove_stale_temp_dirs(str(tmp_path)) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [unclaimed.name, foreign.name, os.path.basename(held)])
    release_temp_dir(held, fd)
    assert not os.path.exists(held)
