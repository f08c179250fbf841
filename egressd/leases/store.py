"""The in-memory lease store: selection, leases with a TTL, cooldowns (docs/reference.md).

It knows nothing of Kubernetes or of `Proxy` (import-linter forbids both): the
Proxy cache hands it plain `Candidate` values, already filtered for health, on
every change (`put_candidate`, `remove_candidate`), and it keeps them in a
`CandidateIndex` ordered as the API selects (docs/reference.md).

Time is wall-clock seconds from an injected `clock` (tests derive it from trio's
mock clock). Expiry is decided on every read against that clock, so a lease's
TTL frees its slot even if the sweeper never runs; the sweeper (`run`) only
forgets what nobody can ask about any more.

Cost per call: no call scans the fleet, the leases or the cooldowns. An
acquire reads the first free candidate of the selector's smallest bucket
(O(log n); what bounds the walk past cooled-down entries is written in
`egressd.leases.index`); active leases are per-proxy counters kept up to date
by a heap of expiry times, cooldowns end by a heap of end times
(`egressd.leases.cooldowns`), and each change moves one candidate in the index.
"""

from __future__ import annotations

import heapq
import logging
import math
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Mapping

import attrs
import trio

from egressd import metrics
from egressd.leases.cooldowns import DEFAULT_CAP, CooldownBook
from egressd.leases.index import Blocked, CandidateIndex, Load
from egressd.leases.interface import (
    GLOBAL,
    Candidate,
    Cooldown,
    CooldownHook,
    Grant,
    Lease,
    Refusal,
    Result,
    UnknownLeaseError,
    Usage,
)
from egressd.settings import Settings

log = logging.getLogger(__name__)

MIN_RETRY_AFTER = 1.0
"""docs/reference.md: a client's retryAfterSeconds is bounded below by one second."""


@attrs.define
class _Record:
    lease: Lease
    active: bool = True
    # When an inactive (expired or released) lease is forgotten; reports land until then.
    forget_at: float = math.inf
    # A lease's proxy_error counts against the proxy's health once, however often reported.
    proxy_error_counted: bool = False


class MemoryLeaseStore:
    """Leases and cooldowns of one process; satisfies `LeaseStore`.

    Every method changes its state without an await, so on the trio thread each
    change is atomic: select-then-insert in `acquire` cannot interleave with
    another request, and no lock is needed. The only await is `report`'s call of
    the cooldown hook, after its cooldown is already in force.
    """

    def __init__(
        self,
        *,
        cooldown: float,
        ban_cooldown: float,
        max_cooldown: float,
        retention: float | None = None,
        sweep_interval: float = 5.0,
        clock: Callable[[], float] = time.time,
        max_cooldowns_per_proxy: int = DEFAULT_CAP,
        on_proxy_error: Callable[[str], None] | None = None,
        on_cooldown: CooldownHook | None = None,
    ) -> None:
        self._cooldown = cooldown
        self._ban_cooldown = ban_cooldown
        self._max_cooldown = max_cooldown
        # docs/reference.md: expired leases are kept "one cooldown window" for late reports.
        self._retention = cooldown if retention is None else retention
        self._sweep_interval = sweep_interval
        self._clock = clock
        # Called with the proxy key of each lease's first proxy_error report (docs/reference.md:
        # it counts as a failed probe); must not block or raise.
        self._on_proxy_error = on_proxy_error
        # Persistence observes the store through this hook (egressd.leases.persist).
        self._on_cooldown = on_cooldown
        self._leases: dict[str, _Record] = {}
        self._active: dict[str, int] = {}
        # (expires_at, lease id) of every lease granted and not yet expired or released;
        # entries of released leases are stale and skipped when popped.
        self._expiry: list[tuple[float, str]] = []
        # (forget_at, lease id) of inactive leases, for the sweeper.
        self._forget: list[tuple[float, str]] = []
        # Per proxy, (expires_at, lease id) of its leases: the soonest end of a full proxy.
        self._ends: dict[str, list[tuple[float, str]]] = {}
        self._cooldowns = CooldownBook(cap=max_cooldowns_per_proxy)
        self._index = CandidateIndex()

    @classmethod
    def from_settings(
        cls, settings: Settings, *, clock: Callable[[], float] = time.time,
        on_proxy_error: Callable[[str], None] | None = None,
        on_cooldown: CooldownHook | None = None,
    ) -> MemoryLeaseStore:
        return cls(
            cooldown=settings.cooldown,
            ban_cooldown=settings.ban_cooldown,
            max_cooldown=settings.max_cooldown,
            max_cooldowns_per_proxy=settings.max_cooldowns_per_proxy,
            clock=clock,
            on_proxy_error=on_proxy_error,
            on_cooldown=on_cooldown,
        )

    def now(self) -> float:
        """The store's wall clock, in seconds since the epoch."""
        return self._clock()

    # --- the candidates, fed by the Proxy cache -----------------------------------------

    def put_candidate(self, candidate: Candidate) -> None:
        # No clock read: a lease or cooldown that ended meanwhile moves the candidate at the
        # next call's `_expire`, before any choice is made.
        self._index.put(candidate, self._load(candidate.key))

    def remove_candidate(self, key: str) -> None:
        self._index.remove(key)

    # --- LeaseStore (no method awaits before its state change is done) --------------

    async def acquire(
        self, selector: Mapping[str, str], *, target: str, ttl: float,
        exclude: Collection[str] = (), only: str | None = None,
    ) -> Grant | Refusal:
        """Select the best candidate and insert its lease in one step.

        Order: fewest active leases, then lowest latency (unknown last), then key.
        """
        if not ttl > 0:
            raise ValueError(f"ttl must be positive, got {ttl!r}")
        now = self._clock()
        self._expire(now)
        choice = self._index.choose(selector, cooling=self._cooldowns.cooling(target),
                                    exclude=exclude, only=only)
        if isinstance(choice, Blocked):
            considered = choice.in_cooldown + choice.at_capacity
            reason = _refusal_reason(considered, choice.at_capacity, choice.in_cooldown)
            metrics.LEASES_REFUSED.labels(reason).inc()
            retry_after = None if choice.ready_at is None else max(0.0, choice.ready_at - now)
            return Refusal(considered=considered, at_capacity=choice.at_capacity,
                           in_cooldown=choice.in_cooldown, retry_after=retry_after)
        key = choice
        lease = Lease(id=secrets.token_urlsafe(24), key=key, target=target, expires_at=now + ttl)
        self._leases[lease.id] = _Record(lease=lease)
        heapq.heappush(self._expiry, (lease.expires_at, lease.id))
        heapq.heappush(self._ends.setdefault(key, []), (lease.expires_at, lease.id))
        active = self._active.get(key, 0) + 1
        self._active[key] = active
        self._index.update(key, self._load(key))
        metrics.LEASES_GRANTED.inc()
        metrics.LEASES_ACTIVE.inc()
        return Grant(lease=lease, active_leases=active)

    async def lease(self, lease_id: str) -> Lease | None:
        self._expire(self._clock())
        rec = self._leases.get(lease_id)
        return rec.lease if rec is not None and rec.active else None

    async def release(self, lease_id: str) -> None:
        now = self._clock()
        self._expire(now)
        rec = self._leases.get(lease_id)
        if rec is not None and rec.active:
            # Kept like an expired lease: a client may release first and report after.
            self._deactivate(rec, forget_at=now + self._retention)

    async def report(
        self,
        lease_id: str,
        *,
        result: Result,
        target: str | None = None,
        retry_after: float | None = None,
    ) -> Cooldown | None:
        now = self._clock()
        self._expire(now)
        rec = self._leases.get(lease_id)
        if rec is None or (not rec.active and rec.forget_at <= now):
            raise UnknownLeaseError(f"no lease {lease_id!r}")
        metrics.REPORTS.labels(result.value).inc()
        if result is Result.OK:
            return None
        if result is Result.PROXY_ERROR:
            # No cooldown: the proxy is broken for everyone, which is health's business.
            if not rec.proxy_error_counted:
                rec.proxy_error_counted = True
                if self._on_proxy_error is not None:
                    self._on_proxy_error(rec.lease.key)
            return None
        if result is Result.BANNED:
            # docs/reference.md: a 429 is not a ban; a ban never takes the client's Retry-After.
            duration = self._ban_cooldown
        elif retry_after is not None:
            duration = min(max(retry_after, MIN_RETRY_AFTER), self._max_cooldown)
        else:
            duration = self._cooldown
        scope = target or rec.lease.target or GLOBAL
        # Whole seconds (rounded up): the RFC 3339 copy in status.cooldowns then reads
        # back as exactly this value, and a cooldown is never cut short by rounding.
        until = float(math.ceil(now + duration))
        new = Cooldown(key=rec.lease.key, target=scope, until=until, reason=result)
        kept = self._set_cooldown(new)
        if kept is new and self._on_cooldown is not None:
            # After the state change: the cooldown holds here whatever the hook does.
            await self._on_cooldown(new)
        return kept

    async def usage(self, keys: Iterable[str]) -> Mapping[str, Usage]:
        now = self._clock()
        self._expire(now)
        out: dict[str, Usage] = {}
        for key in keys:
            active = self._active.get(key, 0)
            live = self._cooldowns.of(key, now)
            if active or live:
                out[key] = Usage(active_leases=active, cooldowns=live)
        return out

    # --- cooldowns from elsewhere (persisted status, other replicas) ----------------------

    def merge_cooldowns(self, cooldowns: Iterable[Cooldown]) -> None:
        """Adopt cooldowns recorded elsewhere; the later `until` wins per (key, target).

        Merging never shortens a cooldown, so replaying an old copy of a Proxy's
        status cannot lift a ban this store has just recorded.
        """
        now = self._clock()
        for cd in cooldowns:
            if cd.until > now:
                self._set_cooldown(cd)

    def cooldowns(self, key: str) -> Mapping[str, Cooldown]:
        """The cooldowns of one proxy still in force, by target (`""` = global)."""
        return self._cooldowns.of(key, self._clock())

    # --- garbage collection ---------------------------------------------------------------

    def collect(self) -> None:
        """Forget leases past their retention window (and, through `_expire`, cooldowns)."""
        now = self._clock()
        self._expire(now)
        while self._forget and self._forget[0][0] <= now:
            _, lease_id = heapq.heappop(self._forget)
            rec = self._leases.get(lease_id)
            if rec is not None and not rec.active and rec.forget_at <= now:
                del self._leases[lease_id]

    async def run(self, *, interval: float | None = None,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The sweeper: collect garbage every `interval` seconds until cancelled.

        Correctness never depends on it (every read checks the clock); it bounds
        memory and keeps the lease and cooldown gauges current while idle.
        """
        task_status.started()
        while True:
            await trio.sleep(self._sweep_interval if interval is None else interval)
            self.collect()

    def remembered(self) -> int:
        """Leases remembered (active or retained), for tests of the sweeper."""
        return len(self._leases)

    # --- internals ------------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, lease_id = heapq.heappop(self._expiry)
            rec = self._leases.get(lease_id)
            if rec is not None and rec.active:
                self._deactivate(rec, forget_at=expires_at + self._retention)
        for key in self._cooldowns.expire(now):  # their global cooldown ended
            self._index.update(key, self._load(key))

    def _deactivate(self, rec: _Record, *, forget_at: float) -> None:
        rec.active = False
        rec.forget_at = forget_at
        heapq.heappush(self._forget, (forget_at, rec.lease.id))
        key = rec.lease.key
        left = self._active[key] - 1
        if left:
            self._active[key] = left
        else:
            del self._active[key]
            del self._ends[key]
        metrics.LEASES_ACTIVE.dec()
        self._index.update(key, self._load(key))

    def _load(self, key: str) -> Load:
        """The candidate's place in the index: its leases, global cooldown and soonest end."""
        soonest = math.inf
        ends = self._ends.get(key)
        while ends:
            rec = self._leases.get(ends[0][1])
            if rec is not None and rec.active:
                soonest = ends[0][0]
                break
            heapq.heappop(ends)  # released early: its expiry no longer counts
        return Load(active=self._active.get(key, 0),
                    cooled_until=self._cooldowns.global_until(key), soonest_end=soonest)

    def _set_cooldown(self, cd: Cooldown) -> Cooldown:
        kept = self._cooldowns.set(cd)
        if kept is cd and cd.target == GLOBAL:
            self._index.update(cd.key, self._load(cd.key))
        return kept


def _refusal_reason(considered: int, at_capacity: int, in_cooldown: int) -> str:
    """The `reason` label of LEASES_REFUSED for one refused acquire."""
    if considered == 0:
        return "no_candidates"
    if in_cooldown == 0:
        return "at_capacity"
    if at_capacity == 0:
        return "in_cooldown"
    return "at_capacity_and_cooldown"
