"""The cooldowns in force, by proxy and by target, each ending on time.

`CooldownBook` is the lease store's record of cooldowns: what blocks a proxy
for one target or for all of them. It owns the "never shorten" rule (through
`outlasts`), the cooldowns-active gauge and the end of each cooldown: a heap
of end times is popped on every store call, so an ended cooldown is forgotten
without any scan, and the store learns which proxies' global cooldowns ended
(their candidates move back into the free order).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from egressd import metrics
from egressd.leases.interface import GLOBAL, Cooldown, outlasts

_NONE: Mapping[str, float] = {}

DEFAULT_CAP = 64
"""Per-target cooldowns one proxy keeps at most, by default (--max-cooldowns-per-proxy)."""


def evictions(cooldowns: Iterable[Cooldown], *, room: int) -> list[Cooldown]:
    """The per-target cooldowns to drop so that at most `room` stay: soonest-ending first.

    The one bound on a proxy's cooldowns, used by the store and by the status writer
    alike. The global cooldown is never dropped (it blocks every target, and there
    is at most one per proxy).
    """
    targets = sorted((c for c in cooldowns if c.target != GLOBAL),
                     key=lambda c: (c.until, c.target))
    return targets[:max(0, len(targets) - max(room, 0))]


class CooldownBook:
    """Cooldowns by (proxy key, target); target `""` (GLOBAL) blocks every acquire."""

    def __init__(self, *, cap: int = DEFAULT_CAP) -> None:
        self._cap = cap
        self._by_key: dict[str, dict[str, Cooldown]] = {}
        # target → proxy key → until, for targets other than GLOBAL: what an acquire
        # for that target must skip, without looking at any other proxy.
        self._by_target: dict[str, dict[str, float]] = {}
        # (until, key, target) of every cooldown set; entries of lengthened ones are stale.
        self._ends: list[tuple[float, str, str]] = []

    def set(self, cd: Cooldown) -> Cooldown:
        """Record `cd` unless a cooldown at least as long is in force; return the one in force."""
        cds = self._by_key.setdefault(cd.key, {})
        old = cds.get(cd.target)
        if not outlasts(cd, old):
            assert old is not None
            return old
        if old is None:
            metrics.COOLDOWNS_ACTIVE.inc()
            if cd.target != GLOBAL and len(cds) - (GLOBAL in cds) >= self._cap:
                # Bounded by design: a flood of distinct targets must not grow one proxy
                # (and its status object) without end. O(cap), only when one is added.
                for gone in evictions(cds.values(), room=self._cap - 1):
                    self._drop(gone.key, gone.target)
                    metrics.COOLDOWNS_EVICTED.inc()
        cds[cd.target] = cd
        if cd.target != GLOBAL:
            self._by_target.setdefault(cd.target, {})[cd.key] = cd.until
        heapq.heappush(self._ends, (cd.until, cd.key, cd.target))
        return cd

    def expire(self, now: float) -> Iterable[str]:
        """Forget every cooldown ended by `now`; return the keys whose global one ended."""
        ended: list[str] = []
        ends = self._ends
        while ends and ends[0][0] <= now:
            until, key, target = heapq.heappop(ends)
            cds = self._by_key.get(key)
            cd = cds.get(target) if cds else None
            if cds is None or cd is None or cd.until != until:
                continue  # lengthened since (a later entry ends it), evicted or already gone
            self._drop(key, target)
            if target == GLOBAL:
                ended.append(key)
        return ended

    def _drop(self, key: str, target: str) -> None:
        cds = self._by_key[key]
        del cds[target]
        if not cds:
            del self._by_key[key]
        metrics.COOLDOWNS_ACTIVE.dec()
        if target != GLOBAL:
            keys = self._by_target[target]
            del keys[key]
            if not keys:
                del self._by_target[target]

    def of(self, key: str, now: float) -> dict[str, Cooldown]:
        """The cooldowns of one proxy in force at `now`, by target."""
        cds = self._by_key.get(key)
        return {t: c for t, c in cds.items() if c.until > now} if cds else {}

    def global_until(self, key: str) -> float | None:
        """When the proxy's global cooldown ends, or None (call `expire` first)."""
        cds = self._by_key.get(key)
        cd = cds.get(GLOBAL) if cds else None
        return None if cd is None else cd.until

    def cooling(self, target: str) -> Mapping[str, float]:
        """Proxy key → until of the cooldowns for `target` alone (call `expire` first)."""
        if target == GLOBAL:
            return _NONE
        return self._by_target.get(target, _NONE)
