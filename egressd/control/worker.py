"""The reconciler's worker loop (docs/architecture.md): keys from the work queue through a pass.

It knows nothing of Proxies. A pass is any `async (key) -> Outcome`; `process`
runs one, turns an unexpected error into a backed-off retry, schedules the
follow-up the outcome names and records the pass's metrics; `run_workers`
runs N workers that take keys from the queue until cancelled, so a key is
never in two passes at once (the queue's guarantee) and a key cancelled
mid-pass (leadership lost) is queued again for the next term.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

from egressd.control.queue import QueueShutDown, WorkQueue
from egressd.metrics import RECONCILE_DURATION, RECONCILES

log = logging.getLogger(__name__)

# RECONCILES{result} values.
RESULT_OK = "ok"
RESULT_ERROR = "error"
RESULT_PERMANENT = "permanent"
RESULT_NOT_CONFIGURED = "not_configured"
RESULT_QUOTA = "quota"
RESULT_CONFLICT = "conflict"
RESULT_INVALID = "invalid"
RESULT_GONE = "gone"


@attrs.frozen
class Outcome:
    """How a pass ends: its metric result and the follow-up it schedules.

    `after`: queue the key again in that many seconds (None: not at all).
    `rate_limited`: queue it after its per-key backoff instead, never sooner
    than `at_least` (a provider's `retry_after` hint).
    """

    result: str = RESULT_OK
    after: float | None = None
    rate_limited: bool = False
    at_least: float = 0.0


Pass = Callable[[str], Awaitable[Outcome]]


def schedule(queue: WorkQueue[str], key: str, outcome: Outcome) -> None:
    """Queue the follow-up `outcome` asks for; a pass that did not fail resets the backoff."""
    if outcome.rate_limited:
        queue.add_rate_limited(key, at_least=outcome.at_least)
        return
    queue.forget(key)
    if outcome.after is not None:
        queue.add_after(key, outcome.after)


async def process(queue: WorkQueue[str], key: str, run_pass: Pass) -> None:
    """One pass over `key` and its follow-up. Never raises (except Cancelled): an
    unexpected error is logged and retried with backoff."""
    start = trio.current_time()
    try:
        outcome = await run_pass(key)
    except Exception:
        log.exception("reconcile failed", extra={"proxy": key})
        outcome = Outcome(RESULT_ERROR, rate_limited=True)
    schedule(queue, key, outcome)
    RECONCILES.labels(result=outcome.result).inc()
    RECONCILE_DURATION.observe(trio.current_time() - start)


async def _worker(queue: WorkQueue[str], handle: Callable[[str], Awaitable[None]]) -> None:
    while True:
        try:
            key = await queue.get()
        except QueueShutDown:
            return
        finished = False
        try:
            await handle(key)
            finished = True
        finally:
            if not finished:
                # Cancelled mid-key (leadership lost): the next term redoes it.
                queue.add(key)
            queue.done(key)


async def run_workers(queue: WorkQueue[str], handle: Callable[[str], Awaitable[None]], *,
                      count: int,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run `count` workers, each calling `handle(key)` for the keys it takes, until
    cancelled or the queue shuts down. `started()` once every worker runs."""
    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(_worker, queue, handle, name=f"reconcile worker {i}")
        task_status.started()
