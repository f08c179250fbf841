"""The results: the markdown table, the per-size table and the plot (matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# key: (label, goal text, test against the goal or None)
GOALS: dict[str, tuple[str, str, Any]] = {
    "p1_ratio": ("P1 acquire/release req/s, daemon / bare (worst size, 64 conns)", "≥ 0.6",
                 lambda v: v >= 0.6),
    "p1_p99_ratio": ("P1 p99 at 8 conns, daemon / bare (worst size)", "≤ 2",
                     lambda v: v <= 2),
    "p2_ratio": ("P2 acquire+release median, largest / smallest fleet (HTTP)", "≤ 1.25",
                 lambda v: v <= 1.25),
    "p2_store_ratio": ("P2 the same at the lease store", "≤ 1.25", lambda v: v <= 1.25),
    "p3_probes_per_s": ("P3 health-engine probes/s on one core", "≥ 1,000",
                        lambda v: v >= 1000),
    "p3_ratio": ("P3 engine / raw trio CONNECT+TLS loop", "≥ 0.7", lambda v: v >= 0.7),
    "p4_seconds": ("P4 create 1,000 External Proxies → all leasable, s", "≤ 10",
                   lambda v: v <= 10),
    "p4_writes_per_proxy": ("P4 status writes per proxy in that time", "≤ 3",
                            lambda v: v <= 3),
    "p5_kb_per_proxy": ("P5 RSS growth per proxy, 0 → largest fleet, KB", "≤ 20",
                        lambda v: v <= 20),
    "p6_start_s": ("P6 start → /readyz 200 with 1,000 proxies, s", "≤ 1.5",
                   lambda v: v <= 1.5),
    "p6_stop_s": ("P6 SIGTERM → exit, s", "≤ 1", lambda v: v <= 1),
    "p7_idle_rss_mb": ("P7 idle RSS, no proxies, MB", "≤ 120", lambda v: v <= 120),
    "watchdog_p99_ms": ("Loop lag p99 under lease load + probing, largest fleet, ms", "≤ 5",
                        lambda v: v <= 5),
    "watchdog_max_ms": ("Loop lag max, same window, ms", "≤ 50", lambda v: v <= 50),
    "loadgen_ceiling_req_s": ("wrk + the Lua script against nginx (its own ceiling), req/s",
                              "≫ P1", None),
    "p8_setup_ratio": ("P8 gateway tunnel setup (to 200) / straight to Squid, worst size",
                       "—", None),
    "p9_throughput_ratio": ("P9 gateway download throughput / straight to Squid", "—", None),
    "p10_redis_ratio": ("P10 Redis store / memory store acquire+release rate", "—", None),
}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.2f}" if value >= 1 else f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def verdict(key: str, value: Any) -> str:
    check = GOALS[key][2]
    if check is None or not isinstance(value, int | float):
        return ""
    return "yes" if check(value) else "**no**"


def _beside(key: str, results: dict[str, Any]) -> str:
    """The absolute figures a ratio comes from."""
    worst = results.get("p1_worst_size")
    rows = {r["size"]: r for r in results.get("p1_rows", [])}
    if key == "p1_ratio" and worst in rows:
        r = rows[worst]
        return f"{r['req_s']:,.0f} vs {r['bare_req_s']:,.0f} req/s at {worst:,} proxies"
    if key == "p1_p99_ratio" and "p1_p99_ms" in results:
        return (f"{results['p1_p99_ms']:.1f} vs {results['p1_bare_p99_ms']:.1f} ms at "
                f"{results.get('p1_p99_size', 0):,} proxies")
    if key == "p2_ratio" and results.get("p2_http_ms"):
        ms = results["p2_http_ms"]
        return " → ".join(f"{float(v):.2f} ms" for v in ms.values()) + " per pair"
    if key == "p2_store_ratio" and results.get("p2_store_ms"):
        ms = results["p2_store_ms"]
        return " → ".join(f"{float(v) * 1000:.0f} µs" for v in ms.values())
    if key == "p3_ratio" and "p3_raw_probes_per_s" in results:
        return f"raw loop {results['p3_raw_probes_per_s']:,.0f} probes/s"
    if key == "watchdog_p99_ms" and "watchdog_probes_per_s" in results:
        return (f"{results.get('watchdog_req_s', 0):,.0f} req/s and "
                f"{results['watchdog_probes_per_s']:,.0f} probes/s in the window")
    if key == "p8_setup_ratio" and "p8_rows" in results:
        r = next(r for r in results["p8_rows"] if r["size"] == results["p8_size"])
        return (f"{r['gateway_setup_ms']:.2f} vs {r['squid_setup_ms']:.2f} ms; with TLS and "
                f"a GET {r['gateway_total_ms']:.2f} vs {r['squid_total_ms']:.2f} ms "
                f"({r['total_ratio']:.2f} x)")
    if key == "p9_throughput_ratio" and "p9_squid_mb_s" in results:
        return f"{results['p9_gateway_mb_s']:,.0f} vs {results['p9_squid_mb_s']:,.0f} MB/s"
    if key == "p4_seconds" and "p4_create_seconds" in results:
        return (f"creating took {results['p4_create_seconds']:.1f} s of it; CPU: fake API "
                f"server {results.get('p4_apiserver_cpu_s', 0):.1f} s, daemon "
                f"{results.get('p4_daemon_cpu_s', 0):.1f} s")
    return ""


def markdown(results: dict[str, Any]) -> str:
    lines = ["| figure | value | goal | met | beside it |", "|---|---|---|---|---|"]
    for key, (label, goal, _) in GOALS.items():
        value = results.get(key, "not measured")
        lines.append(f"| {label} (`{key}`) | {_fmt(value)} | {goal} | {verdict(key, value)} "
                     f"| {_beside(key, results)} |")
    lines += ["", "| proxies | P1 req/s | bare req/s | P1 ratio | p99 @8 ms | bare p99 @8 ms "
              "| P2 HTTP ms/pair | P2 store µs/pair | P4 s | P4 writes/proxy | P5 RSS MB "
              "| P5 KB/proxy | loop lag p99/max ms | bare lag p99/max ms |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    p4 = {r["size"]: r for r in results.get("p4_rows", [])}
    p5 = {r["size"]: r for r in results.get("p5_rows", [])}
    for r in results.get("p1_rows", []):
        size = r["size"]
        w, m = p4.get(size, {}), p5.get(size, {})
        lines.append(
            f"| {size:,} | {r['req_s']:,.0f} | {r['bare_req_s']:,.0f} | {r['ratio']:.2f} "
            f"| {r['p99_ms_8']:.1f} | {r['bare_p99_ms_8']:.1f} "
            f"| {results['p2_http_ms'].get(str(size), 0):.2f} "
            f"| {results['p2_store_ms'].get(str(size), 0) * 1000:.0f} "
            f"| {w.get('seconds', 0):.1f}{' (seeded)' if w.get('seeded') else ''} "
            f"| {w.get('writes_per_proxy', 0):.2f} "
            f"| {m.get('rss_mb', 0):.0f} | {m.get('kb_per_proxy', 0):.1f} "
            f"| {r['lag_p99_ms']:.1f} / {r['lag_max_ms']:.0f} "
            f"| {r['bare_lag_p99_ms']:.1f} / {r['bare_lag_max_ms']:.0f} |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    """Four panels against fleet size (log scale): P1, P2, P4, P5."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["p1_rows"]
    sizes = [r["size"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)
    ax = axes[0][0]
    ax.plot(sizes, [r["req_s"] for r in rows], "o-", label="egressd")
    ax.plot(sizes, [r["bare_req_s"] for r in rows], "s--", label="bare Hypercorn+Quart-Trio")
    ax.set_title("P1 acquire/release, 64 connections")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax = axes[0][1]
    ax.plot(sizes, [results["p2_http_ms"][str(s)] for s in sizes], "o-", label="through HTTP")
    ax.plot(sizes, [results["p2_store_ms"][str(s)] for s in sizes], "s--",
            label="lease store only")
    ax.set_title("P2 median acquire+release, one at a time")
    ax.set_ylabel("ms per pair (log)")
    ax.set_yscale("log")
    ax.legend()
    ax = axes[1][0]
    p4 = [r for r in results["p4_rows"] if not r.get("seeded")]
    seeded = [r for r in results["p4_rows"] if r.get("seeded")]
    ax.plot([r["size"] for r in p4], [r["seconds"] for r in p4], "o-", label="seconds")
    if seeded:
        ax.plot([r["size"] for r in seeded], [r["seconds"] for r in seeded], "x", color="C0",
                markersize=10, label="seeded Ready: until all listed")
    ax.set_title("P4 create N External Proxies → all leasable")
    ax.set_ylabel("seconds")
    twin = ax.twinx()
    twin.plot([r["size"] for r in p4], [r["writes_per_proxy"] for r in p4], "s--", color="C1",
              label="status writes / proxy")
    twin.set_ylabel("status writes per proxy")
    twin.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    twin.legend(loc="lower right")
    ax = axes[1][1]
    p5 = results["p5_rows"]
    ax.plot([0] + [r["size"] for r in p5],
            [results["p7_idle_rss_mb"]] + [r["rss_mb"] for r in p5], "o-")
    ax.set_title("P5 daemon RSS")
    ax.set_ylabel("MB")
    ax.set_xscale("symlog", linthresh=100)
    for ax in (axes[0][0], axes[0][1], axes[1][0]):
        ax.set_xscale("log")
    for ax in axes.flat:
        ax.set_xlabel("proxies in the cache")
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"egressd benchmark ({results.get('machine', {}).get('summary', '')})")
    fig.savefig(path, dpi=90)
    plt.close(fig)
