"""The Kubernetes resources egressd talks to, and how their URLs are built.

A `Resource` names a kind by group/version/plural; `path()` builds the REST path
for a collection, one object or a subresource, so no other module formats URLs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import attrs

from egressd.model.constants import GROUP, KIND, PLURAL, VERSION


@attrs.frozen
class Resource:
    """One API resource type (a group, version and plural)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        """The `apiVersion` of objects of this resource (`v1`, `coordination.k8s.io/v1`)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The URL path of the collection, of one object, or of its subresource.

        A namespaced resource without a namespace means "across all namespaces"
        (only valid for list and watch); a cluster-scoped resource ignores none:
        passing a namespace for it is a programming error.
        """
        if not self.namespaced and namespace:
            raise ValueError(f"{self.plural} is cluster-scoped; got namespace {namespace!r}")
        if subresource and not name:
            raise ValueError("a subresource needs an object name")
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [root]
        if namespace:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name:
            parts.append(quote(name, safe=""))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


PROXIES = Resource(GROUP, VERSION, PLURAL, KIND)
PODS = Resource("", "v1", "pods", "Pod")
SECRETS = Resource("", "v1", "secrets", "Secret")
EVENTS = Resource("", "v1", "events", "Event")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)


def resource_version(obj: Mapping[str, Any]) -> str:
    """An object's (or a list's) `metadata.resourceVersion`; "" when it has none."""
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


def object_key(obj: dict[str, object]) -> str:
    """The cache and work-queue key of an object: `namespace/name` (`name` if cluster-scoped)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise ValueError("object has no metadata")
    name = meta.get("name", "")
    namespace = meta.get("namespace") or ""
    return f"{namespace}/{name}" if namespace else str(name)
