"""The Proxy resource (docs/reference.md) as frozen attrs values.

Python names are snake_case; the camelCase wire names are the converter's
business (`egressd.model.convert`), so nothing outside the model sees a raw
dict. Every map field is a `FrozenDict` and every list a tuple, so the values
are immutable and hashable all the way down. `None` means "absent on the wire".
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated

import attrs

from egressd.codec import one_of
from egressd.model.constants import (
    CONDITION_STATUSES,
    DEFAULT_FAILURE_THRESHOLD,
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_PORT,
    DEFAULT_PROBE_URL,
    DEFAULT_SECRET_KEY,
    DEFAULT_SUCCESS_THRESHOLD,
    DEFAULT_TIMEOUT_SECONDS,
    Mode,
    Phase,
)
from egressd.model.frozen import FrozenDict, freeze_map, freeze_str_map


@attrs.frozen
class Placement:
    """Provider-specific placement hints of a Managed proxy (all optional)."""

    zone: str | None = None
    region: str | None = attrs.field(default=None, kw_only=True)
    machine_type: str | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class SecretKeyRef:
    """A key of a Secret in the Proxy's namespace that holds the cloud-init text."""

    name: str
    key: str = attrs.field(default=DEFAULT_SECRET_KEY, kw_only=True)


@attrs.frozen
class CloudInit:
    """Cloud-init for a Managed proxy: inline text or a Secret reference (exactly one)."""

    inline: str | None = None
    secret_ref: SecretKeyRef | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Endpoint:
    """Where an External proxy already listens; `port` unset means `spec.port`."""

    host: str
    port: int | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class HealthCheck:
    """How the health engine probes a proxy (docs/reference.md, docs/architecture.md)."""

    probe_url: str = DEFAULT_PROBE_URL
    interval_seconds: int = attrs.field(default=DEFAULT_INTERVAL_SECONDS, kw_only=True)
    timeout_seconds: int = attrs.field(default=DEFAULT_TIMEOUT_SECONDS, kw_only=True)
    success_threshold: int = attrs.field(default=DEFAULT_SUCCESS_THRESHOLD, kw_only=True)
    failure_threshold: int = attrs.field(default=DEFAULT_FAILURE_THRESHOLD, kw_only=True)


@attrs.frozen
class ProxySpec:
    """The desired state of a proxy. The CRD's CEL rules enforce the cross-field rules."""

    mode: Mode
    provider: str | None = attrs.field(default=None, kw_only=True)
    placement: Placement | None = attrs.field(default=None, kw_only=True)
    cloud_init: CloudInit | None = attrs.field(default=None, kw_only=True)
    endpoint: Endpoint | None = attrs.field(default=None, kw_only=True)
    port: int = attrs.field(default=DEFAULT_PORT, kw_only=True)
    # None = unset on the wire, which means DEFAULT_MAX_LEASES (see helpers.max_leases).
    max_leases: int | None = attrs.field(default=None, kw_only=True)
    attributes: Mapping[str, str] = attrs.field(
        factory=FrozenDict, converter=freeze_str_map, kw_only=True
    )
    health_check: HealthCheck = attrs.field(factory=HealthCheck, kw_only=True)


@attrs.frozen
class Condition:
    """One entry of `status.conditions`, shaped like metav1.Condition."""

    type: str
    status: Annotated[str, one_of(CONDITION_STATUSES)] = attrs.field(
        validator=attrs.validators.in_(CONDITION_STATUSES), kw_only=True)
    last_transition_time: datetime = attrs.field(kw_only=True)
    reason: str = attrs.field(default="", kw_only=True)
    message: str = attrs.field(default="", kw_only=True)
    observed_generation: int | None = attrs.field(default=None, kw_only=True)


def find_condition(conditions: tuple[Condition, ...], type: str) -> Condition | None:
    """The condition of this type among `conditions`, or None if there is none."""
    return next((cond for cond in conditions if cond.type == type), None)


@attrs.frozen
class Cooldown:
    """A proxy may not be leased for one target (or, under key "*", any) until `until`."""

    until: datetime
    reason: str = attrs.field(kw_only=True)


@attrs.frozen
class ProxyStatus:
    """The observed state the reconciler and health engine write (docs/reference.md)."""

    phase: Phase | None = None
    provider_id: str | None = attrs.field(default=None, kw_only=True)
    ip: str | None = attrs.field(default=None, kw_only=True)
    host: str | None = attrs.field(default=None, kw_only=True)
    port: int | None = attrs.field(default=None, kw_only=True)
    observed_generation: int | None = attrs.field(default=None, kw_only=True)
    latency_ms: int | None = attrs.field(default=None, kw_only=True)
    last_health_check_time: datetime | None = attrs.field(default=None, kw_only=True)
    # Keyed by target site; GLOBAL_COOLDOWN_KEY ("*") blocks every target (docs/reference.md).
    cooldowns: Mapping[str, Cooldown] = attrs.field(
        factory=FrozenDict, converter=freeze_map, kw_only=True
    )
    conditions: tuple[Condition, ...] = attrs.field(default=(), converter=tuple, kw_only=True)

    def condition(self, type: str) -> Condition | None:
        """The condition of this type, or None if there is none."""
        return find_condition(self.conditions, type)


@attrs.frozen
class OwnerReference:
    """One entry of `metadata.ownerReferences` (a pool owns its Proxies this way)."""

    api_version: str
    kind: str = attrs.field(kw_only=True)
    name: str = attrs.field(kw_only=True)
    uid: str = attrs.field(kw_only=True)
    controller: bool | None = attrs.field(default=None, kw_only=True)
    block_owner_deletion: bool | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class ObjectMeta:
    """The parts of Kubernetes object metadata egressd reads."""

    name: str
    namespace: str = attrs.field(default="default", kw_only=True)
    uid: str = attrs.field(default="", kw_only=True)
    resource_version: str = attrs.field(default="", kw_only=True)
    generation: int = attrs.field(default=0, kw_only=True)
    creation_timestamp: datetime | None = attrs.field(default=None, kw_only=True)
    deletion_timestamp: datetime | None = attrs.field(default=None, kw_only=True)
    labels: Mapping[str, str] = attrs.field(
        factory=FrozenDict, converter=freeze_str_map, kw_only=True
    )
    annotations: Mapping[str, str] = attrs.field(
        factory=FrozenDict, converter=freeze_str_map, kw_only=True
    )
    finalizers: tuple[str, ...] = attrs.field(default=(), converter=tuple, kw_only=True)
    # None when absent, so a round trip writes no empty list the object never had.
    owner_references: tuple[OwnerReference, ...] | None = attrs.field(default=None,
                                                                     kw_only=True)

    def controller_ref(self) -> OwnerReference | None:
        """The owner reference with `controller: true`, if any (at most one is allowed)."""
        for ref in self.owner_references or ():
            if ref.controller:
                return ref
        return None


@attrs.frozen
class Proxy:
    """A whole Proxy object: metadata, spec and status."""

    metadata: ObjectMeta
    spec: ProxySpec = attrs.field(kw_only=True)
    status: ProxyStatus = attrs.field(factory=ProxyStatus, kw_only=True)

    @property
    def key(self) -> str:
        """The work-queue and cache key, "namespace/name"."""
        return f"{self.metadata.namespace}/{self.metadata.name}"
