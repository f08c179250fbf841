"""The loop-latency watchdog: how late the trio loop wakes a task that asked to sleep 10 ms.

Everything in egressd shares one thread. A task that holds it without a
checkpoint — parsing a large object, sorting the fleet, encoding a long list,
a blocking call — delays every other task, and the delay shows nowhere else:
a request that waited 80 ms for the loop looks like a slow request. This task
sleeps `TICK` in a loop and records by how much it woke late, so a stall is a
number (issue 12 item 4):

* `egressd_loop_lag_seconds`, a histogram of every wake-up's lateness;
* `egressd_loop_lag_p99_seconds` and `egressd_loop_lag_max_seconds`, the 99th
  percentile and the maximum over the last `WINDOW` seconds, refreshed every
  `REFRESH` seconds (what `scripts/bench` reads after a load run).

A lag above `STALL_WARNING` is logged, at most once per `LOG_EVERY`.
"""

from __future__ import annotations

import logging
import math
from collections import deque

import trio

from egressd.metrics import LOOP_LAG, LOOP_LAG_MAX, LOOP_LAG_P99

log = logging.getLogger(__name__)

TICK = 0.01
"""Seconds the watchdog asks to sleep; lateness is measured against this."""
WINDOW = 10.0
"""Seconds of wake-ups the p99 and max gauges summarise (a benchmark run's length)."""
REFRESH = 1.0
"""Seconds between recomputing the gauges (sorting a window per wake-up would cost more)."""
STALL_WARNING = 0.25
"""A wake-up this late is logged: every request in flight waited that long too."""
LOG_EVERY = 60.0
"""At most one stall warning per this many seconds (a slow machine must not flood the log)."""


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


class LoopWatchdog:
    """Measures the loop's wake-up lateness; `run` until cancelled.

    `p99()` and `max()` read the current window (tests and the gauges use them).
    """

    def __init__(self) -> None:
        self._window: deque[tuple[float, float]] = deque()
        self._last_warning = -math.inf

    def lags(self) -> list[float]:
        """The lateness of every wake-up in the window, oldest first."""
        return [lag for _, lag in self._window]

    def p99(self) -> float:
        return percentile(self.lags(), 0.99)

    def max(self) -> float:
        return max(self.lags(), default=0.0)

    def record(self, now: float, lag: float) -> None:
        """Note one wake-up `lag` seconds late at `now`."""
        LOOP_LAG.observe(lag)
        self._window.append((now, lag))
        while self._window and self._window[0][0] < now - WINDOW:
            self._window.popleft()
        if lag >= STALL_WARNING and now - self._last_warning >= LOG_EVERY:
            self._last_warning = now
            log.warning("the event loop stalled", extra={"stall_ms": round(lag * 1000)})

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        next_refresh = trio.current_time() + REFRESH
        while True:
            asked = trio.current_time() + TICK
            await trio.sleep_until(asked)
            now = trio.current_time()
            self.record(now, max(0.0, now - asked))
            if now >= next_refresh:
                next_refresh = now + REFRESH
                LOOP_LAG_P99.set(self.p99())
                LOOP_LAG_MAX.set(self.max())
