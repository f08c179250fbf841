"""P8 and P9: the gateway against going straight to the same Squid.

P8, tunnel setup: one tunnel at a time, from the TCP connect to the proxy to
`200 Connection established` (through the gateway that includes a lease, a
connection to Squid and Squid's own CONNECT), then TLS with the target and a
`GET` answered 204; each measured in one blocking client, the same code for
both paths. P9, throughput: curl downloads one large file over TLS through
the tunnel, both ways, alternating.
"""

from __future__ import annotations

import base64
import socket
import ssl
import statistics
import subprocess
import time

import attrs


@attrs.frozen
class Upstream:
    """A forward proxy to tunnel through: host, port and Basic credentials (or none)."""

    host: str
    port: int
    user: str = ""
    password: str = ""

    def header(self) -> bytes:
        if not self.user:
            return b""
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return f"Proxy-Authorization: Basic {token}\r\n".encode()

    def url(self) -> str:
        auth = f"{self.user}:{self.password}@" if self.user else ""
        return f"http://{auth}{self.host}:{self.port}"


def _read_head(sock: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"the proxy closed the connection after {head!r}")
        head += chunk
    return head


def one_tunnel(proxy: Upstream, target: tuple[str, int], context: ssl.SSLContext
               ) -> tuple[float, float]:
    """(seconds to an established tunnel, seconds to the target's answer read)."""
    host, port = target
    start = time.perf_counter()
    with socket.create_connection((proxy.host, proxy.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
                     + proxy.header() + b"\r\n")
        head = _read_head(sock)
        if b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
            raise RuntimeError(f"CONNECT refused: {head.splitlines()[0]!r}")
        established = time.perf_counter()
        with context.wrap_socket(sock, server_hostname=host) as tls:
            tls.sendall(f"GET /generate_204 HTTP/1.1\r\nHost: {host}\r\n"
                        "Connection: close\r\n\r\n".encode())
            answer = _read_head(tls)
        if not answer.startswith(b"HTTP/1.1 2"):
            raise RuntimeError(f"the target answered {answer.splitlines()[0]!r}")
    return established - start, time.perf_counter() - start


def setup_times(proxy: Upstream, target: tuple[str, int], context: ssl.SSLContext, *,
                count: int) -> tuple[list[float], list[float]]:
    """Blocking: `count` tunnels one after another; their setup and total seconds."""
    setups, totals = [], []
    for _ in range(count):
        setup, total = one_tunnel(proxy, target, context)
        setups.append(setup)
        totals.append(total)
    return setups, totals


def download_rate(proxy: Upstream, url: str, *, ca_file: str) -> float:
    """Blocking: curl fetches `url` through `proxy`; bytes/s."""
    done = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "--cacert", ca_file, "--proxy", proxy.url(),
         "-w", "%{speed_download} %{http_code}", url],
        capture_output=True, text=True, check=False, timeout=120)
    speed, _, code = done.stdout.strip().partition(" ")
    if done.returncode != 0 or code != "200":
        raise RuntimeError(f"curl through {proxy.host}:{proxy.port} failed: {done.stderr}")
    return float(speed)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000 if samples else 0.0
