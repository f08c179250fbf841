"""The GCP provider's pure side: provider IDs, placement, the insert body, instances.

What egressd asks of Compute Engine and what it reads back, as plain values
(docs/providers.md): no client library call, no I/O, so each rule is tested
alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import attrs

from egressd import timestamps
from egressd.providers.config import REGION_RE, ZONE_RE, GcpConfig
from egressd.providers.contract import CreateRequest, Instance, InstanceState, Placement
from egressd.providers.errors import NotConfigured, NotFound, Permanent

# Compute Engine resource names (RFC 1035 labels).
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_MACHINE_TYPE_RE = re.compile(r"^[a-z0-9][-a-z0-9]*$")
_LABEL_RE = re.compile(r"^[a-z0-9_-]{0,63}$")

# Compute Engine refuses a metadata value over 256 KiB.
MAX_METADATA_VALUE_BYTES = 256 * 1024

# Every status of compute v1's Instance.status enum; one added later (and so
# unknown here) maps to Provisioning: poll again, do not replace.
STATES = {
    # PENDING: a Flex Start VM waiting for capacity.
    "PENDING": InstanceState.PROVISIONING,
    "PROVISIONING": InstanceState.PROVISIONING,
    "STAGING": InstanceState.PROVISIONING,
    # REPAIRING: the host failed and GCE is moving the VM; it comes back.
    "REPAIRING": InstanceState.PROVISIONING,
    "RUNNING": InstanceState.RUNNING,
    "PENDING_STOP": InstanceState.STOPPED,
    "STOPPING": InstanceState.STOPPED,
    # DEPROVISIONING: halted, its IP and disks being released (stop or delete).
    "DEPROVISIONING": InstanceState.STOPPED,
    "STOPPED": InstanceState.STOPPED,
    "SUSPENDING": InstanceState.STOPPED,
    "SUSPENDED": InstanceState.STOPPED,
    "TERMINATED": InstanceState.TERMINATED,
}


def provider_id(project: str, zone: str, name: str) -> str:
    """`<project>/<zone>/<name>`: everything get and delete need, with no lookup."""
    return f"{project}/{zone}/{name}"


def parse_provider_id(value: str) -> tuple[str, str, str]:
    """(project, zone, name) of a provider ID; `NotFound` if it cannot name a VM."""
    parts = value.split("/")
    if len(parts) != 3 or not all(parts) or not ZONE_RE.match(parts[1]):
        # No VM of this provider can have such an ID (it may be another provider's).
        raise NotFound(f"{value!r} is not a GCP provider ID (<project>/<zone>/<name>)")
    return parts[0], parts[1], parts[2]


@attrs.frozen
class Target:
    """Where a create goes once the config's defaults and the Placement are merged."""

    project: str
    zone: str
    machine_type: str


def resolve_target(config: GcpConfig, placement: Placement, *, project: str | None) -> Target:
    """Merge the Placement over the config; `Permanent`, naming the field, if it cannot be met.

    `project` is the config's project or else the credentials' project.
    """
    if not project:
        raise NotConfigured("gcp.project: no project configured and the credentials name none")
    zone = placement.zone or config.zone
    if not ZONE_RE.match(zone):
        field = "placement.zone" if placement.zone else "gcp.zone"
        raise Permanent(f"{field}: {zone!r} is not a Compute Engine zone (like europe-west1-b)")
    if placement.region:
        if not REGION_RE.match(placement.region):
            raise Permanent(f"placement.region: {placement.region!r} is not a Compute Engine "
                            "region (like europe-west1)")
        if zone.rsplit("-", 1)[0] != placement.region:
            raise Permanent(f"placement.region: zone {zone!r} is not in region "
                            f"{placement.region!r}; set placement.zone to a zone of that region")
    machine_type = placement.machine_type or config.machine_type
    if "/" not in machine_type and not _MACHINE_TYPE_RE.match(machine_type):
        field = "placement.machineType" if placement.machine_type else "gcp.machineType"
        raise Permanent(f"{field}: {machine_type!r} is not a machine type (like e2-micro)")
    return Target(project=project, zone=zone, machine_type=machine_type)


def _network_url(value: str, kind: str) -> str:
    # A bare name is a network of the VM's project; anything with a slash is a
    # partial or full URL and goes through unchanged (shared VPC).
    return value if "/" in value else f"{kind}/{value}"


def insert_body(config: GcpConfig, request: CreateRequest, target: Target) -> dict[str, Any]:
    """The `instances.insert` body for `request` (pure; docs/providers.md).

    One NIC with a one-to-one NAT access config (the external egress IP), the
    cloud-init as `user-data` metadata, the GC labels and the network tags.
    No service account: a proxy needs no Google API access.
    """
    machine_type = (target.machine_type if "/" in target.machine_type
                    else f"zones/{target.zone}/machineTypes/{target.machine_type}")
    nic: dict[str, Any] = {
        "network": _network_url(config.network, "global/networks"),
        "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
    }
    if config.subnetwork:
        region = target.zone.rsplit("-", 1)[0]
        nic["subnetwork"] = _network_url(config.subnetwork, f"regions/{region}/subnetworks")
    body: dict[str, Any] = {
        "name": request.name,
        "machineType": machine_type,
        "disks": [{
            "boot": True,
            "autoDelete": True,
            "initializeParams": {"sourceImage": config.image},
        }],
        "networkInterfaces": [nic],
        "metadata": {"items": [{"key": "user-data", "value": request.cloud_init}]},
        "labels": dict(request.labels),
    }
    if config.network_tags:
        body["tags"] = {"items": list(config.network_tags)}
    return body


def instance_state(status: str, nat_ip: str | None) -> InstanceState:
    """docs/providers.md's mapping; RUNNING without a NAT IP is still Provisioning."""
    state = STATES.get(status, InstanceState.PROVISIONING)
    if state is InstanceState.RUNNING and not nat_ip:
        return InstanceState.PROVISIONING
    return state


def instance_from_api(project: str, body: Mapping[str, Any]) -> Instance:
    """An `Instance` from a Compute Engine instance resource."""
    zone = str(body.get("zone", "")).rsplit("/", 1)[-1]
    nat_ip: str | None = None
    for nic in body.get("networkInterfaces") or ():
        for access in nic.get("accessConfigs") or ():
            nat_ip = nat_ip or access.get("natIP") or None
    created = body.get("creationTimestamp")
    created_at = timestamps.parse_time(created) if created else datetime.now(UTC)
    state = instance_state(str(body.get("status", "")), nat_ip)
    return Instance(
        provider_id=provider_id(project, zone, body["name"]),
        name=body["name"],
        state=state,
        ip=nat_ip,
        created_at=created_at,
        labels=body.get("labels") or {},
    )


def label_filter(labels: Mapping[str, str]) -> str:
    """A list `filter` matching every label: `(labels.k = "v") (labels.k2 = "v2")` (AND)."""
    for key, value in labels.items():
        if not _LABEL_RE.match(key) or not key or not _LABEL_RE.match(value):
            raise Permanent(f"labels: {key!r}={value!r} is not a valid GCP label")
    return " ".join(f'(labels.{k} = "{v}")' for k, v in sorted(labels.items()))
