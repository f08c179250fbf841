"""What the built-in kinds do on write: their defaults, folding and validation.

Only what clients of this project can observe: Secrets fold `stringData`
into base64 `data` and honour `immutable`; Pods need containers, start
Pending and keep their spec; Namespaces start Active; CRDs need coherent
names and get the Established and NamesAccepted conditions at once.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from egressd.sandbox.apiserver.resources import ResourceType

Cause = tuple[str, str, str]  # (field, reason, message)

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def name_problem(rt: ResourceType, name: str) -> str | None:
    """Why a name is not valid for the kind (None when it is)."""
    if rt.kind == "Namespace":
        if len(name) > 63 or not _LABEL.match(name):
            return ("a lowercase RFC 1123 label must consist of lower case alphanumeric "
                    "characters or '-', and must start and end with an alphanumeric character")
        return None
    if len(name) > 253 or not _SUBDOMAIN.match(name):
        return ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character")
    return None


def quote(value: Any) -> str:
    """A value as kube's field errors print it."""
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def on_create(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Defaults a real API server fills on create (mutates `obj`)."""
    if rt.kind == "Pod":
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        spec = obj.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
    elif rt.kind == "Namespace":
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = (
            obj["metadata"]["name"])
    elif rt.kind == "CustomResourceDefinition":
        names = obj.get("spec", {}).get("names", {})
        obj["status"] = {
            "acceptedNames": names,
            "storedVersions": [v.get("name") for v in obj.get("spec", {}).get("versions", [])
                               if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": obj["metadata"][
                     "creationTimestamp"]},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted",
                 "lastTransitionTime": obj["metadata"]["creationTimestamp"]},
            ],
        }


def on_write(rt: ResourceType, obj: dict[str, Any]) -> list[Cause]:
    """Normalise `obj` in place before any write; returns 422 causes."""
    if rt.kind == "Secret":
        return _secret(obj)
    if rt.kind == "CustomResourceDefinition":
        return _crd(obj)
    return []


def _secret(obj: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    obj.setdefault("type", "Opaque")
    data = obj.get("data") or {}
    if not isinstance(data, dict):
        return [("data", "FieldValueInvalid", "Invalid value: must be a map")]
    for key, value in data.items():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            causes.append((f"data[{key}]", "FieldValueInvalid",
                           "Invalid value: <secret contents redacted>: illegal base64 data"))
    string_data = obj.pop("stringData", None) or {}
    if isinstance(string_data, dict):
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
    if data:
        obj["data"] = data
    return causes


def _crd(obj: dict[str, Any]) -> list[Cause]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "FieldValueRequired", "Required value")]
    causes: list[Cause] = []
    names = spec.get("names") or {}
    group = spec.get("group")
    for field, value in (("spec.group", group), ("spec.names.plural", names.get("plural")),
                         ("spec.names.kind", names.get("kind"))):
        if not value:
            causes.append((field, "FieldValueRequired", "Required value"))
    versions = spec.get("versions") or []
    if not versions:
        causes.append(("spec.versions", "FieldValueRequired",
                       "Required value: must have exactly one version marked as storage version"))
    elif sum(1 for v in versions if v.get("storage")) != 1:
        causes.append(("spec.versions", "FieldValueInvalid",
                       "Invalid value: must have exactly one version marked as storage version"))
    expected = f"{names.get('plural')}.{group}"
    if not causes and obj["metadata"]["name"] != expected:
        causes.append(("metadata.name", "FieldValueInvalid",
                       f"Invalid value: {quote(obj['metadata']['name'])}: must be spec.names.plural"
                       f"+\".\"+spec.group"))
    return causes


def validate(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Kind rules checked after normalisation (create when `old` is None)."""
    causes: list[Cause] = []
    if rt.kind == "Pod":
        containers = (obj.get("spec") or {}).get("containers")
        if not containers:
            causes.append(("spec.containers", "FieldValueRequired", "Required value"))
        else:
            for i, container in enumerate(containers):
                if not isinstance(container, dict) or not container.get("name"):
                    causes.append((f"spec.containers[{i}].name", "FieldValueRequired",
                                   "Required value"))
                elif not container.get("image"):
                    causes.append((f"spec.containers[{i}].image", "FieldValueRequired",
                                   "Required value"))
        if old is not None and _pod_spec_frozen(obj) != _pod_spec_frozen(old):
            causes.append(("spec", "FieldValueForbidden",
                           "Forbidden: pod updates may not change fields other than "
                           "`spec.containers[*].image`, `spec.initContainers[*].image`, "
                           "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions "
                           "to existing tolerations), `spec.terminationGracePeriodSeconds` "
                           "(allow it to be set to 1 if it was previously negative)"))
    if rt.kind == "Secret" and old is not None and old.get("immutable"):
        for field in ("data", "type", "immutable"):
            if obj.get(field) != old.get(field):
                causes.append((field, "FieldValueForbidden",
                               "Forbidden: field is immutable when `immutable` is set"))
    return causes


def _pod_spec_frozen(pod: dict[str, Any]) -> Any:
    spec = dict(pod.get("spec") or {})
    for field in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds",
                  "nodeName"):
        spec.pop(field, None)
    spec["containers"] = [{k: v for k, v in c.items() if k != "image"}
                          for c in spec.get("containers") or [] if isinstance(c, dict)]
    return spec
