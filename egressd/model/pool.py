"""The ProxyPool resource (issue 13) as frozen attrs values.

A pool is a Proxy template and a count: the pool controller keeps that many
Proxies (owned through ownerReferences) made from the template. Like the Proxy
model, Python names are snake_case and the converter (`egressd.model.convert`)
owns the camelCase wire names; `None` means "absent on the wire". The CRD's CEL
rules enforce the cross-field rules (External pools have endpoints and no
replicas, autoscale goes with maxReplicas...), so the model only carries values.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import attrs

from egressd.model.constants import (
    DEFAULT_DRAIN_TIMEOUT_SECONDS,
    DEFAULT_MAX_REPLACEMENTS_PER_MINUTE,
    DEFAULT_MAX_SURGE,
    DEFAULT_MAX_UNAVAILABLE,
    DEFAULT_POOL_FAILURE_THRESHOLD,
    DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS,
    DEFAULT_SCALE_UP_WINDOW_SECONDS,
    DEFAULT_TARGET_UTILIZATION,
)
from egressd.model.frozen import FrozenDict, freeze_str_map
from egressd.model.proxy import Condition, Endpoint, ObjectMeta, ProxySpec, find_condition


@attrs.frozen
class TemplateMeta:
    """Labels and annotations copied onto every Proxy of the pool."""

    labels: Mapping[str, str] = attrs.field(factory=FrozenDict, converter=freeze_str_map)
    annotations: Mapping[str, str] = attrs.field(
        factory=FrozenDict, converter=freeze_str_map, kw_only=True)


@attrs.frozen
class ProxyTemplate:
    """What each Proxy of the pool looks like (its spec has no endpoint)."""

    spec: ProxySpec
    metadata: TemplateMeta = attrs.field(factory=TemplateMeta, kw_only=True)


@attrs.frozen
class Autoscale:
    """Scaling on lease pressure between minReplicas and maxReplicas."""

    target_utilization: int = DEFAULT_TARGET_UTILIZATION
    scale_up_window_seconds: int = attrs.field(
        default=DEFAULT_SCALE_UP_WINDOW_SECONDS, kw_only=True)
    scale_down_stabilization_seconds: int = attrs.field(
        default=DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS, kw_only=True)


@attrs.frozen
class Recycle:
    """When a Proxy is replaced for a fresh IP: by age, by bans; and how fast at most."""

    max_age_seconds: int | None = None
    max_bans: int | None = attrs.field(default=None, kw_only=True)
    ban_window_seconds: int | None = attrs.field(default=None, kw_only=True)
    max_replacements_per_minute: int = attrs.field(
        default=DEFAULT_MAX_REPLACEMENTS_PER_MINUTE, kw_only=True)


@attrs.frozen
class ProxyPoolSpec:
    """The desired fleet."""

    template: ProxyTemplate
    endpoints: tuple[Endpoint, ...] | None = attrs.field(default=None, kw_only=True)
    replicas: int | None = attrs.field(default=None, kw_only=True)
    min_replicas: int | None = attrs.field(default=None, kw_only=True)
    max_replicas: int | None = attrs.field(default=None, kw_only=True)
    autoscale: Autoscale | None = attrs.field(default=None, kw_only=True)
    recycle: Recycle | None = attrs.field(default=None, kw_only=True)
    max_unavailable: int = attrs.field(default=DEFAULT_MAX_UNAVAILABLE, kw_only=True)
    max_surge: int = attrs.field(default=DEFAULT_MAX_SURGE, kw_only=True)
    drain_timeout_seconds: int = attrs.field(default=DEFAULT_DRAIN_TIMEOUT_SECONDS,
                                             kw_only=True)
    failure_threshold: int = attrs.field(default=DEFAULT_POOL_FAILURE_THRESHOLD, kw_only=True)


@attrs.frozen
class ProxyPoolStatus:
    """What the pool controller observed (one write per pass)."""

    replicas: int | None = None
    desired_replicas: int | None = attrs.field(default=None, kw_only=True)
    ready_replicas: int | None = attrs.field(default=None, kw_only=True)
    updated_replicas: int | None = attrs.field(default=None, kw_only=True)
    draining_replicas: int | None = attrs.field(default=None, kw_only=True)
    active_leases: int | None = attrs.field(default=None, kw_only=True)
    label_selector: str | None = attrs.field(default=None, kw_only=True)
    template_hash: str | None = attrs.field(default=None, kw_only=True)
    failed_creates: int | None = attrs.field(default=None, kw_only=True)
    observed_generation: int | None = attrs.field(default=None, kw_only=True)
    last_scale_time: datetime | None = attrs.field(default=None, kw_only=True)
    conditions: tuple[Condition, ...] = attrs.field(default=(), converter=tuple, kw_only=True)

    def condition(self, type: str) -> Condition | None:
        """The condition of this type, or None if there is none."""
        return find_condition(self.conditions, type)


@attrs.frozen
class ProxyPool:
    """A whole ProxyPool object."""

    metadata: ObjectMeta
    spec: ProxyPoolSpec = attrs.field(kw_only=True)
    status: ProxyPoolStatus = attrs.field(factory=ProxyPoolStatus, kw_only=True)

    @property
    def key(self) -> str:
        """The work-queue and cache key, "namespace/name"."""
        return f"{self.metadata.namespace}/{self.metadata.name}"
