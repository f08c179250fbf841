"""The processes a benchmark run starts: nginx, Squid, the daemon; pinning and RSS.

Two cores: the server under test (the daemon, the bare app, the probe engine)
runs on `Cores.server`; the load (wrk, the fake API server in the bench
process, Squid, the TLS target) on `Cores.load`. With one core both are the
same and the figures say so.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import trustme

from tests.health.peers import ProxyProcess, find_binary, run_squid

__all__ = ["Cores", "Daemon", "Nginx", "ProxyProcess", "free_port", "pin", "rss_kb",
           "run_nginx", "run_squid", "start_daemon"]


@attrs.frozen
class Cores:
    server: int
    load: int

    @property
    def pinned(self) -> bool:
        return self.server != self.load

    @classmethod
    def detect(cls, *, pin_cores: bool) -> Cores:
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) >= 2 and pin_cores:
            return cls(server=cores[0], load=cores[1])
        return cls(server=cores[0], load=cores[0])


def pin(pid: int, core: int) -> None:
    """Pin every thread of `pid` to `core` (taskset -a)."""
    subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(pid)],
                   stdout=subprocess.DEVNULL, check=False)


def pin_tree(pid: int, core: int) -> None:
    """Pin `pid` and its children (nginx workers, Squid helpers)."""
    pin(pid, core)
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                              text=True).stdout.split()
    for child in children:
        pin(int(child), core)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kb(pid: int) -> int:
    """Resident set size of `pid`, KiB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port: int, *, proc: subprocess.Popen[bytes] | None = None,
              timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port}") from None
            time.sleep(0.01)


@attrs.frozen
class Nginx:
    port: int
    pid: int


@contextmanager
def run_nginx(*, ca: trustme.CA | None, body: str = "", status: int = 204,
              big_file: int = 0) -> Iterator[Nginx]:
    """One nginx worker on 127.0.0.1 answering every request with `status` (and `body`).

    With `ca`: TLS with a certificate for 127.0.0.1 from that CA, no keep-alive
    (a probe target). Without: plain HTTP with keep-alive (wrk's ceiling).
    `big_file` bytes are served at `/big.bin` too.
    """
    binary = find_binary("nginx")
    if binary is None:
        raise RuntimeError("nginx is not installed (scripts/bench installs nginx-light)")
    work = Path(tempfile.mkdtemp(prefix="egressd-bench-nginx-"))
    port = free_port()
    temps = "".join(f"  {name}_temp_path {work}/{name};\n"
                    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    if ca is not None:
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
            str(work / "server.pem"))
        listen = (f"    listen 127.0.0.1:{port} ssl;\n"
                  f"    ssl_certificate {work}/server.pem;\n"
                  f"    ssl_certificate_key {work}/server.pem;\n    keepalive_timeout 0;\n")
    else:
        listen = (f"    listen 127.0.0.1:{port};\n    keepalive_requests 100000000;\n"
                  "    default_type application/json;\n")
    answer = f"return {status} '{body}';" if body else f"return {status};"
    if big_file:
        # P9's download: one large static file beside the constant answers.
        with (work / "big.bin").open("wb") as handle:
            handle.truncate(big_file)
        # nginx started as root serves as `nobody`: it must be able to read the file.
        work.chmod(0o755)
        (work / "big.bin").chmod(0o644)
        listen += f"    location = /big.bin {{ root {work}; }}\n"
    (work / "nginx.conf").write_text(
        f"worker_processes 1;\ndaemon off;\npid {work}/nginx.pid;\n"
        f"error_log {work}/error.log;\nevents {{ worker_connections 4096; }}\n"
        f"http {{\n  access_log off;\n{temps}"
        f"  server {{\n{listen}    location / {{ {answer} }}\n  }}\n}}\n")
    proc = subprocess.Popen([binary, "-p", str(work), "-c", str(work / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc=proc)
        yield Nginx(port=port, pid=proc.pid)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


@attrs.define
class Daemon:
    """An `egressd run` process: its discovery and ops URLs, its stderr log."""

    proc: subprocess.Popen[bytes]
    discovery: str
    ops: str
    gateway_port: int
    log: Path
    started_at: float

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> float:
        """SIGTERM; seconds until the process exited."""
        start = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the daemon ignored SIGTERM for 30 s; log {self.log}") from None
        return time.perf_counter() - start


def start_daemon(*, kubeconfig: str, token_file: str, ca_file: str, core: int,
                 workdir: Path, extra: tuple[str, ...] = ()) -> Daemon:
    """Start `egressd run` on `core` (pinned from its first instruction), gateway on."""
    discovery, ops, gateway = free_port(), free_port(), free_port()
    log = workdir / f"daemon-{discovery}.log"
    command = [sys.executable, "-m", "egressd", "run", "--kubeconfig", kubeconfig,
               "--discovery-addr", f"127.0.0.1:{discovery}",
               "--metrics-addr", f"127.0.0.1:{ops}", "--gateway-addr", f"127.0.0.1:{gateway}",
               "--discovery-token-file", token_file, "--probe-ca-file", ca_file,
               "--leader-elect", "false", "--log-level", "warning", *extra]
    if shutil.which("taskset"):
        command = ["taskset", "-c", str(core), *command]
    with log.open("wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    return Daemon(proc=proc, discovery=f"http://127.0.0.1:{discovery}",
                  ops=f"http://127.0.0.1:{ops}", gateway_port=gateway, log=log,
                  started_at=started)
