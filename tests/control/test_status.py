"""Phase derivation (SPEC §3) as a truth table, and condition transition times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from egressd.control.status import (
    REASON_CREATING,
    REASON_PERMANENT_FAILURE,
    REASON_PROBE_SUCCEEDED,
    REASON_RUNNING,
    compute_phase,
    find,
    is_failed,
    remove_condition,
    set_condition,
)
from egressd.model.constants import COND_HEALTHY, COND_PROVISIONED, Phase
from egressd.model.proxy import Condition

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def cond(type: str, status: str, reason: str = "R", generation: int = 2) -> Condition:
    return Condition(type, status=status, reason=reason, last_transition_time=T0,
                     observed_generation=generation)


P_TRUE = cond(COND_PROVISIONED, "True", REASON_RUNNING)
P_FALSE = cond(COND_PROVISIONED, "False", REASON_CREATING)
P_PERM = cond(COND_PROVISIONED, "False", REASON_PERMANENT_FAILURE)
P_PERM_OLD = cond(COND_PROVISIONED, "False", REASON_PERMANENT_FAILURE, generation=1)
P_UNKNOWN = cond(COND_PROVISIONED, "Unknown")
H_TRUE = cond(COND_HEALTHY, "True")
H_FALSE = cond(COND_HEALTHY, "False")
H_UNKNOWN = cond(COND_HEALTHY, "Unknown")


@pytest.mark.parametrize(("deleting", "conditions", "phase"), [
    (True, (P_TRUE, H_TRUE), Phase.DELETING),
    (True, (P_PERM,), Phase.DELETING),
    (True, (), Phase.DELETING),
    (False, (P_PERM,), Phase.FAILED),
    (False, (P_PERM, H_TRUE), Phase.FAILED),
    (False, (P_PERM_OLD,), Phase.PROVISIONING),  # the generation moved: latch ends
    (False, (P_PERM_OLD, H_TRUE), Phase.PROVISIONING),
    (False, (), Phase.PROVISIONING),
    (False, (P_FALSE,), Phase.PROVISIONING),
    (False, (P_FALSE, H_TRUE), Phase.PROVISIONING),
    (False, (P_UNKNOWN, H_TRUE), Phase.PROVISIONING),
    (False, (P_TRUE,), Phase.PROVISIONING),  # an unprobed proxy is never Ready
    (False, (P_TRUE, H_UNKNOWN), Phase.PROVISIONING),
    (False, (P_TRUE, H_TRUE), Phase.READY),
    (False, (H_TRUE, P_TRUE), Phase.READY),
    (False, (P_TRUE, H_FALSE), Phase.UNHEALTHY),
])
def test_phase_truth_table(deleting: bool, conditions: tuple[Condition, ...],
                           phase: Phase) -> None:
    assert compute_phase(conditions, generation=2, deleting=deleting) is phase


def test_is_failed_needs_the_current_generation() -> None:
    assert is_failed((P_PERM,), generation=2)
    assert not is_failed((P_PERM,), generation=3)
    assert not is_failed((P_FALSE,), generation=2)
    assert not is_failed((), generation=2)


def test_transition_time_moves_only_when_status_changes() -> None:
    t1, t2, t3 = T0 + timedelta(seconds=1), T0 + timedelta(seconds=2), T0 + timedelta(seconds=3)
    conds = set_condition((), COND_PROVISIONED, status="False", reason=REASON_CREATING,
                          generation=1, now=t1)
    assert conds == (Condition(COND_PROVISIONED, status="False", reason=REASON_CREATING,
                               last_transition_time=t1, observed_generation=1),)
    # Same status, new reason, message and generation: the time stays.
    conds2 = set_condition(conds, COND_PROVISIONED, status="False", reason="Provisioning",
                           message="pending", generation=2, now=t2)
    only = find(conds2, COND_PROVISIONED)
    assert only is not None
    assert (only.reason, only.message, only.observed_generation) == ("Provisioning", "pending", 2)
    assert only.last_transition_time == t1
    conds3 = set_condition(conds2, COND_PROVISIONED, status="True", reason=REASON_RUNNING,
                           generation=2, now=t3)
    moved = find(conds3, COND_PROVISIONED)
    assert moved is not None and moved.last_transition_time == t3
    # Setting the identical condition again is a fixed point (no status write).
    assert set_condition(conds3, COND_PROVISIONED, status="True", reason=REASON_RUNNING,
                         generation=2, now=t3 + timedelta(hours=1)) == conds3


def test_order_kept_and_new_types_appended() -> None:
    conds = set_condition((P_TRUE,), COND_HEALTHY, status="True",
                          reason=REASON_PROBE_SUCCEEDED, generation=2, now=T0)
    assert [c.type for c in conds] == [COND_PROVISIONED, COND_HEALTHY]
    conds = set_condition(conds, COND_PROVISIONED, status="False", reason=REASON_CREATING,
                          generation=2, now=T0)
    assert [c.type for c in conds] == [COND_PROVISIONED, COND_HEALTHY]
    assert remove_condition(conds, COND_HEALTHY) == (conds[0],)
    assert remove_condition(conds, "Nope") == conds
