"""The health engine's scheduling, thresholds, emission and seeding, in virtual time.

The probe is a scripted function (the engine takes any `async (ProbeTarget) ->
ProbeResult`); one test drives the real `Prober` with a URL it cannot use.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest
import trio

from egressd.health.engine import HealthEngine, Verdict
from egressd.health.probe import Prober, ProbeResult, ProbeTarget

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


def wall() -> datetime:
    return EPOCH + timedelta(seconds=trio.current_time())


def ok(latency: float = 0.1) -> ProbeResult:
    return ProbeResult(True, latency, "status 204")


def fail(reason: str = "connect refused") -> ProbeResult:
    return ProbeResult(False, 0.01, reason)


def target(key: str = "a", **kw: object) -> ProbeTarget:
    fields: dict[str, object] = {"host": "10.0.0.1", "port": 3128,
                                 "url": "https://t.example/", "interval": 10.0, "timeout": 5.0,
                                 "success_threshold": 1, "failure_threshold": 3}
    fields.update(kw)
    return ProbeTarget(key=key, **fields)  # type: ignore[arg-type]


class Script:
    """A probe function: per key, a list of results (the last one repeats)."""

    def __init__(self, *, delay: float = 0.0, hang: bool = False) -> None:
        self.plan: dict[str, list[ProbeResult]] = {}
        self.delay = delay
        self.hang = hang
        self.calls: list[tuple[float, str]] = []
        self.in_flight: dict[str, int] = defaultdict(int)
        self.max_in_flight_per_key = 0
        self.max_in_flight = 0

    def set(self, key: str, results: Iterable[ProbeResult]) -> None:
        self.plan[key] = list(results)

    def times(self, key: str) -> list[float]:
        return [t for t, k in self.calls if k == key]

    async def __call__(self, t: ProbeTarget) -> ProbeResult:
        self.calls.append((trio.current_time(), t.key))
        self.in_flight[t.key] += 1
        self.max_in_flight_per_key = max(self.max_in_flight_per_key, self.in_flight[t.key])
        self.max_in_flight = max(self.max_in_flight, sum(self.in_flight.values()))
        try:
            if self.hang:
                await trio.sleep_forever()
            await trio.sleep(self.delay)
            plan = self.plan.get(t.key) or [ok()]
            return plan.pop(0) if len(plan) > 1 else plan[0]
        finally:
            self.in_flight[t.key] -= 1


class Harness:
    def __init__(self, script: Script, *, concurrency: int = 8, seed: int = 1) -> None:
        self.script = script
        self.emitted: list[tuple[float, str]] = []
        self.engine = HealthEngine(
            script, on_change=lambda key: self.emitted.append((trio.current_time(), key)),
            concurrency=concurrency, rng=random.Random(seed), wall_clock=wall)

    def emitted_at(self, key: str = "a") -> list[float]:
        return [t for t, k in self.emitted if k == key]


async def test_unseeded_proxy_is_probed_on_the_next_tick(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        await nursery.start(h.engine.run)
        await trio.sleep(0.5)
        h.engine.upsert(target(interval=30.0))
        await trio.sleep(70)
        assert h.script.times("a") == [1.0, 31.0, 61.0]


async def test_thresholds_decide_the_verdict_and_only_changes_emit(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        h.script.set("a", [fail("boom"), fail("boom"), fail("boom"), ok(), fail("x"), ok(),
                           ok(0.2)])
        h.engine.upsert(target(success_threshold=2, failure_threshold=3))
        await nursery.start(h.engine.run)  # probes at 0, 10, 20, ...
        await trio.sleep(15)
        assert h.engine.snapshot("a") is None  # two failures: no verdict yet
        await trio.sleep(10)
        assert h.engine.snapshot("a") == Verdict(
            healthy=False, latency_ms=None, checked_at=EPOCH + timedelta(seconds=20),
            reason="boom", successes=0, failures=3)
        await trio.sleep(30)  # ok, fail, ok: never two successes in a row
        verdict = h.engine.snapshot("a")
        # The reason is the latest result that agrees with the verdict.
        assert verdict is not None and not verdict.healthy and verdict.reason == "x"
        await trio.sleep(10)
        assert h.engine.snapshot("a") == Verdict(
            healthy=True, latency_ms=200, checked_at=EPOCH + timedelta(seconds=60),
            reason="status 204", successes=2, failures=0)
        assert h.emitted_at() == [20.0, 60.0]


async def test_latency_emits_only_on_a_20_percent_move_at_most_once_a_minute(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        # One probe every 10 s from t=0.
        h.script.set("a", [ok(0.100), ok(0.110), ok(0.150), fail(), ok(0.150), ok(0.150),
                           ok(0.150), ok(0.125), ok(0.125), ok(0.125), ok(0.125), ok(0.125),
                           ok(0.125), ok(0.100)])
        h.engine.upsert(target())
        await nursery.start(h.engine.run)
        await trio.sleep(135)
        # 0: first verdict. 20: +50 % but only 20 s after. 60: +50 % vs the
        # last *emitted* 100 ms, 60 s after. 70-120: 125 ms is -17 % of 150.
        # 130: -33 %, 70 s after.
        assert h.emitted_at() == [0.0, 60.0, 130.0]
        verdict = h.engine.snapshot("a")
        assert verdict is not None and verdict.latency_ms == 100


async def test_no_latency_emission_before_the_success_threshold(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        h.script.set("a", [fail(), ok(0.1), fail(), ok(0.3), fail(), ok(0.1), fail()])
        h.engine.upsert(target(success_threshold=2, failure_threshold=1))
        await nursery.start(h.engine.run)
        await trio.sleep(200)
        assert h.emitted_at() == [0.0]  # the first (unhealthy) verdict only


async def test_seeded_proxies_start_with_their_verdict_and_spread_first_probes(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script(), seed=7)
        seed = Verdict(healthy=True, latency_ms=100, checked_at=EPOCH, reason="status 204")
        keys = [f"p{i}" for i in range(50)]
        for key in keys:
            h.engine.upsert(target(key, interval=30.0), seed=seed)
        assert all(h.engine.snapshot(key) == seed for key in keys)
        await nursery.start(h.engine.run)
        await trio.sleep(30.5)
        # The same draws the engine made, rounded up to the 1 s tick.
        draws = random.Random(7)
        expected = [float(math.ceil(draws.uniform(0.0, 30.0))) for _ in keys]
        assert [h.script.times(key)[0] for key in keys] == expected
        assert len(set(expected)) > 15  # spread over the interval, no herd
        # Probes agreeing with the seed (healthy, 100 ms) are not news.
        assert h.emitted == []
        verdict = h.engine.snapshot("p0")
        assert verdict is not None and verdict.healthy
        assert verdict.checked_at == EPOCH + timedelta(seconds=expected[0])


async def test_seeded_verdict_that_no_longer_holds_is_emitted_on_flip(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        h.script.set("a", [fail("CONNECT refused: 403")])
        seed = Verdict(healthy=True, latency_ms=100, checked_at=EPOCH, reason="status 204")
        h.engine.upsert(target(interval=10.0, failure_threshold=2), seed=seed)
        await nursery.start(h.engine.run)
        await trio.sleep(30)
        [_first, second, *_] = h.script.times("a")
        assert h.emitted_at() == [second]
        verdict = h.engine.snapshot("a")
        assert verdict is not None and not verdict.healthy
        assert verdict.reason == "CONNECT refused: 403"


async def test_removed_proxy_is_forgotten_and_its_in_flight_result_dropped(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script(delay=3.0))
        h.script.set("a", [fail()])
        h.engine.upsert(target(failure_threshold=1))
        await nursery.start(h.engine.run)
        await trio.sleep(1)  # probe started at 0, ends at 3
        h.engine.remove("a")
        await trio.sleep(50.5)
        assert h.script.times("a") == [0.0]
        assert h.engine.snapshot("a") is None and "a" not in h.engine
        assert h.emitted == []
        h.engine.upsert(target(failure_threshold=1))  # comes back fresh
        await trio.sleep(1)
        assert h.script.times("a") == [0.0, 52.0]


async def test_host_change_starts_fresh_but_interval_change_keeps_streaks(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        h.script.set("a", [fail()])
        h.script.set("b", [fail()])
        h.engine.upsert(target("a", failure_threshold=2))
        h.engine.upsert(target("b", failure_threshold=2))
        await nursery.start(h.engine.run)
        # Off-tick times throughout: which of two tasks due at the same
        # virtual instant runs first is up to trio.
        await trio.sleep(5.5)  # one failure each, at 0
        h.engine.upsert(target("a", failure_threshold=2, host="10.0.0.2"))
        h.engine.upsert(target("b", failure_threshold=2, interval=8.0))
        await trio.sleep(4)  # t=9.5
        # a: new endpoint, probed on the next tick, a streak of one.
        assert h.script.times("a") == [0.0, 6.0]
        assert h.engine.snapshot("a") is None
        # b: its shorter interval applies now; the second failure decides.
        assert h.script.times("b") == [0.0, 8.0]
        verdict = h.engine.snapshot("b")
        assert verdict is not None and not verdict.healthy and verdict.failures == 2


async def test_unchanged_upsert_is_a_no_op_and_url_change_probes_next_tick(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        h.engine.upsert(target())
        await nursery.start(h.engine.run)
        await trio.sleep(3.5)
        h.engine.upsert(target())
        await trio.sleep(2)
        h.engine.upsert(target(url="https://other.example/"))
        await trio.sleep(11)
        assert h.script.times("a") == [0.0, 6.0, 16.0]
        verdict = h.engine.snapshot("a")
        assert verdict is not None and verdict.successes == 3


async def test_one_probe_in_flight_per_proxy_when_probes_queue_up(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script(delay=4.0), concurrency=1)
        for key in "abc":
            h.engine.upsert(target(key, interval=5.0, timeout=4.5))
        await nursery.start(h.engine.run)
        await trio.sleep(120)
        # Three 4 s probes per 5 s interval through one slot: a backlog.
        assert h.script.max_in_flight == 1
        assert h.script.max_in_flight_per_key == 1
        counts = [len(h.script.times(key)) for key in "abc"]
        assert max(counts) - min(counts) <= 1 and min(counts) >= 9


async def test_concurrency_limit_holds_when_every_probe_hangs(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script(hang=True), concurrency=5)
        keys = [f"p{i:02}" for i in range(20)]
        for key in keys:
            h.engine.upsert(target(key, timeout=2.0, failure_threshold=1))
        await nursery.start(h.engine.run)
        await trio.sleep(60)
        assert h.script.max_in_flight == 5
        assert h.script.max_in_flight_per_key == 1
        # The engine's backstop (timeout + 1 s grace) frees the slots.
        for key in keys:
            verdict = h.engine.snapshot(key)
            assert verdict is not None and not verdict.healthy
            assert verdict.reason == "timeout after 2s"


async def test_a_probe_that_raises_is_a_failure_not_a_crash(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        async def broken(t: ProbeTarget) -> ProbeResult:
            raise RuntimeError("bug")

        emitted: list[str] = []
        engine = HealthEngine(broken, on_change=emitted.append, concurrency=2, wall_clock=wall)
        engine.upsert(target(failure_threshold=1))
        await nursery.start(engine.run)
        await trio.sleep(25)
        verdict = engine.snapshot("a")
        assert verdict is not None and not verdict.healthy
        assert verdict.reason == "probe error: RuntimeError: bug"
        assert verdict.failures == 3 and emitted == ["a"]


async def test_bad_probe_url_through_the_real_prober_is_unhealthy(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        emitted: list[str] = []
        engine = HealthEngine(Prober().probe, on_change=emitted.append, concurrency=2)
        engine.upsert(target(url="ftp://example.org/file", failure_threshold=3))
        await nursery.start(engine.run)
        await trio.sleep(25)
        verdict = engine.snapshot("a")
        assert verdict is not None and not verdict.healthy
        assert verdict.reason == "bad probe URL: unsupported scheme 'ftp'"
        assert emitted == ["a"]


async def test_probes_cancelled_with_run_are_redone_by_the_next_run(
        autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script(delay=3.0))
        h.engine.upsert(target(interval=30.0))
        async with trio.open_nursery() as nursery:
            await nursery.start(h.engine.run)
            await trio.sleep(1)  # the probe started at 0 is in flight
            nursery.cancel_scope.cancel()
        assert h.engine.snapshot("a") is None
        async with trio.open_nursery() as nursery:
            await nursery.start(h.engine.run)
            await trio.sleep(5)
            nursery.cancel_scope.cancel()
        assert h.script.times("a") == [0.0, 1.0]
        verdict = h.engine.snapshot("a")
        assert verdict is not None and verdict.healthy


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        HealthEngine(Script(), on_change=lambda key: None, concurrency=0)


async def test_host_change_while_in_flight_drops_the_old_result_and_reprobes(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script(delay=2.5))
        h.script.set("a", [fail()])
        h.engine.upsert(target(failure_threshold=1))
        await nursery.start(h.engine.run)
        await trio.sleep(1.5)  # probe of 10.0.0.1 in flight until t=2.5
        h.engine.upsert(target(failure_threshold=1, host="10.0.0.2"))
        h.script.set("a", [ok()])
        await trio.sleep(1.2)
        assert h.engine.snapshot("a") is None  # the old endpoint's failure is not counted
        await trio.sleep(5)
        assert h.script.times("a") == [0.0, 3.0]
        assert h.emitted_at() == [5.5]
        verdict = h.engine.snapshot("a")
        assert verdict is not None and verdict.healthy


async def test_a_key_removed_and_readded_mid_probe_waits_for_that_probe(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script(delay=2.5))
        h.script.set("a", [fail()])
        h.engine.upsert(target(failure_threshold=1))
        await nursery.start(h.engine.run)
        await trio.sleep(1.5)  # the probe started at 0 runs until 2.5
        h.engine.remove("a")
        h.engine.upsert(target(failure_threshold=1))
        h.script.set("a", [ok()])
        await trio.sleep(5)  # t=6.5
        # Due on the tick at 2, but the old probe is out until 2.5: the next
        # tick after it. One probe at a time per proxy.
        assert h.script.times("a") == [0.0, 3.0]
        assert h.script.max_in_flight_per_key == 1
        # The removed state's failure was dropped; the new one's success counts.
        verdict = h.engine.snapshot("a")
        assert verdict is not None and verdict.healthy
        assert h.emitted_at() == [5.5]


async def test_latency_rule_boundaries_are_exactly_20_percent_and_60_seconds(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        # Probes every 10 s from t=0; the first verdict is emitted at 0.
        h.script.set("a", [ok(0.100)] * 6 + [ok(0.120)])  # +20 % at exactly 60 s
        h.script.set("b", [ok(0.100)] * 6 + [ok(0.119)])  # +19 %
        h.script.set("c", [ok(0.100)] * 6 + [ok(0.080)])  # -20 %
        for key in "abc":
            h.engine.upsert(target(key))
        await nursery.start(h.engine.run)
        await trio.sleep(75.5)
        assert h.emitted_at("a") == [0.0, 60.0]
        assert h.emitted_at("b") == [0.0]
        assert h.emitted_at("c") == [0.0, 60.0]
        verdict = h.engine.snapshot("b")
        # Not emitted, but the snapshot has the latest latency for whoever reads it.
        assert verdict is not None and verdict.latency_ms == 119


async def test_seed_without_latency_gets_one_after_a_minute(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        seed = Verdict(healthy=True, latency_ms=None, checked_at=EPOCH, reason="status 204")
        h.engine.upsert(target(interval=10.0), seed=seed)
        await nursery.start(h.engine.run)
        await trio.sleep(80.5)
        # The seed counts as emitted at 0, so the latency waits for 60 s.
        assert h.emitted_at() == [next(t for t in h.script.times("a") if t >= 60.0)]


async def test_a_target_without_host_drops_its_state(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        h.engine.upsert(target())
        await nursery.start(h.engine.run)
        await trio.sleep(5.5)
        assert h.engine.snapshot("a") is not None
        h.engine.upsert(target(host=""))  # e.g. a Managed proxy being replaced
        assert "a" not in h.engine and h.engine.snapshot("a") is None
        await trio.sleep(30)
        assert h.script.times("a") == [0.0]


async def test_scheduling_stays_right_through_heavy_rescheduling(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        # Each URL change leaves a stale heap entry; hundreds of them force the
        # heap to be rebuilt, which must keep every live entry.
        h = Harness(Script())
        keys = [f"p{i}" for i in range(10)]
        for key in keys:
            h.engine.upsert(target(key))
        await nursery.start(h.engine.run)
        await trio.sleep(0.5)
        for i in range(500):
            h.engine.upsert(target("p0", url=f"https://t.example/{i % 2}"))
        await trio.sleep(20)  # t=20.5
        assert h.script.times("p0") == [0.0, 1.0, 11.0]
        assert all(h.script.times(key) == [0.0, 10.0, 20.0] for key in keys[1:])


@pytest.mark.parametrize(("name", "value"), [
    ("timeout", -1.0), ("interval", 0.0), ("interval", math.nan), ("failure_threshold", 0),
    ("success_threshold", 0)])
def test_out_of_range_target_is_refused_at_construction(name: str, value: float) -> None:
    # A negative timeout would reach trio's timers and stop the whole engine.
    with pytest.raises(ValueError, match=name):
        target("a", **{name: value})


async def test_a_proxy_removed_while_queued_for_a_slot_is_not_probed(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script(delay=3.0), concurrency=1)
        h.engine.upsert(target("a", interval=30.0))
        await nursery.start(h.engine.run)
        await trio.sleep(0.5)
        h.engine.upsert(target("b", interval=30.0))
        await trio.sleep(1)  # one slot: a probes 0-3, b waits for it from 1
        h.engine.remove("b")
        await trio.sleep(10)
        assert h.script.times("a") == [0.0]
        assert h.script.times("b") == []


async def test_a_reported_proxy_error_counts_as_a_failed_probe(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(1000):
        h = Harness(Script())
        h.engine.upsert(target(interval=30.0, failure_threshold=2))
        await nursery.start(h.engine.run)
        await trio.sleep(1)  # the first probe (t=0) made it healthy
        assert h.emitted_at() == [0.0]
        h.engine.count_failure("a", "a client reported proxy_error")
        verdict = h.engine.snapshot("a")
        assert verdict is not None and verdict.healthy and verdict.failures == 1
        h.engine.count_failure("a", "a client reported proxy_error")
        verdict = h.engine.snapshot("a")
        # The threshold is reached as by probes; it is not a probe: no new check time.
        assert verdict == Verdict(healthy=False, latency_ms=None, checked_at=EPOCH,
                                  reason="a client reported proxy_error", successes=0,
                                  failures=2)
        assert h.emitted_at() == [0.0, 1.0]
        h.engine.count_failure("unknown", "x")  # ignored
        await trio.sleep(30)  # the schedule is unchanged: the next probe heals it
        assert h.script.times("a") == [0.0, 30.0]
        verdict = h.engine.snapshot("a")
        assert verdict is not None and verdict.healthy
