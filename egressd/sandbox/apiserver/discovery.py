"""Discovery documents: /version, /api, /apis, /api/v1 and /apis/{group}/{version}.

Only the unaggregated forms: kubectl asks for aggregated discovery first and
falls back when it gets a plain APIGroupList. `/version` reports minor "32"
because this machine's kubectl is a dispatcher picking its binary by the
server's minor version.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from egressd.sandbox.apiserver.resources import ResourceType

VERSION = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.0-egressd-sandbox",
    "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.23.4", "compiler": "gc",
    "platform": "linux/amd64",
}


def api_versions(address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                            "serverAddress": address}]}


def _group_entry(group: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def group_versions(types: Iterable[ResourceType]) -> dict[str, list[str]]:
    """Named groups and their served versions, in first-seen order."""
    groups: dict[str, list[str]] = {}
    for rt in types:
        if rt.group and rt.version not in groups.setdefault(rt.group, []):
            groups[rt.group].append(rt.version)
    return groups


def api_group_list(types: Iterable[ResourceType]) -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [_group_entry(g, vs) for g, vs in group_versions(types).items()]}


def api_group(group: str, types: Iterable[ResourceType]) -> dict[str, Any] | None:
    versions = group_versions(types).get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def resource_list(group_version: str, types: Iterable[ResourceType]) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for rt in types:
        entry: dict[str, Any] = {
            "name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
            "kind": rt.kind, "verbs": list(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        if rt.has_status:
            resources.append({"name": f"{rt.plural}/status", "singularName": "",
                              "namespaced": rt.namespaced, "kind": rt.kind,
                              "verbs": ["get", "patch", "update"]})
        if rt.scale is not None:
            resources.append({"name": f"{rt.plural}/scale", "singularName": "",
                              "namespaced": rt.namespaced, "group": "autoscaling",
                              "version": "v1", "kind": "Scale",
                              "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": resources}
