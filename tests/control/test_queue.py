"""The work queue: client-go workqueue semantics, delays under trio's MockClock."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from egressd.control.queue import QueueShutDown, WorkQueue
from egressd.metrics import REGISTRY


def depth() -> float | None:
    return REGISTRY.get_sample_value("egressd_workqueue_depth")


async def test_dedup_and_fifo() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ["a", "b", "a", "c", "b"]:
        q.add(key)
    assert len(q) == 3
    assert depth() == 3
    assert [await q.get(), await q.get(), await q.get()] == ["a", "b", "c"]
    assert depth() == 0


async def test_key_never_handed_out_twice_and_rerun_after_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert await q.get() == "a"
    q.add("a")  # a change arrives while a worker holds "a"
    q.add("a")
    assert len(q) == 0
    with pytest.raises(trio.WouldBlock):
        q.get_nowait()
    q.done("a")
    assert len(q) == 1
    assert await q.get() == "a"
    q.done("a")
    assert len(q) == 0


async def test_get_waits_for_add() -> None:
    q: WorkQueue[str] = WorkQueue()
    got: list[str] = []
    async with trio.open_nursery() as nursery:
        async def worker() -> None:
            got.append(await q.get())

        nursery.start_soon(worker)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        q.add("x")
    assert got == ["x"]


async def test_add_after_fires_on_time(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue()
    async with trio.open_nursery() as nursery:
        await nursery.start(q.run)
        start = trio.current_time()
        q.add_after("late", 10.0)
        q.add_after("early", 3.0)
        q.add_after("late", 20.0)  # a later time does not postpone the earlier one
        assert await q.get() == "early"
        assert trio.current_time() - start == pytest.approx(3.0)
        assert await q.get() == "late"
        assert trio.current_time() - start == pytest.approx(10.0)
        with trio.move_on_after(100):
            await q.get()
            pytest.fail("a superseded delay must not add the key again")
        nursery.cancel_scope.cancel()


async def test_rate_limited_never_sooner_than_a_retry_after(
        autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=1.0, max_delay=60.0)
    assert q.add_rate_limited("a", at_least=7.0) == 7.0  # the hint beats a 1 s backoff
    assert q.num_requeues("a") == 1 and q.backoff("a") == 2.0  # the backoff still grows
    assert q.add_rate_limited("b", at_least=3600.0) == 60.0  # bounded by the maximum delay
    q.add_rate_limited("c")
    q.add_rate_limited("c")
    assert q.add_rate_limited("c", at_least=1.5) == 4.0  # a shorter hint changes nothing
    async with trio.open_nursery() as nursery:
        await nursery.start(q.run)
        start = trio.current_time()
        assert await q.get() == "c"  # the first add of "c": 1 s
        q.done("c")
        assert await q.get() == "a"
        assert trio.current_time() - start == pytest.approx(7.0)
        nursery.cancel_scope.cancel()


async def test_rate_limited_backoff_and_forget(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[str] = WorkQueue()
    retries = REGISTRY.get_sample_value("egressd_workqueue_retries_total") or 0.0
    delays = [q.add_rate_limited("k") for _ in range(12)]
    assert delays[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert delays[-1] == 300.0
    assert max(delays) == 300.0
    assert q.num_requeues("k") == 12
    assert REGISTRY.get_sample_value("egressd_workqueue_retries_total") == retries + 12
    q.forget("k")
    assert q.backoff("k") == 1.0
    async with trio.open_nursery() as nursery:
        await nursery.start(q.run)
        start = trio.current_time()
        # The first rate-limited add (1 s) is the earliest deadline for "k".
        assert await q.get() == "k"
        assert trio.current_time() - start == pytest.approx(1.0)
        nursery.cancel_scope.cancel()


async def test_shutdown_drains_then_raises() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.shut_down()
    q.add("b")
    assert await q.get() == "a"
    with pytest.raises(QueueShutDown):
        await q.get()


async def test_shutdown_wakes_waiting_workers() -> None:
    q: WorkQueue[str] = WorkQueue()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            async def worker() -> None:
                with pytest.raises(QueueShutDown):
                    await q.get()

            for _ in range(3):
                nursery.start_soon(worker)
            await trio.testing.wait_all_tasks_blocked()
            q.shut_down()


async def test_workers_never_share_a_key(autojump_clock: trio.testing.MockClock) -> None:
    q: WorkQueue[int] = WorkQueue()
    busy: set[int] = set()
    runs: dict[int, int] = {}

    async def worker() -> None:
        while True:
            try:
                key = await q.get()
            except QueueShutDown:
                return
            assert key not in busy
            busy.add(key)
            await trio.sleep(0.1)
            runs[key] = runs.get(key, 0) + 1
            busy.discard(key)
            q.done(key)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(worker)
        for round_ in range(20):
            for key in range(5):
                q.add(key)
            await trio.sleep(0.03 * (round_ % 4))
        await trio.sleep(5)
        q.shut_down()
    assert set(runs) == set(range(5))


class QueueMachine(RuleBasedStateMachine):
    """The queue against a model of client-go's semantics, in virtual time."""

    def __init__(self, clock: trio.testing.MockClock) -> None:
        super().__init__()
        self.clock = clock
        self.q: WorkQueue[str] = WorkQueue(base_delay=1.0, max_delay=8.0)
        self.queued: list[str] = []
        self.dirty: set[str] = set()
        self.processing: set[str] = set()
        self.waiting: dict[str, float] = {}
        # When each key's current delay was set: equal deadlines fire in that order.
        self.delay_order: dict[str, int] = {}
        self.delays_set = 0
        self.failures: dict[str, int] = {}

    keys = st.sampled_from(["a", "b", "c", "d"])

    def _model_add(self, key: str) -> None:
        if key in self.dirty:
            return
        self.dirty.add(key)
        if key not in self.processing:
            self.queued.append(key)

    def _model_delay(self, key: str, deadline: float) -> None:
        if key in self.waiting and self.waiting[key] <= deadline:
            return
        self.waiting[key] = deadline
        self.delays_set += 1
        self.delay_order[key] = self.delays_set

    @rule(key=keys)
    def add(self, key: str) -> None:
        self.q.add(key)
        self._model_add(key)

    @rule(key=keys, delay=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    def add_after(self, key: str, delay: float) -> None:
        self.q.add_after(key, delay)
        if delay <= 0:
            self._model_add(key)
            return
        deadline = trio.current_time() + delay
        self._model_delay(key, deadline)

    @rule(key=keys)
    def add_rate_limited(self, key: str) -> None:
        n = self.failures.get(key, 0)
        expected = min(1.0 * 2**n, 8.0)
        assert self.q.add_rate_limited(key) == expected
        self.failures[key] = n + 1
        deadline = trio.current_time() + expected
        self._model_delay(key, deadline)

    @rule(key=keys)
    def forget(self, key: str) -> None:
        self.q.forget(key)
        self.failures.pop(key, None)

    @rule()
    def get(self) -> None:
        if not self.queued:
            with pytest.raises(trio.WouldBlock):
                self.q.get_nowait()
            return
        key = self.q.get_nowait()
        assert key == self.queued.pop(0)
        assert key not in self.processing, "a key was handed out twice at once"
        self.processing.add(key)
        self.dirty.discard(key)

    @precondition(lambda self: bool(self.processing))
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.processing)))
        self.q.done(key)
        self.processing.discard(key)
        if key in self.dirty:
            self.queued.append(key)

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 2.0, 5.0]))
    def advance(self, dt: float) -> None:
        self.clock.jump(dt)
        self.q.release_due()
        now = trio.current_time()
        due = sorted(self.waiting.items(), key=lambda kv: (kv[1], self.delay_order[kv[0]]))
        for key, deadline in due:
            if deadline <= now:
                del self.waiting[key]
                self._model_add(key)

    @invariant()
    def matches_model(self) -> None:
        assert len(self.q) == len(self.queued)
        assert depth() == len(self.queued)
        assert self.q.processing() == self.processing
        assert len(set(self.queued)) == len(self.queued), "a key is queued twice"
        assert not set(self.queued) & self.processing
        assert self.q.waiting() == self.waiting


async def test_queue_state_machine(mock_clock: trio.testing.MockClock) -> None:
    # All rules are synchronous: the machine runs inside this trio task and
    # moves virtual time itself with clock.jump().
    run_state_machine_as_test(
        lambda: QueueMachine(mock_clock),
        settings=settings(max_examples=100, stateful_step_count=30, deadline=None),
    )
