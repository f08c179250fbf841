"""The resource types the server serves: built-in kinds and those defined by CRDs.

A `ResourceType` is what discovery advertises and what routing resolves a
URL to. Objects are stored per (group, plural), whichever served version a
client used; versions differ only in the apiVersion written on the way out
(no conversion: the Proxy CRD has one version).
"""

from __future__ import annotations

from typing import Any

import attrs

# Verbs as discovery lists them.
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

# Field selectors every resource supports; kinds add their own (kube-apiserver's
# field label conversion funcs).
COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@attrs.frozen
class ScalePaths:
    """Where a custom resource keeps its scale (`subresources.scale`: simple `.a.b` paths)."""

    spec_replicas: str
    status_replicas: str
    label_selector: str | None = None

    @classmethod
    def from_crd(cls, subresource: dict[str, Any]) -> ScalePaths:
        return cls(spec_replicas=subresource["specReplicasPath"],
                   status_replicas=subresource["statusReplicasPath"],
                   label_selector=subresource.get("labelSelectorPath"))


@attrs.frozen
class ResourceType:
    """One served resource (a plural under a group/version)."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    has_status: bool = False
    # A custom resource: no strategic merge patch, generation on any non-metadata change.
    custom: bool = False
    field_labels: frozenset[str] = COMMON_FIELDS
    # additionalPrinterColumns of the CRD version (custom resources only).
    printer_columns: tuple[dict[str, Any], ...] = ()
    # The CRD this came from (for schema enforcement), None for built-ins.
    crd_name: str | None = None
    # All served versions of this group/plural (for apiVersion checks).
    served_versions: tuple[str, ...] = ()
    # What discovery lists; a review (SelfSubjectAccessReview, ...) is create-only
    # and never stored.
    verbs: tuple[str, ...] = ALL_VERBS
    # subresources.scale of the CRD version (custom resources only).
    scale: ScalePaths | None = None

    @property
    def review(self) -> bool:
        return self.verbs == ("create",)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def store_key(self) -> str:
        """Where objects live, shared by every served version."""
        return f"{self.group}/{self.plural}"

    @property
    def has_generation(self) -> bool:
        """Built-ins served here have no metadata.generation; CRs and CRDs do."""
        return self.custom or self.kind == "CustomResourceDefinition"


def _builtin(group: str, version: str, plural: str, singular: str, kind: str, *,
             namespaced: bool, short: tuple[str, ...] = (), status: bool = False,
             fields: frozenset[str] = frozenset(), categories: tuple[str, ...] = ()
             ) -> ResourceType:
    return ResourceType(group=group, version=version, plural=plural, singular=singular, kind=kind,
                        namespaced=namespaced, short_names=short, has_status=status,
                        field_labels=COMMON_FIELDS | fields, categories=categories,
                        served_versions=(version,))


BUILTINS: tuple[ResourceType, ...] = (
    _builtin("", "v1", "namespaces", "namespace", "Namespace", namespaced=False, short=("ns",),
             status=True, fields=frozenset({"status.phase"})),
    _builtin("", "v1", "pods", "pod", "Pod", namespaced=True, short=("po",), status=True,
             categories=("all",),
             fields=frozenset({"spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                               "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                               "status.podIP", "status.nominatedNodeName"})),
    _builtin("", "v1", "secrets", "secret", "Secret", namespaced=True, fields=frozenset({"type"})),
    _builtin("", "v1", "events", "event", "Event", namespaced=True, short=("ev",),
             fields=frozenset({"involvedObject.kind", "involvedObject.namespace",
                               "involvedObject.name", "involvedObject.uid",
                               "involvedObject.apiVersion", "involvedObject.resourceVersion",
                               "involvedObject.fieldPath", "reason", "reportingComponent",
                               "source", "type"})),
    _builtin("coordination.k8s.io", "v1", "leases", "lease", "Lease", namespaced=True),
    _builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions",
             "customresourcedefinition", "CustomResourceDefinition", namespaced=False,
             short=("crd", "crds"), status=True, categories=("api-extensions",)),
    _builtin("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", namespaced=True,
             short=("sa",)),
    *(_builtin("rbac.authorization.k8s.io", "v1", plural, kind.lower(), kind,
               namespaced=namespaced)
      for plural, kind, namespaced in (
          ("roles", "Role", True), ("rolebindings", "RoleBinding", True),
          ("clusterroles", "ClusterRole", False),
          ("clusterrolebindings", "ClusterRoleBinding", False))),
    *(attrs.evolve(_builtin(group, "v1", plural, kind.lower(), kind, namespaced=False),
                   verbs=("create",))
      for group, plural, kind in (
          ("authorization.k8s.io", "selfsubjectaccessreviews", "SelfSubjectAccessReview"),
          ("authorization.k8s.io", "selfsubjectrulesreviews", "SelfSubjectRulesReview"),
          ("authentication.k8s.io", "selfsubjectreviews", "SelfSubjectReview"))),
)


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The resource types one CRD serves (one per served version)."""
    spec = crd["spec"]
    names = spec["names"]
    group = spec["group"]
    served = [v for v in spec.get("versions", []) if v.get("served", True)]
    out = []
    for version in served:
        subresources = version.get("subresources") or {}
        out.append(ResourceType(
            group=group, version=version["name"], plural=names["plural"],
            singular=names.get("singular") or names["kind"].lower(), kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            short_names=tuple(names.get("shortNames") or ()),
            categories=tuple(names.get("categories") or ()),
            has_status="status" in subresources, custom=True,
            printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
            crd_name=crd["metadata"]["name"],
            served_versions=tuple(v["name"] for v in served),
            scale=_scale_paths(subresources.get("scale"))))
    return out


def _scale_paths(subresource: dict[str, Any] | None) -> ScalePaths | None:
    return ScalePaths.from_crd(subresource) if subresource else None
