"""Benchmark: lease selection cost at 100 vs 10,000 proxies (issue 6 item 5).

Measures `MemoryLeaseStore.acquire` against a baseline in the same run —
the same selection done by sorting every candidate per request — and prints
ratios, not absolute speed: per-acquire cost at 10,000 over 100 proxies (linear
selection should stay near 100x) and one-pass over sort at each size.

    .venv/bin/python scripts/bench_leases.py [--rounds 2000]   # after scripts/test.sh

Not part of CI.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from egressd.leases.interface import Candidate, Usage
from egressd.leases.store import MemoryLeaseStore


def candidates(n: int, rng: random.Random) -> list[Candidate]:
    return [Candidate(key=f"ns/px-{i:05d}", max_leases=1_000_000,
                      latency_ms=rng.uniform(5, 500)) for i in range(n)]


_NONE = Usage()


def now(coro: Any) -> Any:
    """Run a store coroutine that never awaits (no hook) to its end, without a loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("the store awaited")


def sort_baseline(store: MemoryLeaseStore, cands: list[Candidate]) -> Candidate:
    usage = now(store.usage(c.key for c in cands))
    def rank(c: Candidate) -> tuple[int, float | None, str]:
        return (usage.get(c.key, _NONE).active_leases, c.latency_ms, c.key)

    return sorted(cands, key=rank)[0]


def per_call(fn: object, rounds: int) -> float:
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            fn()  # type: ignore[operator]
        samples.append((time.perf_counter() - start) / rounds)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    rng = random.Random(7)
    results = {}
    for n in (100, 10_000):
        store = MemoryLeaseStore(cooldown=600, ban_cooldown=3600, max_cooldown=3600)
        cands = candidates(n, rng)
        rounds = max(10, args.rounds * 100 // n)
        one_pass = per_call(lambda s=store, c=cands: now(s.acquire(c, target="", ttl=300)), rounds)
        baseline = per_call(lambda s=store, c=cands: sort_baseline(s, c), rounds)
        results[n] = (one_pass, baseline)
        print(f"{n:>6} proxies: acquire {one_pass * 1e6:9.1f} us   "
              f"sort baseline {baseline * 1e6:9.1f} us   one-pass/sort {one_pass / baseline:.2f}")
    growth = results[10_000][0] / results[100][0]
    print(f"acquire cost 10,000 vs 100 proxies: {growth:.0f}x (linear = 100x)")


if __name__ == "__main__":
    main()
