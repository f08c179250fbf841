"""The reconciler's side of health (step 7 of a pass, docs/architecture.md), level-based.

Each pass ends by computing the probe target its Proxy should have (`desired_target`,
from the status the pass built) and `sync_health` makes the engine agree, in one
place, beside the one status write: upsert the target (seeded from the status
after a restart) or remove the key, then publish the engine's verdict in the
draft. What is probed is what the status advertises: the host and port of an
External proxy, or of a Managed proxy's recorded instance; nothing while the
Proxy is being deleted or has no address.
"""

from __future__ import annotations

import attrs

from egressd.control.draft import Draft
from egressd.control.status import REASON_INVALID_HEALTH_CHECK
from egressd.health.engine import HealthEngine, Verdict
from egressd.health.probe import ProbeTarget
from egressd.model.constants import COND_HEALTHY, STATUS_FALSE, STATUS_TRUE, Mode
from egressd.model.proxy import ProxyStatus


class InvalidHealthCheck(ValueError):
    """`spec.healthCheck` makes no valid probe target (an older, looser CRD let it in)."""


def desired_target(d: Draft) -> ProbeTarget | None:
    """The target the engine should probe for this pass's Proxy, or None.

    Raises `InvalidHealthCheck` when the Proxy has an address but its health
    check cannot be probed.
    """
    status, proxy = d.status, d.proxy
    if d.deleting or not status.host or status.port is None:
        return None
    if proxy.spec.mode is Mode.MANAGED and not status.provider_id:
        return None  # an address left from another instance (or mode) is not this one's
    check = proxy.spec.health_check
    try:
        return ProbeTarget(
            key=d.key, host=status.host, port=status.port, url=check.probe_url,
            interval=float(check.interval_seconds), timeout=float(check.timeout_seconds),
            success_threshold=check.success_threshold,
            failure_threshold=check.failure_threshold)
    except ValueError as exc:
        raise InvalidHealthCheck(str(exc)) from exc


def seed(status: ProxyStatus) -> Verdict | None:
    """The verdict a status already shows, to seed the health engine after a restart."""
    cond = status.condition(COND_HEALTHY)
    if cond is None or cond.status not in (STATUS_TRUE, STATUS_FALSE):
        return None
    if cond.reason == REASON_INVALID_HEALTH_CHECK:
        return None
    return Verdict(healthy=cond.status == STATUS_TRUE,
                   latency_ms=status.latency_ms if cond.status == STATUS_TRUE else None,
                   checked_at=status.last_health_check_time or cond.last_transition_time,
                   reason=cond.message)


def sync_health(engine: HealthEngine, key: str, d: Draft | None) -> None:
    """Make the engine probe exactly `desired_target(d)` (nothing when the Proxy is
    gone: `d` None), and put its verdict in the draft."""
    if d is None:
        engine.remove(key)
        return
    try:
        target = desired_target(d)
    except InvalidHealthCheck as exc:
        engine.remove(key)
        d.status = attrs.evolve(d.status, latency_ms=None)
        d.condition(COND_HEALTHY, STATUS_FALSE, REASON_INVALID_HEALTH_CHECK,
                    f"spec.healthCheck: {exc}")
        return
    if target is None:
        engine.remove(key)
        return
    engine.upsert(target, seed=seed(d.status))
    verdict = engine.snapshot(key)
    if verdict is not None:
        d.verdict(verdict)
