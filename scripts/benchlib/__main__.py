"""`scripts/bench`: egressd measured against the ceilings of its own stack, in one run.

    scripts/bench [--quick] [--sizes 100,1000,10000] [--seconds 10] [--out FILE]
                  [--plot FILE] [--profile DIR] [--no-pin]

Order (each ratio's two sides run back to back, so load from elsewhere on a
shared machine touches both): wrk's own ceiling; P3 probes; then one daemon
(`egressd run`) against the fake API server in this process, growing the fleet
0 → each size (the previous size's Proxies deleted first, so each P4 step
creates exactly that many); at each size P1 (wrk, 64 and 8 connections,
interleaved with the bare app) and P2 (pairs one at a time); P6 restarts the
daemon at 1,000; the largest size adds the watchdog window under probing.
See docs/performance.md for what each figure means.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
import trustme

from benchlib import phases
from benchlib.procs import Cores, run_nginx, run_squid
from benchlib.report import markdown, plot

REPO = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="sizes 10,100,1000 and 3 s runs (about 2 minutes)")
    parser.add_argument("--sizes", help="fleet sizes, comma-separated (default 100,1000,10000)")
    parser.add_argument("--seconds", type=float, help="seconds per wrk run (default 10)")
    parser.add_argument("--probe-seconds", type=float, help="P3 seconds per mode (default 10)")
    parser.add_argument("--out", default="bench-results.json")
    parser.add_argument("--plot", default="bench-results.png",
                        help="where to draw the plot ('' for none)")
    parser.add_argument("--profile", default="",
                        help="directory for py-spy profiles of the daemon at the largest size")
    parser.add_argument("--no-pin", action="store_true",
                        help="leave CPU placement to the kernel")
    args = parser.parse_args(argv)
    quick = args.quick
    args.sizes = [int(s) for s in (args.sizes or ("10,100,1000" if quick else
                                                  "100,1000,10000")).split(",")]
    args.seconds = args.seconds or (3.0 if quick else 10.0)
    args.probe_seconds = args.probe_seconds or (3.0 if quick else 10.0)
    return args


def _git_commit() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def machine(cores: Cores) -> dict[str, Any]:
    cpus = os.cpu_count() or 1
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    placement = (f"server on core {cores.server}, load on core {cores.load}" if cores.pinned
                 else "not pinned")
    load = os.getloadavg()[0]
    return {"cpus": cpus, "cpu_model": model, "python": platform.python_version(),
            "loadavg_at_start": round(load, 2),
            "placement": placement, "commit": _git_commit(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "summary": f"{cpus} cores, {placement}, commit {_git_commit()}, "
                       f"load average {load:.1f} at start"}


async def run(args: argparse.Namespace, cores: Cores, workdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine(cores), "sizes": args.sizes,
                               "seconds_per_run": args.seconds}
    ca = trustme.CA()
    ca_file = workdir / "probe-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    big = phases.BIG_FILE if args.seconds >= 3 else phases.BIG_FILE // 16  # smoke runs
    with run_squid() as squid, run_nginx(ca=ca, big_file=big) as target:
        env = phases.Env(args=args, cores=cores, workdir=workdir, squid=squid,
                         target_port=target.port,
                         probe_url=f"https://127.0.0.1:{target.port}/generate_204",
                         ca_file=str(ca_file))
        phases.pin_peers(env, target)
        results.update(await phases.loadgen_ceiling(env))
        results.update(await phases.probes(env))
        results.update(await phases.fleet(env))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cores = Cores.detect(pin_cores=not args.no_pin)
    if cores.pinned:
        # This process (the fake API server, the pair client) and its
        # children (Squid, nginx, wrk) belong to the load side.
        os.sched_setaffinity(0, {cores.load})
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="egressd-bench-") as tmp:
        results = trio.run(run, args, cores, Path(tmp))
    results["bench_seconds"] = round(time.perf_counter() - started, 1)
    # A shared machine's other work shows here (2 = both cores busy without us).
    results["machine"]["loadavg_at_end"] = round(os.getloadavg()[0], 2)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    print(table)
    print(f"\n{results['machine']['summary']}; {results['bench_seconds']:.0f} s; "
          f"wrote {args.out}", end="")
    if args.plot:
        plot(results, Path(args.plot))
        print(f" and {args.plot}", end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
