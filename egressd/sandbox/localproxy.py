"""Real forward-proxy processes on loopback for the sandbox: Squid, else tinyproxy.

    software = find_proxy_software()                 # ProxySoftwareMissing names the package
    async with open_local_proxy(software, host="127.0.0.10", port=3128) as proxy:
        ...                                          # proxy.url accepts CONNECT now
        await proxy.wait()                           # only if the process dies by itself

Squid gets the kubernetes provider's own `squid_conf` with local paths; a
process runs in its own session (a Ctrl-C in the terminal reaches the
sandbox, which stops its proxies itself) and is always stopped when the
block exits, cancelled or not. If the sandbox dies without stopping it
(SIGKILL), the process's watchdog kills it, and the next sandbox removes its
temp dir (`egressd.sandbox.orphans`).
"""

from __future__ import annotations

import functools
import logging
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Literal

import attrs
import trio

from egressd.errors import EgressdError
from egressd.providers.kubernetes import squid_conf
from egressd.sandbox.orphans import Watchdog, claim_temp_dir, release_temp_dir, start_watchdog

log = logging.getLogger(__name__)

# Debian puts squid in /usr/sbin, which a non-root PATH often lacks.
_SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
LOOPBACK_SOURCES = ("127.0.0.0/8",)

# Squid takes ~2 s to stop even with `shutdown_lifetime 0`; a sandbox proxy
# has nothing to flush, so it gets this long after SIGTERM, then SIGKILL.
STOP_GRACE = 0.5
START_TIMEOUT = 15.0
_POLL = 0.01


class ProxySoftwareMissing(EgressdError):
    """Raised when neither Squid nor tinyproxy is installed: the sandbox has no proxy to run."""


class ProxyStartFailed(EgressdError):
    """Raised when a proxy process exits, or does not accept connections, before it is ready."""


class AddressInUse(ProxyStartFailed):
    """Raised when another process already listens on the proxy's address and port.

    Another sandbox on the same machine can take an address between our
    check and our start; the caller tries the next address.
    """


@attrs.frozen
class ProxySoftware:
    """Which proxy program the sandbox runs, and where it is."""

    kind: Literal["squid", "tinyproxy"]
    binary: str


def find_proxy_software(path: str | None = None) -> ProxySoftware:
    """Squid if installed, else tinyproxy; `ProxySoftwareMissing` if neither is.

    `path` is the search path (default: $PATH plus the sbin directories).
    """
    search = path if path is not None else os.pathsep.join(
        [os.environ.get("PATH", ""), *_SBIN])
    kinds: tuple[Literal["squid", "tinyproxy"], ...] = ("squid", "tinyproxy")
    for kind in kinds:
        binary = shutil.which(kind, path=search)
        if binary:
            return ProxySoftware(kind=kind, binary=binary)
    raise ProxySoftwareMissing(
        "the sandbox runs real proxies but neither squid nor tinyproxy is installed: "
        "install one (apt-get install squid, or apt-get install tinyproxy)")


def tinyproxy_conf(*, host: str, port: int, allowed_sources: Sequence[str], log_file: str
                   ) -> str:
    """A tinyproxy 1.11 config: listen on `host:port`, serve only `allowed_sources`.

    No `ConnectPort` line, so CONNECT goes to any port, as with the Squid config.
    """
    return "".join([
        f"Port {port}\n",
        f"Listen {host}\n",
        *(f"Allow {source}\n" for source in allowed_sources),
        "LogLevel Info\n",
        f'LogFile "{log_file}"\n',
        "MaxClients 100\n",
        "DisableViaHeader Yes\n",
    ])


def _writable_by_squid(directory: str) -> None:
    # Squid started as root drops to its effective user (`proxy` on Debian)
    # before it opens its logs: that user must be able to write here.
    if os.geteuid() != 0:
        return
    try:
        user = pwd.getpwnam("proxy")
    except KeyError:
        os.chmod(directory, 0o777)  # noqa: S103 - a private temp dir; no `proxy` user to own it
        return
    os.chown(directory, user.pw_uid, user.pw_gid)


def _command(software: ProxySoftware, *, host: str, port: int, workdir: str,
             allowed_sources: Sequence[str]) -> tuple[list[str], str, str]:
    """The command line, the config written for it (its path ends the command) and its log."""
    if software.kind == "squid":
        log_file = os.path.join(workdir, "cache.log")
        text = squid_conf(port, listen_address=host, allowed_sources=allowed_sources,
                          access_log=f"stdio:{workdir}/access.log", cache_log=log_file,
                          pid_file=f"{workdir}/squid.pid")
        return [software.binary, "-N", "-f", os.path.join(workdir, "squid.conf")], text, log_file
    log_file = os.path.join(workdir, "tinyproxy.log")
    text = tinyproxy_conf(host=host, port=port, allowed_sources=allowed_sources,
                          log_file=log_file)
    return ([software.binary, "-d", "-c", os.path.join(workdir, "tinyproxy.conf")], text,
            log_file)


def _log_tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, errors="replace") as handle:
            tail = handle.read().splitlines()[-lines:]
    except OSError:
        return "(no log)"
    return " | ".join(line.strip() for line in tail) or "(empty log)"


@attrs.frozen
class LocalProxy:
    """A running proxy process."""

    kind: str
    host: str
    port: int
    pid: int
    workdir: str
    """Its config and logs (removed when it stops)."""
    _process: trio.Process = attrs.field(repr=False, alias="process")
    stopped: trio.Event = attrs.field(factory=trio.Event, repr=False, eq=False)
    """Set once the process has been stopped and reaped."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def wait(self) -> int:
        """Wait until the process exits by itself; its exit code."""
        return await self._process.wait()


async def _accepts(host: str, port: int) -> bool:
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError:
        return False  # refused (trio wraps it in an errno-less OSError): not listening yet
    await stream.aclose()
    return True


_LISTEN = "0A"
"""TCP_LISTEN as /proc/net/tcp prints the socket state."""


def _proc_address(host: str, port: int) -> str:
    # /proc/net/tcp prints the network-order address as a native-order integer.
    (value,) = struct.unpack("=I", socket.inet_aton(host))
    return f"{value:08X}:{port:04X}"


def listener_owned(pid: int, *, host: str, port: int) -> bool | None:
    """Whether process `pid` listens on `host:port`: True (it does), False (nobody
    does yet), None when we cannot tell (no /proc). Raises `AddressInUse` when
    another process listens there, or on every address at that port.
    """
    wanted = {_proc_address(host, port), _proc_address("0.0.0.0", port)}  # noqa: S104
    try:
        with open("/proc/net/tcp") as table:
            rows = table.read().splitlines()[1:]
    except OSError:
        return None
    listeners = {f"socket:[{fields[9]}]" for fields in (row.split() for row in rows)
                 if len(fields) > 9 and fields[1] in wanted and fields[3] == _LISTEN}
    if not listeners:
        return False
    ours = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with suppress(FileNotFoundError):  # a descriptor closed while we looked
                ours.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    except FileNotFoundError:
        pass  # the process is gone: the listener is another's
    except OSError:
        return None  # not ours to look at
    if ours & listeners:
        return True
    raise AddressInUse(f"another process already listens on {host}:{port}")


async def _wait_listening(process: trio.Process, *, host: str, port: int, describe: str
                          ) -> None:
    # A child process tells nothing when it listens. A connect attempt alone
    # is fooled by another process already listening there (another sandbox
    # that took the same address): the listening socket must be the child's
    # own. Connecting is the fallback where /proc cannot tell. Bounded by the
    # caller; stops at exit.
    while True:
        exit_code = process.returncode
        # Also after an exit: a process that could not bind is AddressInUse.
        owned = await trio.to_thread.run_sync(
            functools.partial(listener_owned, process.pid, host=host, port=port))
        if exit_code is not None:
            raise ProxyStartFailed(f"{describe} exited with code {exit_code}")
        if owned or (owned is None and await _accepts(host, port)):
            return
        await trio.sleep(_POLL)


def _signal_group(process: trio.Process, sig: signal.Signals) -> None:
    # Only before the process is reaped: afterwards its id may be reused.
    if process.returncode is not None:
        return
    with suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


async def stop_process(process: trio.Process, *, grace: float = STOP_GRACE) -> None:
    """SIGTERM the process's group, SIGKILL it after `grace` seconds, and reap it."""
    with trio.CancelScope(shield=True):
        _signal_group(process, signal.SIGTERM)
        with trio.move_on_after(grace):
            await process.wait()
        _signal_group(process, signal.SIGKILL)
        await process.wait()


@asynccontextmanager
async def open_local_proxy(
    software: ProxySoftware,
    *,
    host: str,
    port: int,
    allowed_sources: Sequence[str] = LOOPBACK_SOURCES,
    start_timeout: float = START_TIMEOUT,
) -> AsyncIterator[LocalProxy]:
    """Start a proxy on `host:port`; yields once it listens there itself; stops it on exit.

    Its config and logs live in a temp dir of its own, removed on exit.
    Raises `ProxyStartFailed` (with the end of its log) when the process
    dies or never listens.
    """
    # Under /tmp directly, not under the caller's private dir: Squid started
    # as root runs as `proxy`, which must reach this directory. Claimed (a held
    # lock), so a sandbox that was killed leaves a dir the next one removes.
    workdir, lock = await trio.to_thread.run_sync(
        claim_temp_dir, f"egressd-{software.kind}-")
    try:
        argv, text, log_file = _command(software, host=host, port=port, workdir=workdir,
                                        allowed_sources=allowed_sources)

        def prepare() -> None:
            with open(argv[-1], "w") as handle:
                handle.write(text)
            if software.kind == "squid":
                _writable_by_squid(workdir)

        await trio.to_thread.run_sync(prepare)
        address = f"{host}:{port}"
        proxy: LocalProxy | None = None
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        watchdog: Watchdog | None = None
        try:
            # Kills the proxy if this process dies without stopping it (SIGKILL).
            watchdog = await start_watchdog(process.pid, keep_fds=(lock,))
            describe = f"{software.kind} on {address}"
            try:
                with trio.move_on_after(start_timeout) as waiting:
                    await _wait_listening(process, host=host, port=port, describe=describe)
                if waiting.cancelled_caught:
                    raise ProxyStartFailed(
                        f"{describe} did not accept connections within {start_timeout:g} s")
            except ProxyStartFailed as exc:
                raise type(exc)(f"{exc}; log: {_log_tail(log_file)}") from None
            log.info("local proxy started",
                     extra={"kind": software.kind, "address": address, "pid": process.pid,
                            "workdir": workdir})
            proxy = LocalProxy(kind=software.kind, host=host, port=port, pid=process.pid,
                               workdir=workdir, process=process)
            yield proxy
        finally:
            await stop_process(process)
            if watchdog is not None:
                await watchdog.close()
            if proxy is not None:
                proxy.stopped.set()
            log.info("local proxy stopped",
                     extra={"kind": software.kind, "address": address, "pid": process.pid})
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(release_temp_dir, workdir, lock)
