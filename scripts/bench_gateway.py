"""Gateway benchmark (issue 15 item 8): tunnel setups/s and relay throughput through the
gateway versus straight to the same Squid, side by side in one run.

    .venv/bin/python scripts/bench_gateway.py [--seconds S] [--mib M] [--concurrency N]

Prints a markdown table and one JSON line: `setup_ratio` (gateway setups/s over
direct, goal >= 0.6) and `throughput_ratio` (goal >= 0.8), the absolute figures
beside them, and the load generator's own ceiling (setups/s straight to a bare
TCP listener, no proxy at all).

Processes: the gateway runs alone on one core (`taskset`); Squid, the target and
this load generator share the other. A setup is: TCP connect, `CONNECT target`,
read the `200`, close; the target accepts and waits for EOF. Throughput is one
tunnel reading `--mib` MiB that the target writes as fast as it can. Direct and
gateway rounds alternate so that load elsewhere on the machine touches both alike.

On a machine that other work loads too, the rates follow the scheduler more than
the code (each setup through the gateway is two more process wake-ups); the CPU
the gateway spends per setup and per MiB, also printed, is the figure that says
what one core of it can do (1000 / ms-per-setup setups/s).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOKEN = "bench-token"
AUTH = "Basic " + base64.b64encode(f"egressd:{TOKEN}".encode()).decode()
CHUNK = 4 * 1024 * 1024


# --- the target (a separate process): a holding port and a flooding port ----------------

def serve_target(port_file: str) -> None:
    hold = socket.create_server(("127.0.0.1", 0), backlog=4096)
    flood = socket.create_server(("127.0.0.1", 0), backlog=128)
    Path(port_file).write_text(json.dumps([hold.getsockname()[1], flood.getsockname()[1]]))

    def held(conn: socket.socket) -> None:
        with conn:
            while conn.recv(65536):
                pass

    def flooded(conn: socket.socket) -> None:
        data = memoryview(b"\0" * CHUNK)
        with conn:
            try:
                want = int(conn.recv(64).decode())
                while want > 0:
                    conn.sendall(data[:min(CHUNK, want)])
                    want -= CHUNK
                conn.shutdown(socket.SHUT_WR)
                while conn.recv(65536):
                    pass
            except OSError:
                pass

    def accept(sock: socket.socket, handler: object) -> None:
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=handler, args=(conn,), daemon=True).start()  # type: ignore[arg-type]

    threading.Thread(target=accept, args=(flood, flooded), daemon=True).start()
    accept(hold, held)


# --- the gateway (a separate process, pinned to its own core) ------------------------------

def serve_gateway(squid: str, port_file: str) -> None:
    from egressd import logs
    from egressd.gateway.fleet import SourceFleet
    from egressd.gateway.server import Gateway, GatewayConfig, listen
    from egressd.leases.store import MemoryLeaseStore
    from tests.http.support import MemorySource, make_proxy

    logs.setup("warning")
    host, _, port = squid.rpartition(":")
    source = MemorySource([make_proxy("squid", host=host, port=int(port), max_leases=100000)])
    store = MemoryLeaseStore(cooldown=600, ban_cooldown=3600, max_cooldown=3600)
    gateway = Gateway(fleet=SourceFleet(source), store=store, token=TOKEN,
                      config=GatewayConfig(max_tunnels=100000))

    async def main() -> None:
        listener = listen("127.0.0.1:0")
        await trio.Path(port_file).write_text(str(listener.socket.getsockname()[1]))
        await gateway.serve(listener)

    trio.run(main)


# --- the load ------------------------------------------------------------------------------

async def read_head(stream: trio.SocketStream) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise EOFError(head)
        head += chunk
    return head


async def setup_once(proxy: int, target: int, *, auth: bool, bare: bool) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", proxy)
    try:
        if bare:
            return
        extra = f"Proxy-Authorization: {AUTH}\r\n" if auth else ""
        await stream.send_all(f"CONNECT 127.0.0.1:{target} HTTP/1.1\r\nHost: 127.0.0.1:"
                              f"{target}\r\n{extra}\r\n".encode())
        head = await read_head(stream)
        if head[9:12] != b"200":
            raise RuntimeError(head[:80])
    finally:
        await trio.aclose_forcefully(stream)


async def setups_per_s(proxy: int, target: int, *, auth: bool, bare: bool = False,
                       seconds: float, concurrency: int) -> float:
    done = 0

    async def loop() -> None:
        nonlocal done
        while True:
            await setup_once(proxy, target, auth=auth, bare=bare)
            done += 1

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(loop)
        await trio.sleep(0.3)
        start_done, start = done, time.perf_counter()
        await trio.sleep(seconds)
        rate = (done - start_done) / (time.perf_counter() - start)
        nursery.cancel_scope.cancel()
    await trio.sleep(0.5)  # let the closes settle before the next round
    return rate


async def download_mib_s(proxy: int, target: int, *, auth: bool, mib: int) -> float:
    want = mib * 1024 * 1024
    stream = await trio.open_tcp_stream("127.0.0.1", proxy)
    async with stream:
        extra = f"Proxy-Authorization: {AUTH}\r\n" if auth else ""
        await stream.send_all(f"CONNECT 127.0.0.1:{target} HTTP/1.1\r\nHost: 127.0.0.1:"
                              f"{target}\r\n{extra}\r\n".encode())
        head = await read_head(stream)
        got = len(head.partition(b"\r\n\r\n")[2])
        start = time.perf_counter()
        await stream.send_all(str(want).encode().ljust(64))
        while got < want:
            data = await stream.receive_some(1024 * 1024)
            if not data:
                raise EOFError(f"{got} of {want} bytes")
            got += len(data)
        return mib / (time.perf_counter() - start)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` so far (all threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pid: int, core: int) -> None:
    if core < 0:
        return
    subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(pid)],
                   stdout=subprocess.DEVNULL, check=False)


def wait_file(path: str) -> str:
    for _ in range(500):
        text = Path(path).read_text() if os.path.exists(path) else ""
        if text:
            return text
        time.sleep(0.02)
    raise RuntimeError(f"{path} never written")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per setup round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=512, help="per download")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--no-pin", action="store_true", help="run everything on every core")
    parser.add_argument("--serve-target", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--serve-gateway", nargs=2, metavar=("SQUID", "PORT_FILE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_target:
        serve_target(args.serve_target)
        return 0
    if args.serve_gateway:
        serve_gateway(*args.serve_gateway)
        return 0

    from tests.health.peers import run_squid

    cores = sorted(os.sched_getaffinity(0))
    gw_core, load_core = (cores[0], cores[1]) if len(cores) > 1 else (cores[0], cores[0])
    if args.no_pin:
        gw_core = load_core = -1
    work = tempfile.mkdtemp(prefix="egressd-bench-gw-")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with run_squid() as squid:
            out = subprocess.run(["pgrep", "-f", f"squid-{squid.port}.conf"],
                                 capture_output=True, text=True).stdout.split()
            for pid in out:
                pin(int(pid), load_core)
            target_file, gw_file = f"{work}/target", f"{work}/gateway"
            procs.append(subprocess.Popen([sys.executable, __file__, "--serve-target",
                                           target_file]))
            pin(procs[-1].pid, load_core)
            procs.append(subprocess.Popen([sys.executable, __file__, "--serve-gateway",
                                           f"{squid.host}:{squid.port}", gw_file]))
            pin(procs[-1].pid, gw_core)
            pin(os.getpid(), load_core)
            hold, flood = json.loads(wait_file(target_file))
            gateway = int(wait_file(gw_file))
            squid_pid = int(out[-1]) if out else None
            results = trio.run(_measure, args, squid.port, gateway, hold, flood,
                               procs[-1].pid, squid_pid)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    results["cores"] = {"gateway": gw_core, "load": load_core, "pinned": gw_core != load_core}
    print(_table(results))
    print(json.dumps(results))
    return 0


async def _measure(args: argparse.Namespace, squid: int, gateway: int, hold: int,
                   flood: int, gateway_pid: int, squid_pid: int | None) -> dict[str, object]:
    direct, through, bare = [], [], []
    kw = {"seconds": args.seconds, "concurrency": args.concurrency}
    # CPU per setup as well as setups/s: on a machine that others load too, the rate
    # depends on the scheduler, the CPU a setup costs the gateway much less.
    gw_cpu = squid_cpu = 0.0
    gw_setups = squid_setups = 0.0
    for _ in range(args.rounds):
        before = cpu_seconds(squid_pid) if squid_pid else 0.0
        direct.append(await setups_per_s(squid, hold, auth=False, **kw))
        if squid_pid:
            squid_cpu += cpu_seconds(squid_pid) - before
            squid_setups += direct[-1] * args.seconds
        before = cpu_seconds(gateway_pid)
        through.append(await setups_per_s(gateway, hold, auth=True, **kw))
        gw_cpu += cpu_seconds(gateway_pid) - before
        gw_setups += through[-1] * args.seconds
    bare.append(await setups_per_s(hold, hold, auth=False, bare=True, **kw))
    d_mib, g_mib = [], []
    gw_relay_cpu = squid_relay_cpu = 0.0
    for _ in range(args.rounds):
        before = cpu_seconds(squid_pid) if squid_pid else 0.0
        d_mib.append(await download_mib_s(squid, flood, auth=False, mib=args.mib))
        if squid_pid:
            squid_relay_cpu += cpu_seconds(squid_pid) - before
        before = cpu_seconds(gateway_pid)
        g_mib.append(await download_mib_s(gateway, flood, auth=True, mib=args.mib))
        gw_relay_cpu += cpu_seconds(gateway_pid) - before
    relayed = args.rounds * args.mib
    med = sorted
    direct_s, through_s = med(direct)[len(direct) // 2], med(through)[len(through) // 2]
    direct_t, through_t = med(d_mib)[len(d_mib) // 2], med(g_mib)[len(g_mib) // 2]
    return {
        "setup_ratio": round(through_s / direct_s, 3),
        "throughput_ratio": round(through_t / direct_t, 3),
        "setups_per_s": {"direct": round(direct_s), "gateway": round(through_s),
                         "load_generator_ceiling": round(bare[0])},
        "throughput_mib_s": {"direct": round(direct_t), "gateway": round(through_t)},
        # Both include the warm-up and settle time of each round (same for both).
        "cpu_ms_per_setup": {"gateway": round(1000 * gw_cpu / max(gw_setups, 1), 3),
                             "squid": round(1000 * squid_cpu / max(squid_setups, 1), 3)},
        # CPU per MiB relayed: the gateway's alone (its Squid hop is counted under direct).
        "cpu_ms_per_mib": {"gateway": round(1000 * gw_relay_cpu / relayed, 3),
                           "squid": round(1000 * squid_relay_cpu / relayed, 3)},
        "rounds": {"setups_direct": [round(x) for x in direct],
                   "setups_gateway": [round(x) for x in through],
                   "mib_s_direct": [round(x) for x in d_mib],
                   "mib_s_gateway": [round(x) for x in g_mib]},
        "concurrency": args.concurrency,
    }


def _table(r: dict[str, object]) -> str:
    s: dict[str, int] = r["setups_per_s"]  # type: ignore[assignment]
    t: dict[str, int] = r["throughput_mib_s"]  # type: ignore[assignment]
    c: dict[str, float] = r["cpu_ms_per_setup"]  # type: ignore[assignment]
    m: dict[str, float] = r["cpu_ms_per_mib"]  # type: ignore[assignment]
    return "\n".join([
        "| figure | direct to Squid | through the gateway | ratio | goal |",
        "|---|---|---|---|---|",
        f"| tunnel setups/s | {s['direct']} | {s['gateway']} | {r['setup_ratio']} | >= 0.6 |",
        f"| relay MiB/s | {t['direct']} | {t['gateway']} | {r['throughput_ratio']} | >= 0.8 |",
        f"| load generator ceiling (bare TCP connects/s) | {s['load_generator_ceiling']} | | | |",
        f"| CPU ms per setup (Squid; gateway) | {c['squid']} | {c['gateway']} | | |",
        f"| CPU ms per MiB relayed (Squid; gateway) | {m['squid']} | {m['gateway']} | | |",
    ])


if __name__ == "__main__":
    sys.exit(main())
