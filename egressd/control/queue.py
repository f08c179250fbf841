"""The reconciler's work queue, with client-go's workqueue semantics (docs/architecture.md).

* A key waits in the queue at most once (adds are deduplicated).
* A key handed out by `get()` is *processing* until `done(key)`; it is never
  handed out twice at once. Re-added while processing, it is queued again
  when `done()` is called, so the change that arrived meanwhile is seen.
* `add_after(key, delay)` queues later; a key waiting with an earlier time
  keeps the earlier one. The delays live in a heap that the queue's own
  `run()` task releases, so it must be started in a nursery.
* `add_rate_limited(key)` backs off per key, 1 s doubling to 5 min, until
  `forget(key)` after a successful pass.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

import trio

from egressd.backoff import Backoff
from egressd.errors import EgressdError
from egressd.metrics import WORKQUEUE_DEPTH, WORKQUEUE_RETRIES

K = TypeVar("K", bound=Hashable)


class QueueShutDown(EgressdError):
    """`get()` on a queue that was shut down and has nothing left to hand out."""


class WorkQueue(Generic[K]):
    """A deduplicating, delaying, rate-limited queue of keys for N workers."""

    def __init__(self, *, base_delay: float = 1.0, max_delay: float = 300.0,
                 jitter: tuple[float, float] = (1.0, 1.0)) -> None:
        """Per-key backoff: `base_delay` doubling to `max_delay`; no jitter by default
        (client-go's item limiter), so a key's retry times stay predictable."""
        self._backoff = Backoff(base_delay, max_delay, jitter=jitter)
        self._queue: deque[K] = deque()
        # Keys that need processing: queued, or re-added while processing.
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        # Delayed adds: (deadline, seq, key); `_waiting` holds each key's
        # earliest deadline so a stale heap entry is skipped when popped.
        self._heap: list[tuple[float, int, K]] = []
        self._waiting: dict[K, float] = {}
        self._seq = itertools.count()
        self._getters = trio.lowlevel.ParkingLot()
        self._timer = trio.lowlevel.ParkingLot()
        self._shut_down = False
        # One queue per process: a new queue owns the gauge from the start.
        self._depth_changed()

    def __len__(self) -> int:
        """Keys ready to be handed out (the depth metric)."""
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shut_down

    def processing(self) -> frozenset[K]:
        """Keys handed out and not yet done."""
        return frozenset(self._processing)

    def waiting(self) -> dict[K, float]:
        """Delayed keys and the trio time at which each is added."""
        return dict(self._waiting)

    def _depth_changed(self) -> None:
        WORKQUEUE_DEPTH.set(len(self._queue))

    def add(self, key: K) -> None:
        """Queue `key` now (no-op if it is already queued, or after shutdown)."""
        if self._shut_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # done() queues it again
        self._queue.append(key)
        self._depth_changed()
        self._getters.unpark()

    def add_after(self, key: K, delay: float) -> None:
        """Queue `key` after `delay` seconds; an earlier pending time for it wins."""
        if self._shut_down:
            return
        if delay <= 0:
            self.add(key)
            return
        deadline = trio.current_time() + delay
        current = self._waiting.get(key)
        if current is not None and current <= deadline:
            return
        self._waiting[key] = deadline
        first = not self._heap or deadline < self._heap[0][0]
        heapq.heappush(self._heap, (deadline, next(self._seq), key))
        if first:
            self._timer.unpark_all()

    def backoff(self, key: K) -> float:
        """The delay the next `add_rate_limited(key)` will use."""
        return self._backoff.delay(self._failures.get(key, 0) + 1)

    def add_rate_limited(self, key: K, *, at_least: float = 0.0) -> float:
        """Queue `key` after its per-key backoff, lengthened to `at_least` seconds (a
        server's Retry-After, bounded by the maximum delay), and lengthen the backoff.
        Returns the delay."""
        delay = max(self.backoff(key), min(at_least, self._backoff.maximum))
        self._failures[key] = self._failures.get(key, 0) + 1
        WORKQUEUE_RETRIES.inc()
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset `key`'s backoff (after a successful pass)."""
        self._failures.pop(key, None)

    def num_requeues(self, key: K) -> int:
        """How many rate-limited adds `key` had since it was last forgotten."""
        return self._failures.get(key, 0)

    def get_nowait(self) -> K:
        """The next key, marked processing; raises trio.WouldBlock when none is ready."""
        if not self._queue:
            if self._shut_down:
                raise QueueShutDown("work queue shut down")
            raise trio.WouldBlock
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        self._depth_changed()
        return key

    async def get(self) -> K:
        """Wait for the next key and mark it processing; call `done(key)` after.

        Raises QueueShutDown once the queue is shut down and empty.
        """
        while True:
            try:
                key = self.get_nowait()
            except trio.WouldBlock:
                await self._getters.park()
                continue
            # Yield even when a key was ready, so a busy queue cannot starve
            # the other tasks (trio's checkpoint rule).
            await trio.lowlevel.cancel_shielded_checkpoint()
            return key

    def done(self, key: K) -> None:
        """`key` is no longer processing; queue it again if it was re-added meanwhile."""
        self._processing.discard(key)
        if key in self._dirty and not self._shut_down:
            self._queue.append(key)
            self._depth_changed()
            self._getters.unpark()

    def release_due(self) -> float | None:
        """Queue every delayed key whose time has come; return the next deadline, if any.

        `run()` calls this; tests under a MockClock may call it after `clock.jump()`.
        """
        now = trio.current_time()
        while self._heap:
            deadline, _, key = self._heap[0]
            if self._waiting.get(key) != deadline:
                heapq.heappop(self._heap)  # superseded by an earlier add_after
                continue
            if deadline > now:
                return deadline
            heapq.heappop(self._heap)
            del self._waiting[key]
            self.add(key)
        return None

    def shut_down(self) -> None:
        """Refuse new keys; `get()` drains what is queued, then raises QueueShutDown."""
        self._shut_down = True
        self._heap.clear()
        self._waiting.clear()
        self._getters.unpark_all()
        self._timer.unpark_all()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Release delayed keys on time; runs until cancelled or shut down."""
        task_status.started()
        while not self._shut_down:
            deadline = self.release_due()
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await self._timer.park()
