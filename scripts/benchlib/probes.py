"""P3: health-engine probes/s against a minimal raw probe loop, in one process on one core.

    python -m benchlib.probes --proxy HOST:PORT --url URL --ca CA [--seconds S]

Prints one JSON line {"engine": probes/s, "raw": probes/s, ...}. `engine` is
egressd's `HealthEngine` driving `Prober.probe` over many proxies (distinct
keys, the same Squid) whose demand exceeds what one core can probe, at the
daemon's default concurrency; `raw` is the least a probe can be on trio: a TCP
connection to the proxy, `CONNECT`, TLS with one shared context, a `GET`, read
the status line, close — at the same concurrency. The modes alternate in short
rounds so that load elsewhere on the machine touches both alike.
"""

from __future__ import annotations

import argparse
import json
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import trio

from egressd.health.engine import HealthEngine
from egressd.health.probe import Prober, ProbeResult, ProbeTarget, make_ssl_context

ENGINE_PROXIES = 3000
ENGINE_INTERVAL = 5.0
"""3000 proxies every 5 s ask for 600 probes/s more than one core does: the engine runs flat out."""


async def raw_probe(proxy: tuple[str, int], url: str, context: ssl.SSLContext) -> bool:
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(*proxy)
        try:
            await stream.send_all(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}"
                                  "\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return False
                head += chunk
            if not head.startswith(b"HTTP/1.1 200") and not head.startswith(b"HTTP/1.0 200"):
                return False
            tls = trio.SSLStream(stream, context, server_hostname=host)
            await tls.send_all(f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {host}\r\n"
                               "Connection: close\r\n\r\n".encode())
            answer = b""
            while b"\r\n" not in answer:
                chunk = await tls.receive_some(4096)
                if not chunk:
                    break
                answer += chunk
            return answer[9:10] == b"2"
        finally:
            await trio.aclose_forcefully(stream)


async def _loops(probe: Callable[[], Awaitable[bool]], *, concurrency: int,
                 seconds: float) -> tuple[int, float]:
    done = 0

    async def loop() -> None:
        nonlocal done
        while True:
            ok = await probe()  # not `done += await ...`: that reads `done` before awaiting
            done += ok

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(loop)
        await trio.sleep(0.2)  # past the first handshakes' burst
        start_done, start = done, trio.current_time()
        await trio.sleep(seconds)
        counted = done - start_done, trio.current_time() - start
        nursery.cancel_scope.cancel()
    return counted


async def _engine_round(prober: Prober, targets: list[ProbeTarget], *, concurrency: int,
                        seconds: float) -> tuple[int, float]:
    count = 0

    async def counted(target: ProbeTarget) -> ProbeResult:
        nonlocal count
        result = await prober.probe(target)
        count += result.ok
        return result

    engine = HealthEngine(counted, on_change=lambda key: None, concurrency=concurrency,
                          rng=random.Random(0))
    for target in targets:
        engine.upsert(target)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await trio.sleep(0.2)
        start_count, start = count, trio.current_time()
        await trio.sleep(seconds)
        counted_ = count - start_count, trio.current_time() - start
        nursery.cancel_scope.cancel()
    return counted_


async def measure(args: argparse.Namespace) -> dict[str, float]:
    host, _, port = args.proxy.rpartition(":")
    proxy = (host, int(port))
    context = make_ssl_context(args.ca)
    prober = Prober(ssl_context=context)
    targets = [ProbeTarget(key=f"px-{i}", host=host, port=int(port), url=args.url,
                           interval=ENGINE_INTERVAL, timeout=10.0)
               for i in range(ENGINE_PROXIES)]
    totals = {"engine": [0, 0.0], "raw": [0, 0.0]}
    cpu = {"engine": 0.0, "raw": 0.0}
    await _loops(lambda: raw_probe(proxy, args.url, context), concurrency=4, seconds=0.3)
    per_round = args.seconds / args.rounds
    for _ in range(args.rounds):
        for mode in ("raw", "engine"):
            before = time.process_time()
            if mode == "raw":
                done, wall = await _loops(lambda: raw_probe(proxy, args.url, context),
                                          concurrency=args.concurrency, seconds=per_round)
            else:
                done, wall = await _engine_round(prober, targets, concurrency=args.concurrency,
                                                 seconds=per_round)
            cpu[mode] += time.process_time() - before
            totals[mode][0] += done
            totals[mode][1] += wall
    out: dict[str, float] = {}
    for mode, (done, wall) in totals.items():
        out[mode] = round(done / wall, 1) if wall else 0.0
        out[f"{mode}_cpu_ms_per_probe"] = round(1000 * cpu[mode] / max(done, 1), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    print(json.dumps(trio.run(measure, args)), flush=True)


if __name__ == "__main__":
    main()
