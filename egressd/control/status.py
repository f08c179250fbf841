"""Status derivation (docs/reference.md): the phase from conditions, and condition updates.

Pure functions, no I/O: the reconciler builds the status it wants with these
and writes it once per pass. A condition's `lastTransitionTime` moves only
when its `status` changes (metav1.Condition semantics), so a status rebuilt
on every pass compares equal to the stored one and causes no write.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from egressd.model.constants import (
    COND_HEALTHY,
    COND_PROVISIONED,
    STATUS_FALSE,
    STATUS_TRUE,
    Phase,
)
from egressd.model.proxy import Condition

# Reasons of the Provisioned condition (docs/architecture.md).
REASON_EXTERNAL = "External"
REASON_RUNNING = "Running"
REASON_CREATING = "Creating"
REASON_PROVISIONING = "Provisioning"
REASON_REPLACING = "Replacing"
REASON_INSTANCE_MISSING = "InstanceMissing"
REASON_INSTANCE_STOPPED = "InstanceStopped"
REASON_CLOUD_INIT_UNRESOLVED = "CloudInitUnresolved"
REASON_PERMANENT_FAILURE = "PermanentFailure"
# This daemon's configuration cannot serve the Proxy (no such provider, no
# credentials or permission): a condition, never a latch (docs/decisions.md).
REASON_PROVIDER_NOT_CONFIGURED = "ProviderNotConfigured"
REASON_QUOTA_EXCEEDED = "QuotaExceeded"
# Reasons of the Healthy condition.
REASON_PROBE_SUCCEEDED = "ProbeSucceeded"
REASON_PROBE_FAILED = "ProbeFailed"
REASON_INVALID_HEALTH_CHECK = "InvalidHealthCheck"


def find(conditions: Sequence[Condition], type: str) -> Condition | None:
    """The condition of `type`, or None."""
    for cond in conditions:
        if cond.type == type:
            return cond
    return None


def set_condition(
    conditions: Sequence[Condition], type: str, *, status: str, reason: str, message: str = "",
    generation: int, now: datetime,
) -> tuple[Condition, ...]:
    """`conditions` with `type` set; `lastTransitionTime` is kept unless `status` changed.

    The order of the other conditions is kept; a new type is appended.
    """
    old = find(conditions, type)
    moved = old is None or old.status != status
    new = Condition(
        type, status=status, reason=reason, message=message, observed_generation=generation,
        last_transition_time=now if moved or old is None else old.last_transition_time)
    if old is None:
        return (*conditions, new)
    return tuple(new if c.type == type else c for c in conditions)


def remove_condition(conditions: Sequence[Condition], type: str) -> tuple[Condition, ...]:
    """`conditions` without `type`."""
    return tuple(c for c in conditions if c.type != type)


def is_failed(conditions: Sequence[Condition], *, generation: int) -> bool:
    """Provisioned is False with reason PermanentFailure, recorded for `generation`.

    A spec change moves the generation, which ends the latch (docs/architecture.md).
    """
    cond = find(conditions, COND_PROVISIONED)
    return (cond is not None and cond.status == STATUS_FALSE
            and cond.reason == REASON_PERMANENT_FAILURE
            and cond.observed_generation == generation)


def not_configured(conditions: Sequence[Condition]) -> bool:
    """Provisioned is False because this daemon's configuration cannot serve the Proxy."""
    cond = find(conditions, COND_PROVISIONED)
    return (cond is not None and cond.status == STATUS_FALSE
            and cond.reason == REASON_PROVIDER_NOT_CONFIGURED)


def compute_phase(conditions: Sequence[Condition], *, generation: int,
                  deleting: bool) -> Phase:
    """docs/reference.md, in order: Deleting; Failed (latched, or not configured here);
    Provisioning while Provisioned is not True or there is no health verdict yet
    (never Ready unprobed); Ready or Unhealthy.

    `Pending` is never derived: an object no pass has seen has no phase at all.
    """
    if deleting:
        return Phase.DELETING
    if is_failed(conditions, generation=generation) or not_configured(conditions):
        return Phase.FAILED
    provisioned = find(conditions, COND_PROVISIONED)
    healthy = find(conditions, COND_HEALTHY)
    if (provisioned is None or provisioned.status != STATUS_TRUE or healthy is None
            or healthy.status not in (STATUS_TRUE, STATUS_FALSE)):
        return Phase.PROVISIONING
    return Phase.READY if healthy.status == STATUS_TRUE else Phase.UNHEALTHY

