#!/usr/bin/env python3
"""Probe throughput through a local Squid, as ratios against baselines measured
in the same run (absolute numbers depend on the machine; ratios much less).

Runs a Squid and an nginx TLS target (trustme certificate, `return 204`) on
loopback, pins them to one core and this client to another (when there are at
least two), then measures probes/s for:

  prober   `Prober.probe` (trio streams + h11), C concurrent loops
  httpx    a fresh `httpx.AsyncClient` per probe through the same Squid (the
           alternative issue 7 measured), C concurrent loops
  engine   `HealthEngine` driving N proxies (distinct keys, same Squid) whose
           demand exceeds capacity, limited to C in flight: the engine's own
           overhead per probe shows as engine/prober

Not part of CI. Usage: python3 scripts/bench_probe.py [--seconds 10] [--rounds 10]
[--concurrency 64] [--proxies 3000] [--no-pin]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import httpx
import trio
import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from egressd.health.engine import HealthEngine
from egressd.health.probe import Prober, ProbeResult, ProbeTarget
from tests.health.peers import ProxyProcess, find_binary, run_squid


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def run_nginx(ca: trustme.CA) -> Iterator[tuple[int, int]]:
    """An nginx TLS target answering 204; yields (port, master pid)."""
    binary = find_binary("nginx")
    if binary is None:
        sys.exit("nginx is not installed (apt-get install nginx)")
    work = Path(tempfile.mkdtemp(prefix="egressd-bench-nginx-"))
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(work / "server.pem"))
    port = _free_port()
    temps = "".join(f"  {name}_temp_path {work}/{name};\n"
                    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (work / "nginx.conf").write_text(
        f"worker_processes 1;\ndaemon off;\npid {work}/nginx.pid;\n"
        f"error_log {work}/error.log;\nevents {{ worker_connections 4096; }}\n"
        f"http {{\n  access_log off;\n{temps}"
        f"  server {{\n    listen 127.0.0.1:{port} ssl;\n"
        f"    ssl_certificate {work}/server.pem;\n    ssl_certificate_key {work}/server.pem;\n"
        "    keepalive_timeout 0;\n    location / { return 204; }\n  }\n}\n")
    proc = subprocess.Popen([binary, "-p", str(work), "-c", str(work / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        import socket
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"nginx did not start; see {work}/error.log")
                time.sleep(0.01)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def _pin(pids: list[int], core: int) -> None:
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(pid)],
                       stdout=subprocess.DEVNULL, check=False)


@attrs.define
class Tally:
    """Successful probes, wall seconds and this process's CPU seconds of one mode."""

    done: int = 0
    failed: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    rates: list[float] = attrs.field(factory=list)

    def add(self, done: int, failed: int, wall: float, cpu: float) -> None:
        self.done += done
        self.failed += failed
        self.wall += wall
        self.cpu += cpu
        self.rates.append(done / wall)

    @property
    def rate(self) -> float:
        return self.done / self.wall

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu / max(self.done, 1)


async def _loops(probe: Callable[[], Awaitable[bool]], tally: Tally, *, concurrency: int,
                 seconds: float) -> None:
    done = failed = 0

    async def loop() -> None:
        nonlocal done, failed
        while True:
            if await probe():
                done += 1
            else:
                failed += 1

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(loop)
        # Like the engine rounds: skip the burst of the first connections.
        await trio.sleep(0.2)
        done0, failed0 = done, failed
        cpu, start = time.process_time(), trio.current_time()
        await trio.sleep(seconds)
        tally.add(done - done0, failed - failed0, trio.current_time() - start,
                  time.process_time() - cpu)
        nursery.cancel_scope.cancel()


async def bench(squid: ProxyProcess, target_port: int, ca_file: str, args: argparse.Namespace
                ) -> None:
    url = f"https://127.0.0.1:{target_port}/generate_204"
    prober = Prober(ca_file=ca_file)
    target = ProbeTarget(key="bench", host=squid.host, port=squid.port, url=url, timeout=10.0)

    async def one_prober() -> bool:
        return (await prober.probe(target)).ok

    ctx = ssl.create_default_context(cafile=ca_file)
    proxy_url = f"http://{squid.host}:{squid.port}"

    async def one_httpx() -> bool:
        async with httpx.AsyncClient(proxy=proxy_url, verify=ctx, timeout=10.0) as client:
            return (await client.get(url, headers={"Connection": "close"})).is_success

    count = 0

    async def counted(t: ProbeTarget) -> ProbeResult:
        nonlocal count
        result = await prober.probe(t)
        count += result.ok
        return result

    engine = HealthEngine(counted, on_change=lambda key: None, concurrency=args.concurrency,
                          rng=random.Random(0))
    for i in range(args.proxies):
        # Interval 5 s: the demand (proxies / 5 per second) must exceed what
        # the client can do, so the engine runs flat out.
        engine.upsert(ProbeTarget(key=f"px-{i}", host=squid.host, port=squid.port, url=url,
                                  interval=5.0, timeout=10.0))

    async def engine_round(tally: Tally, seconds: float) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            await trio.sleep(0.2)  # past the first tick's burst of task spawns
            start_count, start, cpu = count, trio.current_time(), time.process_time()
            await trio.sleep(seconds)
            tally.add(count - start_count, 0, trio.current_time() - start,
                      time.process_time() - cpu)
            nursery.cancel_scope.cancel()

    # Warm up (first TLS handshakes, Squid's first tunnels).
    await _loops(one_prober, Tally(), concurrency=4, seconds=0.5)

    # Short rounds, interleaved, so load from elsewhere on the machine
    # affects every mode alike. Client CPU per probe is the steadier figure
    # on a busy machine; probes/s is what a quiet one can sustain.
    modes: dict[str, Callable[[Tally, float], Awaitable[None]]] = {
        "prober": lambda t, sec: _loops(one_prober, t, concurrency=args.concurrency,
                                        seconds=sec),
        "httpx": lambda t, sec: _loops(one_httpx, t, concurrency=args.concurrency, seconds=sec),
        "engine": engine_round,
    }
    tallies = {mode: Tally() for mode in modes}
    for _ in range(args.rounds):
        for mode, run in modes.items():
            await run(tallies[mode], args.seconds / args.rounds)
    for mode, t in tallies.items():
        print(f"{mode:7}: {t.rate:7.0f} probes/s (rounds {min(t.rates):.0f}-{max(t.rates):.0f}),"
              f" client CPU {t.cpu_ms:.2f} ms/probe, failed {t.failed}")
    print(f"(engine: {args.proxies} proxies, interval 5 s, at most {args.concurrency} in flight)")
    print()
    p, h, e = tallies["prober"], tallies["httpx"], tallies["engine"]
    for name, a, b in (("prober / httpx ", p, h), ("engine / prober", e, p)):
        print(f"{name}: probes/s {a.rate / b.rate:.2f}, CPU per probe {a.cpu_ms / b.cpu_ms:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per mode, in total")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--proxies", type=int, default=3000)
    parser.add_argument("--no-pin", action="store_true",
                        help="leave CPU placement to the kernel (a busy shared machine)")
    args = parser.parse_args()
    if find_binary("squid") is None:
        sys.exit("squid is not installed (apt-get install squid)")
    ca = trustme.CA()
    with tempfile.TemporaryDirectory() as tmp:
        ca_file = os.path.join(tmp, "ca.pem")
        ca.cert_pem.write_to_path(ca_file)
        with run_squid() as squid, run_nginx(ca) as (target_port, nginx_pid):
            cores = sorted(os.sched_getaffinity(0))
            if len(cores) >= 2 and not args.no_pin:
                os.sched_setaffinity(0, {cores[0]})
                # Only our own processes: this Squid's unique config path, and
                # this nginx master and its workers.
                found = subprocess.run(["pgrep", "-f", f"squid-{squid.port}.conf"],
                                       capture_output=True, text=True).stdout.split()
                found += subprocess.run(["pgrep", "-P", str(nginx_pid)],
                                        capture_output=True, text=True).stdout.split()
                _pin([int(p) for p in found] + [nginx_pid], cores[1])
                print(f"client on core {cores[0]}, squid and nginx on core {cores[1]}")
            else:
                print("client, squid and nginx placed by the kernel")
            print(f"{args.seconds:g} s per mode in {args.rounds} interleaved rounds, "
                  f"{args.concurrency} concurrent\n")
            trio.run(bench, squid, target_port, ca_file, args)


if __name__ == "__main__":
    main()
