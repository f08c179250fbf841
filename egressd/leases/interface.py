"""The lease store's contract: its values, its errors and the `LeaseStore` protocol.

The discovery API depends on this module only, never on a concrete store, so a
store shared between replicas can replace the in-memory one. Everything here is
plain data: a proxy is an opaque key (`"namespace/name"`), times are wall-clock
seconds since the epoch.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Protocol

import attrs

from egressd.errors import EgressdError

GLOBAL = ""
"""The cooldown target that blocks every acquire of a proxy."""


class Result(enum.Enum):
    """What a client saw through a leased proxy (`POST /v1/leases/{id}/report`).

    `PROXY_ERROR` is the proxy itself failing (refused, timed out, 407): it
    starts no cooldown and counts as a failed probe for the proxy's health.
    """

    OK = "ok"
    RATE_LIMITED = "rate_limited"
    BANNED = "banned"
    PROXY_ERROR = "proxy_error"


@attrs.frozen(kw_only=True)
class Candidate:
    """A proxy the cache has found leasable (phase Ready, healthy, a host, not deleting).

    `attributes` are what selectors match on (`spec.attributes`).
    """

    key: str
    max_leases: int
    latency_ms: float | None = None
    attributes: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Lease:
    """A granted lease. `target` is `""` when the client named none."""

    id: str
    key: str
    target: str
    expires_at: float


@attrs.frozen(kw_only=True)
class Grant:
    """A successful acquire: the lease and the proxy's active leases including it."""

    lease: Lease
    active_leases: int


@attrs.frozen(kw_only=True)
class Refusal:
    """Why no candidate was granted: each candidate counts in at most one bucket.

    A candidate in cooldown counts in `in_cooldown` even if it is also full, so
    `considered == at_capacity + in_cooldown` (the leasable candidates the
    selector matched) whenever acquire refuses. `retry_after` is the seconds
    until the soonest end of a lease or cooldown among them, None if none will
    end (no match, or maxLeases 0).
    """

    considered: int
    at_capacity: int
    in_cooldown: int
    retry_after: float | None = None


@attrs.frozen(kw_only=True)
class Cooldown:
    """A cooldown in force: the proxy `key` is not handed out for `target` until `until`."""

    key: str
    target: str
    until: float
    reason: Result


def outlasts(new: Cooldown, old: Cooldown | None) -> bool:
    """The one "never shorten a cooldown" rule: does `new` end later than `old`?

    A rate_limited report must not cut a ban short, and an old copy of a
    Proxy's status (a replay, a stale replica) must not lift a newer cooldown;
    the store and the status writer both decide with this.
    """
    return old is None or new.until > old.until


CooldownHook = Callable[[Cooldown], Awaitable[None]]
"""Called by a store with each cooldown a report started or lengthened (persistence)."""


@attrs.frozen(kw_only=True)
class Usage:
    """What the store knows about one proxy right now (for the API's proxyView)."""

    active_leases: int = 0
    cooldowns: Mapping[str, Cooldown] = attrs.field(factory=dict)


class UnknownLeaseError(EgressdError):
    """Raised by `report` for an id the store never issued or has forgotten.

    A lease is forgotten one retention window after it expired or was released,
    and at once on a restart (leases live in memory only).
    """


class LeaseStore(Protocol):
    """Leases and cooldowns, as the discovery API sees them.

    The store keeps the leasable candidates itself, fed by the Proxy cache on
    every change (`put_candidate`, `remove_candidate`: plain calls, made from
    informer handlers), so an acquire never walks the fleet.
    """

    def put_candidate(self, candidate: Candidate) -> None:
        """Add or replace a leasable candidate (a cache event said it is leasable)."""
        ...

    def remove_candidate(self, key: str) -> None:
        """The proxy is gone or not leasable any more; its leases stay until they end."""
        ...

    async def acquire(
        self, selector: Mapping[str, str], *, target: str, ttl: float,
        exclude: Collection[str] = (), only: str | None = None,
    ) -> Grant | Refusal:
        """Grant the best candidate whose attributes match `selector` for `target`
        (`""` = none) for `ttl` seconds, or refuse.

        Order: fewest active leases, then lowest latency (unknown last), then key.
        `exclude` (a few keys) are passed over and counted in no refusal bucket;
        `only` grants that one candidate or refuses.
        """
        ...

    async def lease(self, lease_id: str) -> Lease | None:
        """The lease while it is active (not expired, not released), else None."""
        ...

    async def release(self, lease_id: str) -> None:
        """Give a lease back; unknown, expired and already released ids are fine."""
        ...

    async def report(
        self,
        lease_id: str,
        *,
        result: Result,
        target: str | None = None,
        retry_after: float | None = None,
    ) -> Cooldown | None:
        """Record an outcome; return the cooldown it started, if any.

        Raises UnknownLeaseError for an id the store does not know.
        """
        ...

    async def usage(self, keys: Iterable[str]) -> Mapping[str, Usage]:
        """Active leases and cooldowns in force for each of `keys` (absent = none)."""
        ...
