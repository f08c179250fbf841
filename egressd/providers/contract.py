"""The provider contract (docs/providers.md): the `Provider` protocol and the values it trades in.

A provider creates, reads, deletes and lists instances; it knows nothing of
`Proxy`. Every value here is frozen; errors live in `errors.py`, naming and
GC labels in `naming.py`.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping
from datetime import datetime
from typing import Protocol, runtime_checkable

import attrs


class InstanceState(enum.StrEnum):
    """Where an instance is in its life, as far as a caller needs to know."""

    PROVISIONING = "Provisioning"
    """Being created, or up but without an address yet: poll again."""
    RUNNING = "Running"
    """Up, with an address: publish it."""
    STOPPED = "Stopped"
    """Stopped or stopping: it will not serve until restarted (replace it)."""
    TERMINATED = "Terminated"
    """Gone or going for good: replace it."""


def _frozen_labels(labels: Mapping[str, str]) -> Mapping[str, str]:
    return types.MappingProxyType(dict(labels))


@attrs.frozen
class Placement:
    """Provider-specific hints for where an instance runs; every field is optional."""

    zone: str | None = None
    region: str | None = None
    machine_type: str | None = None


@attrs.frozen(kw_only=True)
class CreateRequest:
    """What `Provider.create` makes: an instance named `name` listening on `port`.

    `cloud_init` is never part of the repr: it may hold credentials (docs/reference.md).
    """

    name: str
    placement: Placement = attrs.field(factory=Placement)
    cloud_init: str = attrs.field(default="", repr=False)
    port: int = 3128
    labels: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_labels)


def _ip_when_running(instance: Instance, attribute: attrs.Attribute[str | None],
                     value: str | None) -> None:
    if instance.state is InstanceState.RUNNING and not value:
        raise ValueError(f"instance {instance.provider_id!r} is Running without an ip")


@attrs.frozen(kw_only=True)
class Instance:
    """One instance as a provider sees it.

    Invariant (docs/providers.md): a Running instance has an ip; one without an address
    yet is Provisioning.
    """

    provider_id: str
    name: str
    state: InstanceState
    ip: str | None = attrs.field(default=None, validator=_ip_when_running)
    created_at: datetime
    labels: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_labels)


@runtime_checkable
class Provider(Protocol):
    """What every provider implements. All methods raise only `ProviderError` kinds."""

    async def create(self, request: CreateRequest, /) -> Instance:
        """Create the instance, or adopt the existing one of that name (idempotent)."""
        ...

    async def get(self, provider_id: str, /) -> Instance:
        """The instance's current state; raises `NotFound` if it does not exist."""
        ...

    async def delete(self, provider_id: str, /) -> None:
        """Delete the instance; an instance that is already gone is success."""
        ...

    async def list_by_labels(self, labels: Mapping[str, str], /) -> list[Instance]:
        """Every instance carrying all of `labels` (for orphan GC)."""
        ...
