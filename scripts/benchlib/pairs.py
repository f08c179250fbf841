"""P2: the median cost of one acquire + release, one pair at a time.

Through HTTP: a blocking keep-alive client on a raw socket (a few tens of
microseconds of its own per request, the same at every fleet size) times each
pair from the acquire's first byte sent to the release's answer read. At the
store level: the lease store alone, with the fleet's candidates.
"""

from __future__ import annotations

import random
import socket
import statistics
import time
from typing import Any

import attrs
import trio

from benchlib.wrk import LEASE_BODY
from egressd.leases import Candidate, Grant
from egressd.leases.store import MemoryLeaseStore


class _Conn:
    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.sock = self._connect()
        self.buffer = b""
        self.closing = False
        self.auth = f"Authorization: Bearer {token}\r\n".encode()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.closing:  # Hypercorn ends a connection after keep_alive_max_requests
            self.sock.close()
            self.sock, self.buffer, self.closing = self._connect(), b"", False
        head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n").encode() + self.auth + b"\r\n"
        self.sock.sendall(head + body)
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        raw_head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = raw_head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                self.closing = True
        while len(self.buffer) < length:
            self._fill()
        payload, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, payload

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


def _lease_id(payload: bytes) -> str:
    marker = b'"leaseId":"'
    start = payload.index(marker) + len(marker)
    return payload[start:payload.index(b'"', start)].decode()


def http_pairs(port: int, *, token: str, seconds: float, warmup: int = 20) -> list[float]:
    """Blocking: sequential acquire+release pairs for `seconds`; each pair's seconds."""
    conn = _Conn(port, token)
    body = LEASE_BODY.encode()
    samples: list[float] = []
    try:
        deadline = time.perf_counter() + seconds
        count = 0
        while time.perf_counter() < deadline or count < warmup + 10:
            start = time.perf_counter()
            status, payload = conn.request("POST", "/v1/leases", body)
            if status != 201:
                raise RuntimeError(f"acquire answered {status}: {payload[:200]!r}")
            status, _ = conn.request("DELETE", f"/v1/leases/{_lease_id(payload)}")
            if status != 204:
                raise RuntimeError(f"release answered {status}")
            count += 1
            if count > warmup:
                samples.append(time.perf_counter() - start)
    finally:
        conn.close()
    return samples


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000 if samples else 0.0


async def store_pair_ms(size: int, *, seconds: float) -> float:
    """Median acquire+release at the lease store with `size` leasable candidates."""
    rng = random.Random(size)
    store: Any = MemoryLeaseStore(cooldown=600, ban_cooldown=3600, max_cooldown=3600)
    # The store before and after issue 12's index: candidates passed per acquire,
    # or fed once (put_candidate, as the cache does) and matched by selector.
    extra = ({"attributes": {"bench": "true", "zone": "z0"}}
             if "attributes" in attrs.fields_dict(Candidate) else {})
    candidates = [Candidate(key=f"bench/px-{i:05d}", max_leases=10,
                            latency_ms=rng.uniform(5, 500), **extra) for i in range(size)]
    if hasattr(store, "put_candidate"):
        for candidate in candidates:
            store.put_candidate(candidate)

        def acquire() -> Any:
            return store.acquire({"bench": "true"}, target="example.org", ttl=60)
    else:
        def acquire() -> Any:
            return store.acquire(candidates, target="example.org", ttl=60)
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 20:
        start = time.perf_counter()
        grant = await acquire()
        assert isinstance(grant, Grant)
        await store.release(grant.lease.id)
        samples.append(time.perf_counter() - start)
        await trio.lowlevel.checkpoint()
    return median_ms(samples)
