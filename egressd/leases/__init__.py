"""Leases and cooldowns (docs/reference.md): the `LeaseStore` contract and its in-memory store.

Importers that only need the contract (the discovery API) use the names below;
`egressd.leases.store` is the in-memory implementation, `egressd.leases.persist`
writes cooldowns to the Proxy's status and loads them back.
"""

from egressd.leases.interface import (
    GLOBAL,
    Candidate,
    Cooldown,
    Grant,
    Lease,
    LeaseStore,
    Refusal,
    Result,
    UnknownLeaseError,
    Usage,
)

__all__ = [
    "GLOBAL",
    "Candidate",
    "Cooldown",
    "Grant",
    "Lease",
    "LeaseStore",
    "Refusal",
    "Result",
    "UnknownLeaseError",
    "Usage",
]
