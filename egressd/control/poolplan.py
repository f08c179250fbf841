"""One pool pass's decisions, pure (issue 13): what to create, adopt, drain and delete.

`plan` takes the pool, its members (each classified once: `Member`) and the time,
and returns a `Plan`; the pool controller (not written yet: docs/architecture.md,
"ProxyPool") is to carry it out and write the status. Rules, in order:

* a new Proxy (current template) that fails before it was ever Ready (phase
  Failed, or Healthy=False) is deleted and counted; `failureThreshold` such in a
  row latch ReplicaFailure: no more creates but one retry after a backoff
  (30 s doubling, at most 10 min); a Proxy that becomes Ready, or a new
  generation (a fixed template), resets the count;
* scale down drains the extras, not-Ready first, then the newest;
* a rollout (template hash changed) surges first: at most `replicas + maxSurge`
  active, and a Ready old Proxy is drained only while at least
  `replicas - maxUnavailable` stay Ready;
* a draining Proxy is deleted once it has no active lease or its
  `drainTimeoutSeconds` ran out;
* a Managed pool whose provider is not configured creates nothing (a condition).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import attrs

from egressd.model.constants import Mode, Phase
from egressd.model.convert import unstructure
from egressd.model.pool import ProxyPool
from egressd.model.proxy import Endpoint, Proxy

RETRY_BASE = 30.0
RETRY_MAX = 600.0
# While a Proxy drains, the pool looks at its leases this often (a release sends no event).
DRAIN_POLL = 5.0


def template_hash(pool: ProxyPool) -> str:
    """A short hash of the template: a change rolls the pool."""
    wire = json.dumps(unstructure(pool.spec.template), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(wire.encode()).hexdigest()[:10]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def suffix(seed: str) -> str:
    """Five characters from `seed`, in the alphabet generateName uses."""
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest[:5])


def endpoint_id(endpoint: Endpoint) -> str:
    return f"{endpoint.host}:{endpoint.port or ''}"


@attrs.frozen
class Member:
    """One Proxy of the pool, classified once per pass."""

    proxy: Proxy
    owned: bool  # its controller reference is this pool
    hash: str | None
    draining_since: datetime | None
    ready_once: bool
    active_leases: int = 0

    @property
    def name(self) -> str:
        return self.proxy.metadata.name

    @property
    def ready(self) -> bool:
        return self.proxy.status.phase is Phase.READY

    @property
    def deleting(self) -> bool:
        return self.proxy.metadata.deletion_timestamp is not None

    @property
    def created(self) -> datetime:
        return self.proxy.metadata.creation_timestamp or _EPOCH

    def failure(self) -> str | None:
        """Why a never-Ready Proxy failed, or None if it has not (yet)."""
        if self.ready_once or self.ready:
            return None
        healthy = self.proxy.status.condition("Healthy")
        if healthy is not None and healthy.status == "False":
            return healthy.message or healthy.reason
        if self.proxy.status.phase is Phase.FAILED:
            provisioned = self.proxy.status.condition("Provisioned")
            return (provisioned.message or provisioned.reason) if provisioned else "failed"
        return None


@attrs.frozen
class Plan:
    creates: tuple[Endpoint | None, ...] = ()  # None: a Managed Proxy
    adopt: tuple[str, ...] = ()
    mark_ready: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    failed_creates: int = 0
    last_error: str | None = None
    blocked_until: datetime | None = None  # ReplicaFailure: the next retry
    desired: int = 0
    current: int = 0
    ready: int = 0
    updated: int = 0
    draining: int = 0
    requeue: float | None = None


def desired_count(pool: ProxyPool) -> int:
    if pool.spec.template.spec.mode is Mode.EXTERNAL:
        return len(pool.spec.endpoints or ())
    return 1 if pool.spec.replicas is None else pool.spec.replicas


def retry_delay(failed: int, threshold: int) -> float:
    return float(min(RETRY_BASE * 2.0 ** max(failed - threshold, 0), RETRY_MAX))


@attrs.define
class _Work:
    """A plan being built."""

    pool: ProxyPool
    now: datetime
    hash: str
    drain: list[str] = attrs.field(factory=list)
    delete: list[str] = attrs.field(factory=list)
    requeue: list[float] = attrs.field(factory=list)

    def after(self, seconds: float) -> None:
        self.requeue.append(max(seconds, 0.05))


def plan(pool: ProxyPool, members: Sequence[Member], *, now: datetime, provider_ok: bool,
         failure_since: datetime | None) -> Plan:
    """The pass's decisions. `failure_since`: when ReplicaFailure became True (or None)."""
    w = _Work(pool, now, template_hash(pool))
    owned = [m for m in members if m.owned]
    adopt = tuple(m.name for m in members if not m.owned and not m.deleting
                  and m.proxy.metadata.controller_ref() is None)
    _drain_ended(w, [m for m in owned if m.draining_since is not None and not m.deleting])
    active = [m for m in owned if m.draining_since is None and not m.deleting]
    failed, last_error = _failures(w, active)
    active = [m for m in active if m.name not in w.delete]
    mark_ready = tuple(m.name for m in active if m.ready and not m.ready_once)
    failed_creates = pool.status.failed_creates or 0
    if pool.status.observed_generation != pool.metadata.generation or mark_ready:
        failed_creates = 0
    failed_creates += failed
    new = [m for m in active if m.hash == w.hash]
    old = [m for m in active if m.hash != w.hash]
    desired = desired_count(pool)
    kept_old = _retire(w, new, old, desired)
    creates = _creates(pool, new, kept_old, desired)
    blocked_until = None
    threshold = pool.spec.failure_threshold
    if failed_creates >= threshold:
        since = failure_since or now
        blocked_until = since + timedelta(seconds=retry_delay(failed_creates, threshold))
        pending = [m for m in new if not m.ready and not m.ready_once]
        if now < blocked_until or pending:
            creates = ()
            w.after((blocked_until - now).total_seconds())
        else:
            creates = creates[:1]
    if not provider_ok:
        creates = ()
    remaining = [m for m in active if m.name not in w.drain]
    return Plan(
        creates=creates, adopt=adopt, mark_ready=mark_ready, drain=tuple(w.drain),
        delete=tuple(w.delete), failed_creates=failed_creates, last_error=last_error,
        blocked_until=blocked_until, desired=desired, current=len(remaining),
        ready=sum(1 for m in remaining if m.ready),
        updated=sum(1 for m in remaining if m.hash == w.hash),
        draining=sum(1 for m in owned if m.name not in w.delete
                     and (m.draining_since is not None or m.name in w.drain)),
        requeue=min(w.requeue) if w.requeue else None)


def _drain_ended(w: _Work, draining: list[Member]) -> None:
    """Delete the draining Proxies with no lease left or whose timeout ran out."""
    timeout = timedelta(seconds=w.pool.spec.drain_timeout_seconds)
    for m in draining:
        assert m.draining_since is not None
        deadline = m.draining_since + timeout
        if m.active_leases == 0 or w.now >= deadline:
            w.delete.append(m.name)
        else:
            w.after(min(DRAIN_POLL, (deadline - w.now).total_seconds()))


def _failures(w: _Work, active: list[Member]) -> tuple[int, str | None]:
    """New Proxies that failed before ever being Ready: deleted, counted."""
    count, last = 0, None
    for m in sorted(active, key=lambda m: m.created):
        if m.hash != w.hash:
            continue
        reason = m.failure()
        if reason is not None:
            w.delete.append(m.name)
            count += 1
            last = f"{m.name}: {reason}"
    return count, last


def _retire(w: _Work, new: list[Member], old: list[Member], desired: int) -> list[Member]:
    """Drain what is above the desired count, and old-template Proxies within the
    availability bound; returns the old ones kept for now."""
    pool = w.pool
    if pool.spec.template.spec.mode is Mode.EXTERNAL:
        wanted = {endpoint_id(e) for e in pool.spec.endpoints or ()}
        for m in new:
            if m.proxy.spec.endpoint is None or endpoint_id(m.proxy.spec.endpoint) not in wanted:
                w.drain.append(m.name)
        new = [m for m in new if m.name not in w.drain]
    extra = len(new) - desired
    if extra > 0:
        # Not-Ready first, then the newest (as a ReplicaSet scales down).
        order = sorted(new, key=lambda m: (m.ready, -m.created.timestamp()))
        w.drain.extend(m.name for m in order[:extra])
    ready = sum(1 for m in new + old if m.ready and m.name not in w.drain)
    floor = desired - pool.spec.max_unavailable
    kept: list[Member] = []
    for m in sorted(old, key=lambda m: (m.ready, m.created)):
        if not m.ready:  # takes no Ready Proxy away
            w.drain.append(m.name)
        elif m.ready and ready - 1 >= floor:
            w.drain.append(m.name)
            ready -= 1
        else:
            kept.append(m)
    return kept


def _creates(pool: ProxyPool, new: list[Member], kept_old: list[Member], desired: int
             ) -> tuple[Endpoint | None, ...]:
    """What to create: up to the desired count of new-template Proxies, surge-bounded
    while old ones remain."""
    if pool.spec.template.spec.mode is Mode.EXTERNAL:
        covered = {endpoint_id(m.proxy.spec.endpoint) for m in new
                   if m.proxy.spec.endpoint is not None}
        missing: list[Endpoint | None] = [e for e in pool.spec.endpoints or ()
                                          if endpoint_id(e) not in covered]
    else:
        missing = [None] * max(desired - len(new), 0)
    if kept_old:
        room = desired + pool.spec.max_surge - len(new) - len(kept_old)
        missing = missing[:max(room, 0)]
    return tuple(missing)
