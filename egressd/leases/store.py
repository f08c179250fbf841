"""The in-memory lease store: selection, leases with a TTL, cooldowns (docs/reference.md).

It knows nothing of Kubernetes or of `Proxy` (import-linter forbids both): the
caller hands it plain `Candidate` values it has already filtered for health.

Time is wall-clock seconds from an injected `clock` (tests derive it from trio's
mock clock). Expiry is decided on every read against that clock, so a lease's
TTL frees its slot even if the sweeper never runs; the sweeper (`run`) only
forgets what nobody can ask about any more.

Cost per call: acquire is one pass over the candidates (no sort); active leases
are per-proxy counters kept up to date by a heap of expiry times, so no call
scans all leases.
"""

from __future__ import annotations

import heapq
import logging
import math
import secrets
import time
from collections.abc import Callable, Iterable, Mapping

import attrs
import trio

from egressd import metrics
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
    outlasts,
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
        self._cooldowns: dict[str, dict[str, Cooldown]] = {}
        self._cooldown_count = 0

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
            clock=clock,
            on_proxy_error=on_proxy_error,
            on_cooldown=on_cooldown,
        )

    def now(self) -> float:
        """The store's wall clock, in seconds since the epoch."""
        return self._clock()

    # --- LeaseStore (no method awaits before its state change is done) --------------

    async def acquire(
        self, candidates: Iterable[Candidate], *, target: str, ttl: float
    ) -> Grant | Refusal:
        """Select the best candidate and insert its lease in one step.

        Order: fewest active leases, then lowest latency (unknown last), then key.
        """
        if not ttl > 0:
            raise ValueError(f"ttl must be positive, got {ttl!r}")
        now = self._clock()
        self._expire(now)
        considered = at_capacity = in_cooldown = 0
        best: Candidate | None = None
        best_rank: tuple[int, bool, float, str] | None = None
        cooling = bool(self._cooldowns)  # most acquires meet no cooldown at all
        for cand in candidates:
            considered += 1
            if cooling and self._cooling(cand.key, target, now):
                in_cooldown += 1
                continue
            active = self._active.get(cand.key, 0)
            if active >= cand.max_leases:
                at_capacity += 1
                continue
            latency = cand.latency_ms
            rank = (active, latency is None, 0.0 if latency is None else latency, cand.key)
            if best_rank is None or rank < best_rank:
                best, best_rank = cand, rank
        if best is None:
            reason = _refusal_reason(considered, at_capacity, in_cooldown)
            metrics.LEASES_REFUSED.labels(reason).inc()
            return Refusal(considered=considered, at_capacity=at_capacity, in_cooldown=in_cooldown)
        lease = Lease(
            id=secrets.token_urlsafe(24), key=best.key, target=target, expires_at=now + ttl
        )
        self._leases[lease.id] = _Record(lease=lease)
        heapq.heappush(self._expiry, (lease.expires_at, lease.id))
        active = self._active.get(best.key, 0) + 1
        self._active[best.key] = active
        metrics.LEASES_GRANTED.inc()
        metrics.LEASES_ACTIVE.inc()
        return Grant(lease=lease, active_leases=active)

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
            cds = self._cooldowns.get(key)
            live = {t: c for t, c in cds.items() if c.until > now} if cds else {}
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
        now = self._clock()
        return {t: c for t, c in self._cooldowns.get(key, {}).items() if c.until > now}

    # --- garbage collection ---------------------------------------------------------------

    def collect(self) -> None:
        """Forget leases past their retention window and cooldowns past their end."""
        now = self._clock()
        self._expire(now)
        while self._forget and self._forget[0][0] <= now:
            _, lease_id = heapq.heappop(self._forget)
            rec = self._leases.get(lease_id)
            if rec is not None and not rec.active and rec.forget_at <= now:
                del self._leases[lease_id]
        for key, cds in list(self._cooldowns.items()):
            for target in [t for t, c in cds.items() if c.until <= now]:
                del cds[target]
                self._cooldown_count -= 1
                metrics.COOLDOWNS_ACTIVE.dec()
            if not cds:
                del self._cooldowns[key]

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
        metrics.LEASES_ACTIVE.dec()

    def _cooling(self, key: str, target: str, now: float) -> bool:
        # docs/reference.md: a global cooldown blocks every acquire; a target's only acquires for
        # that target; an acquire without a target sees only global cooldowns.
        cds = self._cooldowns.get(key)
        if not cds:
            return False
        glob = cds.get(GLOBAL)
        if glob is not None and glob.until > now:
            return True
        if target:
            own = cds.get(target)
            if own is not None and own.until > now:
                return True
        return False

    def _set_cooldown(self, cd: Cooldown) -> Cooldown:
        cds = self._cooldowns.setdefault(cd.key, {})
        old = cds.get(cd.target)
        if not outlasts(cd, old):
            assert old is not None
            return old
        if old is None:
            self._cooldown_count += 1
            metrics.COOLDOWNS_ACTIVE.inc()
        cds[cd.target] = cd
        return cd


def _refusal_reason(considered: int, at_capacity: int, in_cooldown: int) -> str:
    """The `reason` label of LEASES_REFUSED for one refused acquire."""
    if considered == 0:
        return "no_candidates"
    if in_cooldown == 0:
        return "at_capacity"
    if at_capacity == 0:
        return "in_cooldown"
    return "at_capacity_and_cooldown"
