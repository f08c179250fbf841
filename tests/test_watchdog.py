"""The loop watchdog measures how late the loop wakes it, in virtual time.

A stall is a task that moves the clock without a checkpoint (`clock.jump`),
exactly what a synchronous burst of work does to the real clock.
"""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from egressd.metrics import REGISTRY
from egressd.watchdog import LOG_EVERY, REFRESH, TICK, WINDOW, LoopWatchdog, percentile


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def stall_at(clock: trio.testing.MockClock, when: float, seconds: float) -> None:
    await trio.sleep_until(when)
    clock.jump(seconds)  # no checkpoint: the loop is held for `seconds`


async def test_a_stall_is_measured_as_the_lateness_of_the_next_wakeup(
        clock: trio.testing.MockClock) -> None:
    watchdog = LoopWatchdog()
    async with trio.open_nursery() as nursery:
        await nursery.start(watchdog.run)
        # Half-way between two wake-ups (every TICK from 0): the one due at
        # 0.51 happens at 0.535.
        await stall_at(clock, 0.505, 0.03)
        await trio.sleep(2 * REFRESH + TICK)  # gauges refreshed over >100 wake-ups
        assert watchdog.max() == pytest.approx(0.025, abs=1e-6)
        # One late wake-up among ~250 on time: the 99th percentile is on time.
        assert len(watchdog.lags()) > 100
        assert watchdog.p99() == pytest.approx(0.0, abs=1e-6)
        assert REGISTRY.get_sample_value("egressd_loop_lag_max_seconds") == pytest.approx(
            0.025, abs=1e-6)
        assert REGISTRY.get_sample_value("egressd_loop_lag_p99_seconds") == pytest.approx(
            0.0, abs=1e-6)
        nursery.cancel_scope.cancel()


async def test_stalls_leave_the_window_after_window_seconds(
        clock: trio.testing.MockClock) -> None:
    watchdog = LoopWatchdog()
    before = REGISTRY.get_sample_value("egressd_loop_lag_seconds_count") or 0.0
    async with trio.open_nursery() as nursery:
        await nursery.start(watchdog.run)
        await stall_at(clock, 0.505, 0.05)
        await trio.sleep(WINDOW / 2)
        assert watchdog.max() == pytest.approx(0.045, abs=1e-6)
        await trio.sleep(WINDOW)
        assert watchdog.max() == pytest.approx(0.0, abs=1e-6)
        # The window holds about WINDOW / TICK wake-ups, not every one since start.
        assert len(watchdog.lags()) <= WINDOW / TICK + 2
        nursery.cancel_scope.cancel()
    # The histogram kept every wake-up.
    after = REGISTRY.get_sample_value("egressd_loop_lag_seconds_count") or 0.0
    assert after - before >= 1.5 * WINDOW / TICK - 2


async def test_many_stalls_show_in_the_99th_percentile(clock: trio.testing.MockClock) -> None:
    watchdog = LoopWatchdog()
    async with trio.open_nursery() as nursery:
        await nursery.start(watchdog.run)
        # 10 of ~110 wake-ups are late; each stall of 15 ms makes the next
        # wake-up 5 to 15 ms late, depending on where it falls between two.
        for i in range(10):
            await stall_at(clock, 0.105 + i * 0.1, 0.015)
        assert 0.005 - 1e-6 <= watchdog.p99() <= 0.015 + 1e-6
        nursery.cancel_scope.cancel()


async def test_a_long_stall_is_logged_once_per_log_interval(
        clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="egressd.watchdog")
    watchdog = LoopWatchdog()
    async with trio.open_nursery() as nursery:
        await nursery.start(watchdog.run)
        await stall_at(clock, 1.005, 0.5)
        await stall_at(clock, 3.005, 0.5)  # within LOG_EVERY: not logged again
        await stall_at(clock, 3.005 + LOG_EVERY, 0.5)
        await trio.sleep(TICK * 2)
        nursery.cancel_scope.cancel()
    stalls = [r for r in caplog.records if r.getMessage() == "the event loop stalled"]
    # The first and the third: 490-500 ms late, depending on where each fell between ticks.
    assert len(stalls) == 2
    assert all(490 <= getattr(r, "stall_ms", 0) <= 500 for r in stalls)


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.99) == 0.0
    assert percentile([3.0], 0.99) == 3.0
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 0.5) == 50.0
    assert percentile(list(reversed(values)), 1.0) == 100.0
