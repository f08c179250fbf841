"""The health engine (docs/architecture.md): when each proxy is probed, how many probes run at
once, and what the verdict per proxy is.

It knows nothing of Kubernetes: the caller (the reconciler) turns each Proxy
into a `ProbeTarget`, calls `upsert`/`remove`, reads `snapshot(key)` and is
told through `on_change(key)` when a verdict is worth writing.

Scheduling: a heap of `(due, seq, key)` with lazy invalidation (an entry is
live only if its `seq` is still the proxy's), so a tick costs
O(due · log fleet) and nothing is O(fleet) per probe or per tick. Each due
proxy gets its own probe task in the engine's nursery, gated by one
`trio.CapacityLimiter`; a proxy is never handed out again while its probe is
in flight (or waiting for the limiter), even if it was removed and re-added
meanwhile.

Verdicts: consecutive successes/failures; healthy after `success_threshold`
successes, unhealthy after `failure_threshold` failures, and before either
threshold is first reached there is no verdict at all (`snapshot` is None).
"""

from __future__ import annotations

import heapq
import logging
import math
import random
from collections.abc import Awaitable, Callable, KeysView
from datetime import UTC, datetime
from typing import Final

import attrs
import trio

from egressd.health.probe import ProbeResult, ProbeTarget
from egressd.metrics import PROBES

log = logging.getLogger(__name__)

# docs/architecture.md: while healthy, a latency-only update is emitted when latency moved
# by at least this percentage since the last emission ...
LATENCY_CHANGE_PERCENT: Final = 20
# ... and the last emission is at least this old (seconds).
LATENCY_EMIT_MIN_INTERVAL: Final = 60.0

ProbeFn = Callable[[ProbeTarget], Awaitable[ProbeResult]]


@attrs.frozen(kw_only=True)
class Verdict:
    """A proxy's health as the engine currently holds it.

    `latency_ms` is the last successful probe's latency while healthy, None
    while unhealthy; `checked_at` is the wall-clock (UTC) time of the last
    probe; `reason` is the last probe result that agrees with the verdict.
    `successes`/`failures` are the current streaks (0 in a seed from status).
    """

    healthy: bool
    latency_ms: int | None
    checked_at: datetime
    reason: str
    successes: int = 0
    failures: int = 0


def _utcnow() -> datetime:
    return datetime.now(UTC)


@attrs.define(kw_only=True)
class _State:
    """Mutable per-proxy state; only the engine touches it."""

    target: ProbeTarget
    healthy: bool | None = None
    latency: float | None = None  # seconds, last successful probe
    reason: str = ""
    checked_at: datetime | None = None
    successes: int = 0
    failures: int = 0
    emitted_latency_ms: int | None = None
    emitted_at: float = -math.inf  # trio clock
    due: float = 0.0  # trio clock; meaningful while not in flight
    seq: int = 0  # the live heap entry's seq
    in_flight: bool = False
    # Bumped when the state is reset (host/port changed): an in-flight probe
    # of the old endpoint must not count for the new one.
    generation: int = 0
    # Set when the target changed while a probe was in flight: probe again on
    # the next tick after it ends instead of one interval later.
    probe_soon: bool = False
    # Set when this state came due while a probe of the same key, started
    # before a `remove`, was still running: that probe's task reschedules it.
    waiting: bool = False

    def reset(self) -> None:
        self.healthy = None
        self.latency = None
        self.reason = ""
        self.checked_at = None
        self.successes = self.failures = 0
        self.emitted_latency_ms = None
        self.emitted_at = -math.inf
        self.generation += 1


class HealthEngine:
    """Probes every known proxy on its interval and keeps a verdict per proxy.

    `probe` is called once per due proxy (`Prober.probe` in production, a
    scripted function in tests) and is expected to enforce the target's
    timeout itself; the engine only adds a backstop of `probe_grace` seconds
    beyond it. `on_change(key)` is called synchronously on every emission
    (docs/architecture.md) and must not block or raise (it enqueues a work-queue key).
    """

    def __init__(self, probe: ProbeFn, *, on_change: Callable[[str], None], concurrency: int,
                 tick: float = 1.0, rng: random.Random | None = None,
                 wall_clock: Callable[[], datetime] = _utcnow, probe_grace: float = 1.0) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self._probe = probe
        self._on_change = on_change
        self._limiter = trio.CapacityLimiter(concurrency)
        self._tick = tick
        # Jitter only spreads probes over time; it needs no unpredictability.
        self._rng = rng if rng is not None else random.Random()  # noqa: S311
        self._wall_clock = wall_clock
        self._probe_grace = probe_grace
        self._states: dict[str, _State] = {}
        # Key -> the state whose probe is in flight. It outlives a `remove`,
        # so a key removed and re-added mid-probe still has one probe at a time.
        self._running: dict[str, _State] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0

    # --- the caller's side -------------------------------------------------

    def upsert(self, target: ProbeTarget, *, seed: Verdict | None = None) -> None:
        """Start probing `target`, or update it; O(log fleet), a no-op if unchanged.

        `seed` (a verdict read back from status) is used only when the key is
        new: the proxy then starts with that verdict and is first probed at a
        random point within its interval, so a restart does not probe the
        whole fleet at once. Without a seed it is probed on the next tick.
        A changed host or port starts fresh state (the verdict was about
        another endpoint) and probes on the next tick; a changed URL keeps
        the verdict and streaks but probes on the next tick; other changes
        (interval, timeout, thresholds) keep everything and apply from the
        next probe; a new interval also moves the pending probe by the
        difference (never into the past). A target without a host is not
        probeable: its state is dropped, as by `remove` (docs/architecture.md).
        """
        if not target.host:
            self.remove(target.key)
            return
        now = trio.current_time()
        state = self._states.get(target.key)
        if state is None:
            state = _State(target=target)
            self._states[target.key] = state
            if seed is None:
                self._schedule(state, now)
            else:
                self._apply_seed(state, seed, now)
                self._schedule(state, now + self._rng.uniform(0.0, target.interval))
            return
        old = state.target
        if old == target:
            return
        state.target = target
        if (old.host, old.port) != (target.host, target.port):
            state.reset()
            self._probe_soon(state, now)
        elif old.url != target.url:
            self._probe_soon(state, now)
        elif target.interval != old.interval and not state.in_flight:
            # The next probe moves as if the new interval had been in force.
            self._schedule(state, max(now, state.due + target.interval - old.interval))

    def remove(self, key: str) -> None:
        """Forget `key` (no probeable host, or deleted); an in-flight probe's
        result is dropped, and a re-added key is probed only once it ended.
        Unknown keys are fine."""
        self._states.pop(key, None)
        # Its heap entry (if any) is now stale and is skipped when popped.

    def snapshot(self, key: str) -> Verdict | None:
        """The current verdict for `key`, or None if unknown or not decided yet."""
        state = self._states.get(key)
        if state is None or state.healthy is None or state.checked_at is None:
            return None
        latency_ms = (_ms(state.latency)
                      if state.healthy and state.latency is not None else None)
        return Verdict(healthy=state.healthy, latency_ms=latency_ms,
                       checked_at=state.checked_at, reason=state.reason,
                       successes=state.successes, failures=state.failures)

    def count_failure(self, key: str, reason: str) -> None:
        """Count a failure seen by a client (a `proxy_error` report) as a failed probe.

        It moves the failure streak and may flip the verdict to unhealthy (and
        emit) exactly as a failed probe would, but it is not a probe: the
        probe schedule and `checked_at` are untouched. Unknown keys are ignored.
        """
        state = self._states.get(key)
        if state is not None:
            self._record(state, ProbeResult(False, 0.0, reason), probed=False)

    def __contains__(self, key: object) -> bool:
        return key in self._states

    def __len__(self) -> int:
        return len(self._states)

    def keys(self) -> KeysView[str]:
        """The keys being probed (a live view)."""
        return self._states.keys()

    # --- the scheduler -----------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Tick forever, handing due proxies to probes; stop by cancellation.

        The first tick is at start; probes run in this task's own nursery, so
        cancelling `run` cancels them too (and their proxies are probed again
        on the first tick of the next `run`).
        """
        async with trio.open_nursery() as nursery:
            task_status.started()
            next_tick = trio.current_time()
            while True:
                self._dispatch(nursery, trio.current_time())
                next_tick += self._tick
                await trio.sleep_until(next_tick)

    def _dispatch(self, nursery: trio.Nursery, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, seq, key = heapq.heappop(heap)
            state = self._states.get(key)
            if state is None or state.seq != seq or state.in_flight:
                continue  # stale entry: removed, rescheduled, or already probing
            if key in self._running:
                # A probe from before a remove() is still out: one per proxy.
                state.waiting = True
                continue
            state.in_flight = True
            self._running[key] = state
            nursery.start_soon(self._probe_task, state, due, name=f"probe {key}")

    async def _probe_task(self, state: _State, due: float) -> None:
        target = state.target
        generation = state.generation
        result: ProbeResult | None = None
        try:
            async with self._limiter:
                # Removed or moved to another endpoint while queued for a slot:
                # the probe would be wasted on a proxy that is going away.
                if self._states.get(target.key) is state and generation == state.generation:
                    result = await self._run_probe(target)
        finally:
            # Also runs when cancelled (result None): the proxy must not stay
            # marked in flight, or a later `run` would never probe it again.
            state.in_flight = False
            del self._running[target.key]
            current = self._states.get(target.key)
            if current is not state:
                # Removed meanwhile: the result is dropped; a successor that
                # came due during this probe goes next.
                if current is not None and current.waiting:
                    current.waiting = False
                    self._schedule(current, trio.current_time())
            else:
                if result is not None and generation == state.generation:
                    self._record(state, result)
                now = trio.current_time()
                if result is None or state.probe_soon:
                    next_due = now
                else:
                    # Keep the cadence of the schedule, not of completions; an
                    # engine that has fallen behind probes again on the next tick.
                    next_due = max(due + state.target.interval, now)
                state.probe_soon = False
                self._schedule(state, next_due)

    async def _run_probe(self, target: ProbeTarget) -> ProbeResult:
        start = trio.current_time()
        with trio.move_on_after(target.timeout + self._probe_grace):
            try:
                return await self._probe(target)
            except Exception as e:
                # One odd probe must not stop the probing of the fleet.
                log.warning("probe raised", exc_info=True, extra={"proxy": target.key})
                PROBES.labels(result="error").inc()
                return ProbeResult(False, trio.current_time() - start,
                                   f"probe error: {type(e).__name__}: {e}")
        PROBES.labels(result="timeout").inc()
        return ProbeResult(False, trio.current_time() - start,
                           f"timeout after {target.timeout:g}s")

    def _schedule(self, state: _State, due: float) -> None:
        self._seq += 1
        state.seq = self._seq
        state.due = due
        heapq.heappush(self._heap, (due, self._seq, state.target.key))
        # Stale entries accumulate when targets are rescheduled or removed;
        # rebuilding once they outnumber live ones keeps this amortised O(log n).
        if len(self._heap) > 2 * len(self._states) + 64:
            self._heap = [(s.due, s.seq, k) for k, s in self._states.items() if not s.in_flight]
            heapq.heapify(self._heap)

    def _probe_soon(self, state: _State, now: float) -> None:
        if state.in_flight:
            state.probe_soon = True
        else:
            self._schedule(state, now)

    # --- verdicts ----------------------------------------------------------

    def _apply_seed(self, state: _State, seed: Verdict, now: float) -> None:
        state.healthy = seed.healthy
        state.latency = seed.latency_ms / 1000 if seed.latency_ms is not None else None
        state.reason = seed.reason
        state.checked_at = seed.checked_at
        state.successes = seed.successes
        state.failures = seed.failures
        # The seed is what status already shows: count it as emitted now, so
        # a restart does not turn into one status write per proxy.
        state.emitted_latency_ms = seed.latency_ms if seed.healthy else None
        state.emitted_at = now

    def _record(self, state: _State, result: ProbeResult, *, probed: bool = True) -> None:
        target = state.target
        if probed:
            state.checked_at = self._wall_clock()
        if result.ok:
            state.successes += 1
            state.failures = 0
            state.latency = result.latency
        else:
            state.failures += 1
            state.successes = 0
        before = state.healthy
        if result.ok and state.successes >= target.success_threshold:
            state.healthy = True
        elif not result.ok and state.failures >= target.failure_threshold:
            state.healthy = False
        if state.healthy is None or state.healthy == result.ok:
            state.reason = result.reason
        if state.healthy is None:
            return
        now = trio.current_time()
        if state.healthy != before:
            log.info("proxy healthy" if state.healthy else "proxy unhealthy",
                     extra={"proxy": target.key, "reason": state.reason})
        elif not (state.healthy and result.ok and self._latency_moved(state, now)):
            return
        state.emitted_at = now
        state.emitted_latency_ms = (_ms(state.latency)
                                    if state.healthy and state.latency is not None else None)
        self._on_change(target.key)

    @staticmethod
    def _latency_moved(state: _State, now: float) -> bool:
        if now - state.emitted_at < LATENCY_EMIT_MIN_INTERVAL or state.latency is None:
            return False
        last, current = state.emitted_latency_ms, _ms(state.latency)
        if last is None:
            return True
        # In whole milliseconds, as status shows latency, and in integers so
        # that exactly 20 % counts (0.12 - 0.10 < 0.2 * 0.10 in floats); an
        # unchanged value is never news (0 ms -> 0 ms).
        return current != last and 100 * abs(current - last) >= LATENCY_CHANGE_PERCENT * last


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
