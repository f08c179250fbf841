"""The phases of a benchmark run, each returning its keys of bench-results.json."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from benchlib import gateway as gw
from benchlib import pairs
from benchlib.bare import GRANT
from benchlib.fleet import Fleet, proxy, without_cel
from benchlib.procs import (
    Cores,
    Daemon,
    Nginx,
    ProxyProcess,
    cpu_seconds,
    free_port,
    pin,
    pin_tree,
    rss_kb,
    run_nginx,
    start_daemon,
    wait_port,
)
from benchlib.profile import top_costs
from benchlib.wrk import WrkResult, run_wrk, write_script
from egressd.health.probe import make_ssl_context
from egressd.kube.client import KubeClient, open_client
from egressd.kube.config import load_config
from egressd.kube.errors import AlreadyExists
from egressd.kube.resources import NAMESPACES, PROXIES
from egressd.sandbox.apiserver import FakeApiServer
from egressd.sandbox.apiserver.crd import proxy_crd

P6_SIZE = 1000
CREATE_AT_MOST = 1000
"""Larger fleets are seeded Ready (`Fleet.seed`) instead of created and probed: the fake
API server's ~10 ms per write would make 10,000 proxies' first writes last minutes."""
FAST_PROBED = 0.1
"""Share of the largest fleet probed every FAST_INTERVAL in the watchdog window."""
FAST_INTERVAL = 5
PAIR_ROUNDS = 3
BIG_FILE = 256 * 1024 * 1024
"""Bytes of P9's download through a tunnel."""
TUNNELS = 60
"""P8's tunnels per path and size, in rounds of 10 alternating gateway and Squid."""


_START = time.perf_counter()


def say(message: str) -> None:
    """Progress on stderr (the table goes to stdout at the end)."""
    print(f"[bench {time.perf_counter() - _START:5.0f} s] {message}", file=sys.stderr, flush=True)


@attrs.define
class Env:
    args: argparse.Namespace
    cores: Cores
    workdir: Path
    squid: ProxyProcess
    target_port: int
    probe_url: str
    ca_file: str
    token: str = attrs.field(factory=lambda: secrets.token_urlsafe(24))

    @property
    def script(self) -> Path:
        path = self.workdir / "lease.lua"
        return path if path.exists() else write_script(self.workdir)

    def child_env(self) -> dict[str, str]:
        scripts = str(Path(__file__).resolve().parents[1])
        repo = str(Path(__file__).resolve().parents[2])
        return {**os.environ, "PYTHONPATH": os.pathsep.join([scripts, repo])}


def pin_peers(env: Env, target: Nginx) -> None:
    if not env.cores.pinned:
        return
    squids = subprocess.run(["pgrep", "-f", f"squid-{env.squid.port}.conf"],
                            capture_output=True, text=True).stdout.split()
    for pid in squids:
        pin(int(pid), env.cores.load)
    pin_tree(target.pid, env.cores.load)


async def wrk(env: Env, url: str, connections: int, seconds: float | None = None) -> WrkResult:
    return await trio.to_thread.run_sync(functools.partial(
        run_wrk, url, script=env.script, connections=connections,
        seconds=seconds or env.args.seconds, token=env.token,
        core=env.cores.load if env.cores.pinned else None))


async def loadgen_ceiling(env: Env) -> dict[str, Any]:
    """wrk and the Lua script against nginx answering a constant grant: wrk's own ceiling."""
    say("wrk's own ceiling against nginx")
    with run_nginx(ca=None, body=GRANT, status=201) as ceiling:
        if env.cores.pinned:
            pin_tree(ceiling.pid, env.cores.server)
        result = await wrk(env, f"http://127.0.0.1:{ceiling.port}", 64,
                           seconds=min(env.args.seconds, 5))
    return {"loadgen_ceiling_req_s": round(result.rate, 1)}


async def probes(env: Env) -> dict[str, Any]:
    say("P3 probes: health engine against a raw CONNECT+TLS loop")
    command = [sys.executable, "-m", "benchlib.probes",
               "--proxy", f"{env.squid.host}:{env.squid.port}", "--url", env.probe_url,
               "--ca", env.ca_file, "--seconds", str(env.args.probe_seconds)]
    if env.cores.pinned:
        command = ["taskset", "-c", str(env.cores.server), *command]
    done = await trio.run_process(command, capture_stdout=True, env=env.child_env())
    raw = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return {"p3_probes_per_s": raw["engine"], "p3_raw_probes_per_s": raw["raw"],
            "p3_ratio": round(raw["engine"] / raw["raw"], 3) if raw["raw"] else 0.0,
            "p3_cpu_ms_per_probe": {"engine": raw["engine_cpu_ms_per_probe"],
                                    "raw": raw["raw_cpu_ms_per_probe"]}}


# --- the daemon -----------------------------------------------------------------


async def _get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30.0) as http:
        return await http.get(url)


async def wait_ready(daemon: Daemon) -> float:
    """Seconds from the process start to `/readyz` 200 (polled every 5 ms, for 60 s)."""
    port = int(daemon.ops.rsplit(":", 1)[1])
    request = b"GET /readyz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    with trio.fail_after(60):
        while True:
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited; see {daemon.log}:\n"
                                   + daemon.log.read_text()[-2000:])
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(request)
                    head = await stream.receive_some(64)
                if head.startswith(b"HTTP/1.1 200"):
                    return time.perf_counter() - daemon.started_at
            except OSError:
                pass
            await trio.sleep(0.005)


async def scrape(daemon: Daemon) -> dict[str, float]:
    """The daemon's watchdog gauges and probe counters from /metrics."""
    text = (await _get(f"{daemon.ops}/metrics")).text
    found: dict[str, float] = {"probes": 0.0}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == "egressd_loop_lag_p99_seconds":
            found["lag_p99_ms"] = float(value) * 1000
        elif name == "egressd_loop_lag_max_seconds":
            found["lag_max_ms"] = float(value) * 1000
        elif name.startswith("egressd_probes_total{"):
            found["probes"] += float(value)
    return found


@attrs.define
class Run:
    """The state of the fleet phase: the API server, the client, the daemon."""

    env: Env
    server: FakeApiServer
    fleet: Fleet
    client: KubeClient
    kubeconfig: str
    token_file: str
    daemon: Daemon | None = None
    bare_port: int = 0
    results: dict[str, Any] = attrs.field(factory=dict)

    async def start_daemon(self, *, profile: Path | None = None) -> float:
        self.daemon = start_daemon(
            kubeconfig=self.kubeconfig, token_file=self.token_file, ca_file=self.env.ca_file,
            core=self.env.cores.server, workdir=self.env.workdir)
        if profile is None:
            return await wait_ready(self.daemon)
        # py-spy attaches within a few ms of the exec: the start's profile, imports on.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(
                trio.run_process, _spy_command(self.daemon.pid, 6, profile),
                capture_stdout=True, capture_stderr=True, check=False))
            took = await wait_ready(self.daemon)
        self.results.setdefault("profile", {})["start"] = str(profile)
        return took

    @property
    def url(self) -> str:
        assert self.daemon is not None
        return self.daemon.discovery


async def fleet(env: Env) -> dict[str, Any]:
    server = FakeApiServer(history_limit=100_000, install_proxy_crd=False,
                           crds=[without_cel(proxy_crd())])
    watched = Fleet(server)
    bare = _start_bare(env)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            kubeconfig = server.write_kubeconfig(env.workdir / "kubeconfig")
            token_file = env.workdir / "token"
            token_file.write_text(env.token)
            config = await load_config(kubeconfig=kubeconfig, context=None)
            async with open_client(config) as client:
                run = Run(env=env, server=server, fleet=watched, client=client,
                          kubeconfig=kubeconfig, token_file=str(token_file),
                          bare_port=bare[1])
                try:
                    await _grow(run)
                finally:
                    if run.daemon is not None and run.daemon.proc.poll() is None:
                        run.daemon.stop()
            nursery.cancel_scope.cancel()
    finally:
        bare[0].terminate()
        bare[0].wait()
    return run.results


def _start_bare(env: Env) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    command = [sys.executable, "-m", "benchlib.bare", str(port)]
    if env.cores.pinned:
        command = ["taskset", "-c", str(env.cores.server), *command]
    proc = subprocess.Popen(command, env=env.child_env(), stdout=subprocess.DEVNULL)
    wait_port(port, proc=proc)
    return proc, port


async def _grow(run: Run) -> None:
    env, results = run.env, run.results
    say("starting the daemon with no proxies (P7)")
    await run.start_daemon()
    assert run.daemon is not None
    await trio.sleep(min(2.0, env.args.seconds))  # settle: what is idle is idle
    idle_kb = rss_kb(run.daemon.pid)
    results["p7_idle_rss_mb"] = round(idle_kb / 1024, 1)
    for key in ("p1_rows", "p4_rows", "p5_rows"):
        results[key] = []
    results["p2_http_ms"], results["p2_store_ms"], results["p2_bare_ms"] = {}, {}, {}
    previous = ""
    p6_size = P6_SIZE if P6_SIZE in env.args.sizes else env.args.sizes[len(env.args.sizes) // 2]
    for size in env.args.sizes:
        namespace = f"bench-{size}"
        template = run.server.get(PROXIES.api_version, PROXIES.kind, "px-00000",
                                  namespace=previous) if previous else None
        if previous:
            run.fleet.delete_namespace(previous)
        previous = namespace
        if size > CREATE_AT_MOST and template is not None:
            say(f"seeding {size:,} Ready External Proxies (the shortcut above "
                f"{CREATE_AT_MOST:,})")
            await _seed(run, namespace, size, template)
        else:
            say(f"P4: creating {size:,} External Proxies until every one is leasable")
            await _step(run, namespace, size)
        say(f"P1, P2 at {size:,} proxies")
        results["p5_rows"].append({
            "size": size, "rss_mb": round(rss_kb(run.daemon.pid) / 1024, 1),
            "kb_per_proxy": round((rss_kb(run.daemon.pid) - idle_kb) / size, 2)})
        results["p1_rows"].append(await _leases(run, size))
        await _pairs(run, size)
        say(f"P8 gateway tunnel setup at {size:,} proxies")
        await _tunnels(run, size)
        if size == p6_size:
            say(f"P6: restarting the daemon with {size:,} proxies")
            results["p6_stop_s"] = round(run.daemon.stop(), 3)
            profile = (Path(env.args.profile) / "daemon-start.txt" if env.args.profile
                       else None)
            results["p6_start_s"] = round(await run.start_daemon(profile=profile), 3)
            results["p6_size"] = size
    largest = env.args.sizes[-1]
    say(f"P9 gateway throughput at {largest:,} proxies")
    await _throughput(run)
    results["p5_kb_per_proxy"] = results["p5_rows"][-1]["kb_per_proxy"]
    await _watchdog_window(run, f"bench-{largest}", largest)
    _summarise(results)


async def _step(run: Run, namespace: str, size: int) -> None:
    """P4: create `size` Proxies through the API, until every one is leasable."""
    with contextlib.suppress(AlreadyExists):
        await run.client.create(NAMESPACES, {"metadata": {"name": namespace}})
    env = run.env
    objs = [proxy(f"px-{i:05d}", namespace, proxy_host=env.squid.host,
                  proxy_port=env.squid.port, probe_url=env.probe_url, zone=i % 4)
            for i in range(size)]
    writes, others = run.fleet.status_writes, run.fleet.other_writes
    assert run.daemon is not None
    cpu_bench, cpu_daemon = time.process_time(), cpu_seconds(run.daemon.pid)
    start = time.perf_counter()
    await run.fleet.create(run.client, objs)
    created = time.perf_counter()
    with trio.fail_after(600):
        leasable = await run.fleet.wait_leasable(namespace, size)
    status_writes = run.fleet.status_writes - writes
    # Who was busy: this process is the fake API server (and the creating client).
    cpu_bench, cpu_daemon = (time.process_time() - cpu_bench,
                             cpu_seconds(run.daemon.pid) - cpu_daemon)
    await _quiet(run)
    row = {"size": size, "seconds": round(leasable - start, 2),
           "create_seconds": round(created - start, 2),
           "writes_per_proxy": round(status_writes / size, 2),
           "writes_per_proxy_settled": round((run.fleet.status_writes - writes) / size, 2),
           "other_writes_per_proxy": round((run.fleet.other_writes - others) / size, 2),
           "apiserver_cpu_s": round(cpu_bench, 2), "daemon_cpu_s": round(cpu_daemon, 2)}
    run.results["p4_rows"].append(row)
    if size == P6_SIZE or "p4_seconds" not in run.results:
        run.results["p4_seconds"] = row["seconds"]
        run.results["p4_create_seconds"] = row["create_seconds"]
        run.results["p4_writes_per_proxy"] = row["writes_per_proxy"]
        run.results["p4_apiserver_cpu_s"] = row["apiserver_cpu_s"]
        run.results["p4_daemon_cpu_s"] = row["daemon_cpu_s"]
        run.results["p4_size"] = size


async def _seed(run: Run, namespace: str, size: int, template: dict[str, Any]) -> None:
    """The largest fleet, seeded Ready: until the daemon lists every one as healthy."""
    writes = run.fleet.status_writes
    start = time.perf_counter()
    run.fleet.seed(namespace, size, template)
    url = f"{run.url}/v1/proxies?selector=bench=true&healthy=true"
    headers = {"Authorization": f"Bearer {run.env.token}"}
    async with httpx.AsyncClient(timeout=60.0, headers=headers) as http:
        with trio.fail_after(600):
            # Polling another process's API: nothing here could be an Event.
            while len((await http.get(url)).json()["items"]) < size:  # noqa: ASYNC110
                await trio.sleep(1.0)
    seen = time.perf_counter()
    await _quiet(run)
    run.results["p4_rows"].append({
        "size": size, "seeded": True, "seconds": round(seen - start, 2),
        "writes_per_proxy": round((run.fleet.status_writes - writes) / size, 3)})


async def _quiet(run: Run) -> None:
    """Until no status write for a second: writes after leasable still cost."""
    quiet_since, seen = time.perf_counter(), run.fleet.status_writes
    while time.perf_counter() - quiet_since < 1.0:
        await trio.sleep(0.2)
        if run.fleet.status_writes != seen:
            quiet_since, seen = time.perf_counter(), run.fleet.status_writes


async def _leases(run: Run, size: int) -> dict[str, Any]:
    """P1 at one size: bare and daemon, 64 then 8 connections, back to back."""
    assert run.daemon is not None
    bare_url = f"http://127.0.0.1:{run.bare_port}"
    bare64 = await wrk(run.env, bare_url, 64)
    bare_lag = (await _get(f"{bare_url}/lag")).json()
    daemon64 = await wrk(run.env, run.url, 64)
    lag = await scrape(run.daemon)
    bare8 = await wrk(run.env, bare_url, 8)
    daemon8 = await wrk(run.env, run.url, 8)
    return {"size": size, "req_s": round(daemon64.rate, 1), "bare_req_s": round(bare64.rate, 1),
            "ratio": round(daemon64.rate / bare64.rate, 3) if bare64.rate else 0.0,
            "p99_ms_64": round(daemon64.p99_ms, 2), "bare_p99_ms_64": round(bare64.p99_ms, 2),
            "p99_ms_8": round(daemon8.p99_ms, 2), "bare_p99_ms_8": round(bare8.p99_ms, 2),
            "p50_ms_8": round(daemon8.p50_ms, 2), "bare_p50_ms_8": round(bare8.p50_ms, 2),
            "errors": daemon64.errors + daemon8.errors,
            "lag_p99_ms": round(lag.get("lag_p99_ms", 0.0), 2),
            "lag_max_ms": round(lag.get("lag_max_ms", 0.0), 2),
            "bare_lag_p99_ms": round(bare_lag["lag_p99_ms"], 2),
            "bare_lag_max_ms": round(bare_lag["lag_max_ms"], 2)}


async def _pairs(run: Run, size: int) -> None:
    """P2 at one size: the median pair through HTTP (daemon and bare) and at the store."""
    assert run.daemon is not None
    seconds = max(0.2, run.env.args.seconds / 6)
    port = int(run.url.rsplit(":", 1)[1])
    samples: list[float] = []
    bare: list[float] = []
    for _ in range(PAIR_ROUNDS):  # alternating: a busy moment on the machine hits both
        samples += await trio.to_thread.run_sync(functools.partial(
            pairs.http_pairs, port, token=run.env.token, seconds=seconds))
        bare += await trio.to_thread.run_sync(functools.partial(
            pairs.http_pairs, run.bare_port, token=run.env.token, seconds=seconds))
    run.results["p2_http_ms"][str(size)] = round(pairs.median_ms(samples), 3)
    run.results["p2_bare_ms"][str(size)] = round(pairs.median_ms(bare), 3)
    run.results["p2_store_ms"][str(size)] = round(
        await pairs.store_pair_ms(size, seconds=min(seconds, 2.0)), 4)


def _paths(run: Run) -> tuple[gw.Upstream, gw.Upstream]:
    assert run.daemon is not None
    return (gw.Upstream("127.0.0.1", run.daemon.gateway_port, "bench", run.env.token),
            gw.Upstream(run.env.squid.host, run.env.squid.port))


async def _tunnels(run: Run, size: int) -> None:
    """P8 at one size: median tunnel setup, gateway over straight to Squid."""
    gateway, squid = _paths(run)
    context = make_ssl_context(run.env.ca_file)
    target = ("127.0.0.1", run.env.target_port)
    times: dict[str, tuple[list[float], list[float]]] = {"gateway": ([], []), "squid": ([], [])}
    rounds = max(1, TUNNELS // 10) if run.env.args.seconds >= 3 else 1
    for _ in range(rounds):
        for name, upstream in (("gateway", gateway), ("squid", squid)):
            setups, totals = await trio.to_thread.run_sync(functools.partial(
                gw.setup_times, upstream, target, context, count=10))
            times[name][0].extend(setups)
            times[name][1].extend(totals)
    row = {"size": size}
    for name, (setups, totals) in times.items():
        row[f"{name}_setup_ms"] = round(gw.median_ms(setups), 3)
        row[f"{name}_total_ms"] = round(gw.median_ms(totals), 3)
    row["setup_ratio"] = round(row["gateway_setup_ms"] / row["squid_setup_ms"], 3)
    row["total_ratio"] = round(row["gateway_total_ms"] / row["squid_total_ms"], 3)
    run.results.setdefault("p8_rows", []).append(row)


async def _throughput(run: Run) -> None:
    """P9: one large download through a tunnel, gateway over straight, alternating."""
    gateway, squid = _paths(run)
    url = f"https://127.0.0.1:{run.env.target_port}/big.bin"
    rates: dict[str, list[float]] = {"gateway": [], "squid": []}
    for _ in range(3 if run.env.args.seconds >= 3 else 1):
        for name, upstream in (("gateway", gateway), ("squid", squid)):
            rates[name].append(await trio.to_thread.run_sync(functools.partial(
                gw.download_rate, upstream, url, ca_file=run.env.ca_file)))
    best = {name: statistics.median(values) for name, values in rates.items()}
    run.results.update({
        "p9_throughput_ratio": round(best["gateway"] / best["squid"], 3),
        "p9_gateway_mb_s": round(best["gateway"] / 1e6, 1),
        "p9_squid_mb_s": round(best["squid"] / 1e6, 1)})


async def _watchdog_window(run: Run, namespace: str, size: int) -> None:
    """The largest fleet under lease load while a tenth of it is probed every 5 s."""
    assert run.daemon is not None
    say(f"the loop watchdog under lease load and probing at {size:,} proxies")
    fast = [f"{namespace}/px-{i:05d}" for i in range(max(1, int(size * FAST_PROBED)))]
    await run.fleet.patch_interval(run.client, fast, FAST_INTERVAL)
    # Every patched proxy probed once since (a smoke run with 1 s runs waits less).
    await trio.sleep(min(FAST_INTERVAL + 1.0, 2 * run.env.args.seconds))
    before = await scrape(run.daemon)
    start = time.perf_counter()
    loaded = await wrk(run.env, run.url, 64)
    after = await scrape(run.daemon)
    seconds = time.perf_counter() - start
    run.results.update({
        "watchdog_p99_ms": round(after.get("lag_p99_ms", 0.0), 2),
        "watchdog_max_ms": round(after.get("lag_max_ms", 0.0), 2),
        "watchdog_probes_per_s": round((after["probes"] - before["probes"]) / seconds, 1),
        "watchdog_req_s": round(loaded.rate, 1), "watchdog_size": size,
        "watchdog_probed_proxies": len(fast)})
    if run.env.args.profile:
        await _profile(run, Path(run.env.args.profile))


def _spy_command(pid: int, seconds: int, output: Path, fmt: str = "raw") -> list[str]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return [spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "200",
            "--format", fmt, "--output", str(output), "--nonblocking"]


async def _profile(run: Run, directory: Path) -> None:
    """py-spy on the daemon during one more lease run (needs ptrace; root here)."""
    assert run.daemon is not None
    seconds = max(3, round(run.env.args.seconds))
    outputs = {"raw": directory / "daemon-largest.txt",
               "speedscope": directory / "daemon-largest.speedscope.json"}
    async with trio.open_nursery() as nursery:
        for fmt, path in outputs.items():
            nursery.start_soon(functools.partial(
                trio.run_process, _spy_command(run.daemon.pid, seconds, path, fmt),
                capture_stdout=True, capture_stderr=True, check=False))
        await wrk(run.env, run.url, 64, seconds=seconds + 1)
    run.results.setdefault("profile", {}).update(
        {fmt: str(path) for fmt, path in outputs.items()})
    run.results["profile_top"] = top_costs(outputs["raw"].read_text(), top=12)


def _summarise(results: dict[str, Any]) -> None:
    rows = results["p1_rows"]
    worst = min(rows, key=lambda r: r["ratio"])
    results["p1_ratio"], results["p1_worst_size"] = worst["ratio"], worst["size"]
    slowest = max(rows, key=lambda r: r["p99_ms_8"] / max(r["bare_p99_ms_8"], 1e-9))
    results["p1_p99_ms"], results["p1_bare_p99_ms"] = (slowest["p99_ms_8"],
                                                       slowest["bare_p99_ms_8"])
    results["p1_p99_size"] = slowest["size"]
    results["p1_p99_ratio"] = round(slowest["p99_ms_8"] / max(slowest["bare_p99_ms_8"], 1e-9),
                                    2)
    sizes = [str(r["size"]) for r in rows]
    http, store = results["p2_http_ms"], results["p2_store_ms"]
    results["p2_ratio"] = round(http[sizes[-1]] / http[sizes[0]], 3)
    results["p2_store_ratio"] = round(store[sizes[-1]] / store[sizes[0]], 3)
    # The same, each size's median over the bare app's in the same moments: if this
    # differs much from p2_ratio, the machine's load moved between the sizes.
    bare = results["p2_bare_ms"]
    results["p2_ratio_vs_bare"] = round(
        (http[sizes[-1]] / bare[sizes[-1]]) / (http[sizes[0]] / bare[sizes[0]]), 3)
    results["p1_ratio_median"] = round(statistics.median(r["ratio"] for r in rows), 3)
    p8 = results.get("p8_rows") or []
    if p8:
        worst8 = max(p8, key=lambda r: r["setup_ratio"])
        results["p8_setup_ratio"], results["p8_size"] = worst8["setup_ratio"], worst8["size"]
        results["p8_total_ratio"] = worst8["total_ratio"]
    for key in ("p8_setup_ratio", "p9_throughput_ratio", "p10_redis_ratio"):
        results.setdefault(key, "not yet")
