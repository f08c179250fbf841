"""Real peers for probe tests on loopback: Squid and tinyproxy processes, and
trio-served HTTP/TLS targets and misbehaving proxies.

Proxy processes are started synchronously (session fixtures share them);
targets run inside each test's trio loop and are started with `nursery.start`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import h11
import trio

_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def find_binary(name: str) -> str | None:
    return shutil.which(name, path=_SBIN_PATH)


@attrs.frozen
class ProxyProcess:
    host: str
    port: int
    log_dir: Path


def _free_port() -> int:
    # The port may be taken again before the daemon binds it: callers retry.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, marker: str) -> bool:
    """True once `marker` is in `log`; False if the daemon exited first."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if log.exists() and marker in log.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)  # polling a log file for readiness, bounded by the deadline
    raise RuntimeError(f"{proc.args!r} not ready after 15 s; log: {log}")


@contextmanager
def run_squid(*, access: str = "allow all", extra: str = "") -> Iterator[ProxyProcess]:
    """A Squid on 127.0.0.1 with `http_access <access>` (and `extra` config lines);
    SIGKILLed at exit (a clean stop takes ~2 s even with shutdown_lifetime 0)."""
    binary = find_binary("squid")
    assert binary is not None
    work = Path(tempfile.mkdtemp(prefix="egressd-squid-"))
    if os.geteuid() == 0:
        # Squid started as root drops to user `proxy`, which must write here.
        try:
            user = pwd.getpwnam("proxy")
            os.chown(work, user.pw_uid, user.pw_gid)
        except KeyError:
            work.chmod(0o777)
    try:
        for _attempt in range(5):
            port = _free_port()
            log = work / f"cache-{port}.log"
            conf = work / f"squid-{port}.conf"
            conf.write_text(
                f"http_port 127.0.0.1:{port}\n"
                f"pid_filename {work}/squid-{port}.pid\n"
                f"cache_log stdio:{log}\n"
                f"access_log stdio:{work}/access-{port}.log\n"
                "netdb_filename none\n"
                "cache deny all\n"
                "pinger_enable off\n"
                "shutdown_lifetime 0 seconds\n"
                f"http_access {access}\n"
                + extra
            )
            proc = subprocess.Popen([binary, "-N", "-f", str(conf)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                if _wait_ready(proc, log, f"local=127.0.0.1:{port} "):
                    yield ProxyProcess("127.0.0.1", port, work)
                    return
            finally:
                proc.kill()
                proc.wait()
        raise RuntimeError(f"squid could not bind a port; logs in {work}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def run_tinyproxy(*, connect_ports: tuple[int, ...] = (), extra: str = ""
                  ) -> Iterator[ProxyProcess]:
    """A tinyproxy on 127.0.0.1; `connect_ports` restricts CONNECT to those ports;
    `extra` is more config lines."""
    binary = find_binary("tinyproxy")
    assert binary is not None
    work = Path(tempfile.mkdtemp(prefix="egressd-tinyproxy-"))
    try:
        for _attempt in range(5):
            port = _free_port()
            log = work / f"tinyproxy-{port}.log"
            conf = work / f"tinyproxy-{port}.conf"
            conf.write_text(
                f"Port {port}\nListen 127.0.0.1\nAllow 127.0.0.1\nLogLevel Info\n"
                f'LogFile "{log}"\nMaxClients 100\n'
                + "".join(f"ConnectPort {p}\n" for p in connect_ports)
                + extra
            )
            proc = subprocess.Popen([binary, "-d", "-c", str(conf)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                if _wait_ready(proc, log, "Accepting connections"):
                    yield ProxyProcess("127.0.0.1", port, work)
                    return
            finally:
                proc.kill()
                proc.wait()
        raise RuntimeError(f"tinyproxy could not bind a port; logs in {work}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


@attrs.define
class Target:
    """A trio-served HTTP(S) endpoint answering every request with `status`."""

    port: int
    requests: list[h11.Request] = attrs.field(factory=list)


async def serve_target(status: int, ssl_context: ssl.SSLContext | None = None, *,
                       task_status: trio.TaskStatus[Target] = trio.TASK_STATUS_IGNORED
                       ) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    target = Target(port)
    wrapped: list[trio.abc.Listener[trio.abc.Stream]] = (
        [trio.SSLListener(ln, ssl_context, https_compatible=True) for ln in listeners]
        if ssl_context is not None else list(listeners))

    async def handle(stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(bytes(await stream.receive_some(16384)))
                elif isinstance(event, h11.Request):
                    target.requests.append(event)
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            headers = [("Connection", "close")]
            if status != 204:
                headers.append(("Content-Length", "0"))
            await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers))
                                  or b"")
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
        except (trio.BrokenResourceError, h11.RemoteProtocolError):
            pass  # the client may close as soon as it has the status line
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, wrapped)
        task_status.started(target)


async def serve_tcp(handler: Callable[[trio.SocketStream], Awaitable[None]], *,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `handler` on a loopback port (given to `task_status`); closes each
    connection when its handler returns."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            await handler(stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(listeners[0].socket.getsockname()[1])


async def read_head(stream: trio.abc.ReceiveStream) -> bytes:
    """Read up to the end of a request head (what a proxy needs before answering)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        data += chunk
    return data


def scripted_proxy(reply: bytes, *, then_hang: bool = False
                   ) -> Callable[[trio.SocketStream], Awaitable[None]]:
    """A misbehaving "proxy": reads the request head, sends `reply` (maybe
    nothing), then closes, or hangs if `then_hang`."""

    async def handle(stream: trio.SocketStream) -> None:
        await read_head(stream)
        if reply:
            await stream.send_all(reply)
        if then_hang:
            await trio.sleep_forever()

    return handle


async def serve_silent(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
                       ) -> None:
    """A "proxy" that accepts connections and never answers."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def handle(stream: trio.abc.Stream) -> None:
        async with stream:
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(listeners[0].socket.getsockname()[1])


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    return _free_port()
