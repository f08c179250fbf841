"""The state of one reconcile pass: the Proxy it read, parsed once, and the status it builds.

`Draft.status` starts as the status the pass read and is changed only by the
pass's steps, never replaced by what a metadata patch returns (the Go
prototype's bug, seeds Step 4): a write's answer refreshes only the metadata
(`seen`), so a finalizer or annotation patch cannot clobber a staged status
change. `observed` is what the draft is compared with before the one status
write. `Stop` ends a pass early with an outcome; the draft is still written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import attrs

from egressd.control.status import (
    REASON_PROBE_FAILED,
    REASON_PROBE_SUCCEEDED,
    remove_condition,
    set_condition,
)
from egressd.control.worker import Outcome
from egressd.health.engine import Verdict
from egressd.model.constants import COND_HEALTHY, COND_PROVISIONED, STATUS_FALSE, STATUS_TRUE
from egressd.model.convert import structure
from egressd.model.proxy import Condition, ObjectMeta, Proxy, ProxyStatus

Obj = dict[str, Any]


class Stop(Exception):
    """Ends a pass early with an outcome; the status draft is still written."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.result)
        self.outcome = outcome


def with_conditions(status: ProxyStatus, conditions: tuple[Condition, ...]) -> ProxyStatus:
    # attrs' evolve() signature takes the converter's input type, which mypy
    # cannot spell for `converter=tuple`.
    changes: dict[str, Any] = {"conditions": conditions}
    return attrs.evolve(status, **changes)


@attrs.define
class Draft:
    """One pass over one Proxy: the latest object seen and the status being built."""

    key: str
    raw: Obj
    proxy: Proxy
    status: ProxyStatus
    observed: ProxyStatus
    now: datetime
    # Versions of the object this pass's writes replaced (see OwnWrites).
    superseded: set[str] = attrs.field(factory=set)

    @classmethod
    def start(cls, key: str, raw: Obj, proxy: Proxy, *, now: datetime,
              superseded: frozenset[str]) -> Draft:
        return cls(key=key, raw=raw, proxy=proxy, status=proxy.status,
                   observed=proxy.status, now=now, superseded=set(superseded))

    @property
    def generation(self) -> int:
        return self.proxy.metadata.generation

    @property
    def deleting(self) -> bool:
        return self.proxy.metadata.deletion_timestamp is not None

    def seen(self, answer: Obj) -> None:
        """A write answered with a newer object: keep its metadata, never its status."""
        self.superseded.add(self.proxy.metadata.resource_version)
        self.raw = answer
        meta = structure(answer.get("metadata") or {}, ObjectMeta, path="metadata")
        self.proxy = attrs.evolve(self.proxy, metadata=meta)

    def written(self, answer: Obj) -> None:
        """The status write answered: the server now shows the draft."""
        self.seen(answer)
        self.observed = self.status

    # --- building the status ----------------------------------------------

    def condition(self, type: str, status: str, reason: str, message: str = "") -> None:
        self.status = with_conditions(self.status, set_condition(
            self.status.conditions, type, status=status, reason=reason, message=message,
            generation=self.generation, now=self.now))

    def provisioned(self, ok: bool, reason: str, message: str = "") -> None:
        self.condition(COND_PROVISIONED, STATUS_TRUE if ok else STATUS_FALSE, reason, message)

    def verdict(self, verdict: Verdict) -> None:
        """Publish the health engine's verdict: Healthy, latency, last check time."""
        self.condition(COND_HEALTHY, STATUS_TRUE if verdict.healthy else STATUS_FALSE,
                       REASON_PROBE_SUCCEEDED if verdict.healthy else REASON_PROBE_FAILED,
                       verdict.reason)
        self.status = attrs.evolve(self.status, latency_ms=verdict.latency_ms,
                                   last_health_check_time=verdict.checked_at)

    def address(self, *, ip: str | None, host: str | None, port: int | None) -> None:
        self.status = attrs.evolve(self.status, ip=ip, host=host, port=port)

    def clear_health(self) -> None:
        """Forget the verdict: a new or missing instance must not wear the old one's."""
        self.status = attrs.evolve(
            with_conditions(self.status, remove_condition(self.status.conditions, COND_HEALTHY)),
            latency_ms=None, last_health_check_time=None)

    def clear_address(self) -> None:
        self.address(ip=None, host=None, port=None)

    def clear_instance(self) -> None:
        self.status = attrs.evolve(self.status, provider_id=None)
        self.clear_address()
        self.clear_health()

    def record_instance(self, provider_id: str) -> None:
        self.clear_instance()
        self.status = attrs.evolve(self.status, provider_id=provider_id)
