"""`scripts/bench` end to end with tiny sizes: every phase runs against the real daemon,
the bare app, wrk, Squid and nginx, and bench-results.json holds every key.

A smoke test, not a benchmark: nothing here looks at how large a figure is,
only that each was measured (docs/performance.md has the real run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.health.peers import find_binary

REPO = Path(__file__).resolve().parent.parent

KEYS = ("p1_ratio", "p1_p99_ms", "p1_bare_p99_ms", "p2_ratio", "p2_store_ratio",
        "p3_probes_per_s", "p3_ratio", "p4_seconds", "p4_writes_per_proxy",
        "p5_kb_per_proxy", "p6_start_s", "p6_stop_s", "p7_idle_rss_mb", "watchdog_p99_ms",
        "watchdog_max_ms", "loadgen_ceiling_req_s")


@pytest.mark.timeout(240)
@pytest.mark.squid
def test_the_bench_measures_every_figure_with_tiny_sizes(tmp_path: Path) -> None:
    missing = [b for b in ("wrk", "nginx", "squid") if find_binary(b) is None]
    if missing:
        pytest.skip(f"not installed: {' '.join(missing)} (scripts/bench installs them)")
    out, png = tmp_path / "results.json", tmp_path / "plot.png"
    draw = importlib.util.find_spec("matplotlib") is not None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "scripts"), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "benchlib", "--sizes", "8,16", "--seconds", "1",
         "--probe-seconds", "0.5", "--out", str(out), "--plot", str(png) if draw else ""],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=220, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [key for key in KEYS if not isinstance(results.get(key), int | float)] == []
    assert [r["size"] for r in results["p1_rows"]] == [8, 16]
    assert [r["size"] for r in results["p4_rows"]] == [8, 16]
    for row in results["p1_rows"]:
        assert row["req_s"] > 0 and row["bare_req_s"] > 0
        # Every acquire granted (8 proxies hold 80 leases: more than 64 connections ask).
        assert row["errors"] == 0
    # Each step waited for its proxies to be probed and written Ready.
    assert all(r["writes_per_proxy"] > 0 for r in results["p4_rows"])
    assert results["p10_redis_ratio"] == "not yet"  # no Redis store on main yet
    # The markdown table names every figure by its key.
    assert all(f"`{key}`" in done.stdout for key in ("p1_ratio", "p3_ratio", "p7_idle_rss_mb"))
    if draw:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
