"""What a killed sandbox must not leave behind: its proxy processes and its temp dirs.

A sandbox stopped by a signal it can catch stops its proxies and removes its
files itself. One that is SIGKILLed (or crashes hard) cannot, so:

- every proxy process gets a *watchdog*, a tiny Python process that holds the
  read end of a pipe whose write end only the sandbox holds. When the sandbox
  dies, for any reason, the kernel closes that end, the watchdog reads EOF and
  SIGKILLs the proxy's process group. (`PR_SET_PDEATHSIG` cannot do this
  here: trio starts children from a worker thread, and the kernel sends the
  signal when that *thread* exits, seconds later; and Squid started as root
  drops to user `proxy`, which clears the setting.)
- every temp dir is *claimed*: it holds a `.lock` file kept under `flock` by
  the process that made it (and, for a proxy's dir, by its watchdog). The
  next sandbox to start removes every claimed dir whose lock nobody holds.
  Dirs without a `.lock` are never touched (another program's, or an older
  egressd still running).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import trio

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
PREFIXES = ("egressd-sandbox-", "egressd-squid-", "egressd-tinyproxy-")
"""The temp dirs the sandbox and its proxies make (all directly under the temp dir)."""
_CLAIM_ATTEMPTS = 8

# Run as `python -I -S -c _WATCHDOG PID` with stdin the read end of the sandbox's
# pipe. It exits as soon as the proxy exits (nothing left to guard), or kills the
# proxy's group (the proxy leads its own session: group id == pid) at EOF. While
# the proxy has not exited its pid cannot be reused, so the group is still ours.
_WATCHDOG = """\
import os, select, signal, sys
pid = int(sys.argv[1])
try:
    pidfd = os.pidfd_open(pid)
except ProcessLookupError:
    sys.exit(0)
while True:
    readable, _, _ = select.select([0, pidfd], [], [])
    if pidfd in readable:
        sys.exit(0)
    if not os.read(0, 512):
        if not select.select([pidfd], [], [], 0)[0]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        sys.exit(0)
"""


class Watchdog:
    """The watchdog of one process; `close()` once that process is stopped and reaped."""

    def __init__(self, process: trio.Process, write_end: int) -> None:
        self._process = process
        self._write_end: int | None = write_end

    @property
    def pid(self) -> int:
        return self._process.pid

    async def close(self) -> None:
        """Let the watchdog go (it exits: its proxy is gone) and reap it. Shielded."""
        with trio.CancelScope(shield=True):
            if self._write_end is not None:
                os.close(self._write_end)  # EOF; the proxy has exited, so nothing is killed
                self._write_end = None
            with trio.move_on_after(5):
                await self._process.wait()
            if self._process.returncode is None:
                self._process.kill()
                await self._process.wait()


async def start_watchdog(pid: int, *, keep_fds: tuple[int, ...] = ()) -> Watchdog:
    """Start the watchdog of process `pid`, which must lead its own process group.

    `keep_fds` are inherited by the watchdog (a temp dir's lock: held until the
    proxy is dead).
    """
    read_end, write_end = os.pipe()  # both non-inheritable: no other child holds them
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(pid)],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # Its own session: a Ctrl-C or a closed terminal reaches the sandbox
            # (which stops things in order), never the watchdog.
            start_new_session=True, pass_fds=keep_fds)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return Watchdog(process, write_end)


def claim_temp_dir(prefix: str, directory: str | None = None) -> tuple[str, int]:
    """A new temp dir under `directory` (default: the temp dir), and the fd of its
    held `.lock` (close it last).

    The lock is taken before anyone else can want it; a cleaner that raced us
    to it (and removed the dir) makes us try a fresh dir.
    """
    for _ in range(_CLAIM_ATTEMPTS):
        path = tempfile.mkdtemp(prefix=prefix, dir=directory)
        lock_path = os.path.join(path, LOCK_NAME)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:
            continue  # removed by a cleaner before we made the lock
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                return path, fd
        except (BlockingIOError, FileNotFoundError):
            pass  # a cleaner holds it, or removed it after we opened it
        os.close(fd)
    raise OSError(f"could not claim a temp dir {prefix}* in {tempfile.gettempdir()}")


def release_temp_dir(path: str, fd: int) -> None:
    """Remove a claimed dir, then drop its lock."""
    shutil.rmtree(path, ignore_errors=True)
    os.close(fd)


def remove_stale_temp_dirs(directory: str | None = None) -> list[str]:
    """Remove every claimed sandbox/proxy dir whose lock nobody holds; the removed paths."""
    base = directory or tempfile.gettempdir()
    removed = []
    for prefix in PREFIXES:
        for path in glob.glob(os.path.join(glob.escape(base), prefix + "*")):
            try:
                fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR)
            except OSError:
                continue  # unclaimed (not ours to judge) or not readable by us
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # in use by a live sandbox or proxy
            release_temp_dir(path, fd)
            removed.append(path)
    if removed:
        log.info("removed temp dirs a killed sandbox left", extra={"count": len(removed)})
    return removed


@contextlib.contextmanager
def claimed_temp_dir(prefix: str) -> Iterator[str]:
    """`claim_temp_dir` as a context manager that removes the dir at exit."""
    path, fd = claim_temp_dir(prefix)
    try:
        yield path
    finally:
        release_temp_dir(path, fd)
