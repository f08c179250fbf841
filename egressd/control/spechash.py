"""The spec hash (docs/reference.md): what a Managed proxy's instance was built from.

`crawl.example.com/spec-hash` holds the SHA-256 hex of the inputs that need a
new instance when they change: placement, the *resolved* cloud-init text and
the port (docs/reference.md), and the provider's name: an instance lives on one
provider, so moving a proxy to another one needs a new instance there
(docs/decisions.md). They are hashed as canonical JSON (sorted keys, no whitespace,
unset placement fields left out), so the hash does not depend on key order or
on whether an empty placement is written as `{}` or left out, and an egressd
upgrade that reorders fields does not replace the fleet.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from egressd.model.proxy import Placement


def canonical_json(value: Any) -> str:
    """`value` as JSON with sorted keys and no whitespace (the hash input)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def placement_fields(placement: Placement | Mapping[str, str | None] | None) -> dict[str, str]:
    """The set placement hints by wire name; None and an all-unset placement are both `{}`."""
    if placement is None:
        return {}
    if isinstance(placement, Placement):
        items: Mapping[str, str | None] = {
            "zone": placement.zone, "region": placement.region,
            "machineType": placement.machine_type}
    else:
        items = placement
    return {k: v for k, v in items.items() if v is not None}


def spec_hash(*, provider: str, placement: Placement | Mapping[str, str | None] | None,
              cloud_init: str, port: int) -> str:
    """SHA-256 hex of the canonical JSON of provider, placement, resolved cloud-init and port."""
    doc = {"provider": provider, "placement": placement_fields(placement),
           "cloudInit": cloud_init, "port": port}
    return hashlib.sha256(canonical_json(doc).encode("utf-8")).hexdigest()
