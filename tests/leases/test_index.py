"""The candidate index against the plain linear selection, on random operation sequences.

`LinearModel` is SPEC §7's rule written as directly as it reads: filter the
leasable candidates by selector, count those in cooldown and those full, take
the least loaded, then lowest latency, then name. The state machine drives
the real `MemoryLeaseStore` (its index, cooldown book and heaps) and the model
with the same upserts, removals, label and health changes, acquires,
releases, expiries, reports and merged cooldowns, and every acquire must agree
on the lease or on the refusal's counts and Retry-After. The store's methods
never await without a hook, so the machine drives them without an event loop.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Coroutine, Mapping
from typing import Any, TypeVar

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from egressd.leases import GLOBAL, Candidate, Cooldown, Grant, Refusal, Result
from egressd.leases.store import MemoryLeaseStore

T = TypeVar("T")
KEYS = [f"ns/p{i}" for i in range(4)]
TARGETS = [GLOBAL, "a.example", "b.example"]
SELECTORS: list[dict[str, str]] = [
    {}, {"region": "eu"}, {"region": "us"}, {"tier": "dc"},
    {"region": "eu", "tier": "dc"}, {"region": "us", "tier": "res"}, {"region": "mars"},
]
attributes = st.fixed_dictionaries({}, optional={
    "region": st.sampled_from(["eu", "us"]), "tier": st.sampled_from(["dc", "res"])})


def done(coro: Coroutine[Any, Any, T]) -> T:
    """Run a store coroutine that never awaits to its end."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    raise AssertionError("the store awaited")


@attrs.define
class _Lease:
    key: str
    expires_at: float
    released: bool = False


class LinearModel:
    """The selection rule over plain dicts, nothing indexed."""

    def __init__(self) -> None:
        self.candidates: dict[str, Candidate] = {}
        self.leases: dict[str, _Lease] = {}
        self.cooldowns: dict[tuple[str, str], float] = {}

    def active(self, key: str, now: float) -> list[_Lease]:
        return [x for x in self.leases.values()
                if x.key == key and not x.released and x.expires_at > now]

    def until(self, key: str, target: str, now: float) -> float | None:
        until = self.cooldowns.get((key, target))
        return until if until is not None and until > now else None

    def acquire(self, selector: Mapping[str, str], target: str, now: float,
                exclude: Collection[str] = (), only: str | None = None) -> str | Refusal:
        cooling = full = 0
        best: tuple[Any, ...] | None = None
        ready = math.inf
        for c in self.candidates.values():
            if c.key in exclude or (only is not None and c.key != only):
                continue
            if not all(c.attributes.get(k) == v for k, v in selector.items()):
                continue
            active = self.active(c.key, now)
            glob = self.until(c.key, GLOBAL, now)
            own = self.until(c.key, target, now) if target else None
            if glob is not None:
                cooling += 1
                ready = min(ready, glob)
            elif own is not None:
                cooling += 1
                ready = min(ready, own)
                if len(active) >= c.max_leases and active:
                    ready = min(ready, *(x.expires_at for x in active))
            elif len(active) >= c.max_leases:
                full += 1
                if active:
                    ready = min(ready, *(x.expires_at for x in active))
            else:
                latency = c.latency_ms
                rank = (len(active), latency is None, latency or 0.0, c.key)
                if best is None or rank < best:
                    best = rank
        if best is not None:
            return str(best[3])
        return Refusal(considered=cooling + full, at_capacity=full, in_cooldown=cooling,
                       retry_after=None if math.isinf(ready) else ready - now)


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_800_000_000.0
        self.store = MemoryLeaseStore(cooldown=60, ban_cooldown=300, max_cooldown=300,
                                      clock=lambda: self.now)
        self.model = LinearModel()

    @initialize(fleet=st.lists(st.tuples(st.integers(0, 3), attributes), min_size=len(KEYS),
                               max_size=len(KEYS)))
    def offer_fleet(self, fleet: list[tuple[int, dict[str, str]]]) -> None:
        for key, (max_leases, attrs_) in zip(KEYS, fleet, strict=True):
            self.upsert(key, max_leases, None, attrs_)

    @rule(key=st.sampled_from(KEYS), max_leases=st.integers(0, 3),
          latency=st.none() | st.sampled_from([5.0, 20.0, 20.0, 80.0]), attrs_=attributes)
    def upsert(self, key: str, max_leases: int, latency: float | None,
               attrs_: dict[str, str]) -> None:
        """A proxy appears or turns leasable, or its labels, capacity or latency change."""
        c = Candidate(key=key, max_leases=max_leases, latency_ms=latency, attributes=attrs_)
        self.store.put_candidate(c)
        self.model.candidates[key] = c

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: str) -> None:
        """A proxy leaves the cache or stops being leasable (health, phase)."""
        self.store.remove_candidate(key)
        self.model.candidates.pop(key, None)

    @rule(selector=st.sampled_from(SELECTORS), site=st.sampled_from(TARGETS),
          ttl=st.sampled_from([5.0, 30.0, 90.0]))
    def acquire(self, selector: dict[str, str], site: str, ttl: float) -> None:
        expected = self.model.acquire(selector, site, self.now)
        got = done(self.store.acquire(selector, target=site, ttl=ttl))
        if isinstance(expected, str):
            assert isinstance(got, Grant), (expected, got)
            assert got.lease.key == expected
            self.model.leases[got.lease.id] = _Lease(key=expected, expires_at=self.now + ttl)
            assert got.active_leases == len(self.model.active(expected, self.now))
        else:
            assert got == expected

    @rule(site=st.sampled_from(TARGETS))
    def acquire_any(self, site: str) -> None:
        """The most common call: no selector."""
        self.acquire({}, site, 30.0)

    @rule(selector=st.sampled_from(SELECTORS), site=st.sampled_from(TARGETS),
          exclude=st.sets(st.sampled_from(KEYS), max_size=2),
          only=st.none() | st.sampled_from(KEYS))
    def acquire_gateway(self, selector: dict[str, str], site: str, exclude: set[str],
                        only: str | None) -> None:
        """The gateway's acquire: proxies already tried passed over, or one sticky proxy."""
        expected = self.model.acquire(selector, site, self.now, exclude, only)
        got = done(self.store.acquire(selector, target=site, ttl=30.0, exclude=exclude,
                                      only=only))
        if isinstance(expected, str):
            assert isinstance(got, Grant), (expected, got)
            assert got.lease.key == expected
            self.model.leases[got.lease.id] = _Lease(key=expected, expires_at=self.now + 30.0)
        else:
            assert got == expected

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if self.model.leases:
            # In issue order: the ids are random, an order by id would differ between runs.
            lease_id = data.draw(st.sampled_from(list(self.model.leases)))
            done(self.store.release(lease_id))
            self.model.leases[lease_id].released = True

    @rule(data=st.data(), result=st.sampled_from([Result.RATE_LIMITED, Result.BANNED]),
          site=st.none() | st.sampled_from(TARGETS[1:]),
          retry_after=st.none() | st.sampled_from([1.0, 7.0, 45.0]))
    def report(self, data: st.DataObject, result: Result, site: str | None,
               retry_after: float | None) -> None:
        live = [i for i, x in self.model.leases.items()
                if not x.released and x.expires_at > self.now]
        if not live:
            return
        lease_id = data.draw(st.sampled_from(live))
        cd = done(self.store.report(lease_id, result=result, target=site,
                                    retry_after=retry_after))
        assert cd is not None
        slot = (cd.key, cd.target)
        self.model.cooldowns[slot] = max(self.model.cooldowns.get(slot, 0.0), cd.until)

    @rule(key=st.sampled_from(KEYS), site=st.sampled_from(TARGETS),
          seconds=st.sampled_from([-5.0, 3.0, 3.0, 40.0, 400.0]))
    def merge(self, key: str, site: str, seconds: float) -> None:
        """A cooldown read back from a Proxy's status (a restart, another replica)."""
        until = self.now + seconds
        self.store.merge_cooldowns(
            [Cooldown(key=key, target=site, until=until, reason=Result.BANNED)])
        if until > self.now:
            slot = (key, site)
            self.model.cooldowns[slot] = max(self.model.cooldowns.get(slot, 0.0), until)

    @rule(seconds=st.sampled_from([0.5, 1.0, 5.0, 30.0, 100.0]))
    def advance(self, seconds: float) -> None:
        """Time passes: leases expire and cooldowns end, with no call in between."""
        self.now += seconds

    @rule()
    def collect(self) -> None:
        self.store.collect()

    @invariant()
    def usage_agrees(self) -> None:
        usage = done(self.store.usage(KEYS))
        for key in KEYS:
            active = len(self.model.active(key, self.now))
            got = usage.get(key)
            assert (got.active_leases if got else 0) == active


def test_index_matches_linear_selection() -> None:
    run_state_machine_as_test(
        IndexMachine,
        settings=settings(max_examples=300, stateful_step_count=40, deadline=None,
                          database=None),
    )
