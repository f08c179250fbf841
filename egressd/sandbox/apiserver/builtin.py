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


# The JSON type each field must have for the kind's Go struct to decode it; a
# mismatch is a 400 on a real server (custom resources: metadata only, their
# schema types the rest). Shapes: str, int, bool, obj, map (string to string),
# strs (list of strings), objs (list of objects), time (an RFC 3339 string).
_META_SHAPE = {
    "metadata.name": "str", "metadata.generateName": "str", "metadata.namespace": "str",
    "metadata.selfLink": "str", "metadata.uid": "str", "metadata.resourceVersion": "str",
    "metadata.generation": "int", "metadata.creationTimestamp": "time",
    "metadata.deletionTimestamp": "time", "metadata.deletionGracePeriodSeconds": "int",
    "metadata.labels": "map", "metadata.annotations": "map", "metadata.finalizers": "strs",
    "metadata.ownerReferences": "objs", "metadata.managedFields": "objs",
}
_KIND_SHAPES: dict[str, dict[str, str]] = {
    "Pod": {"spec": "obj", "spec.containers": "objs", "spec.nodeName": "str",
            "spec.nodeSelector": "map", "status": "obj", "status.phase": "str",
            "status.podIP": "str", "status.conditions": "objs",
            "status.containerStatuses": "objs"},
    "Secret": {"data": "map", "stringData": "map", "type": "str", "immutable": "bool"},
    "Namespace": {"spec": "obj", "spec.finalizers": "strs", "status": "obj",
                  "status.phase": "str"},
    "Event": {"involvedObject": "obj", "involvedObject.kind": "str",
              "involvedObject.namespace": "str", "involvedObject.name": "str",
              "involvedObject.uid": "str", "involvedObject.apiVersion": "str",
              "involvedObject.resourceVersion": "str", "involvedObject.fieldPath": "str",
              "reason": "str", "message": "str", "type": "str", "count": "int",
              "source": "obj", "source.component": "str", "source.host": "str",
              "firstTimestamp": "time", "lastTimestamp": "time", "eventTime": "time",
              "reportingComponent": "str", "reportingInstance": "str", "action": "str"},
    "Lease": {"spec": "obj", "spec.holderIdentity": "str", "spec.leaseDurationSeconds": "int",
              "spec.acquireTime": "time", "spec.renewTime": "time",
              "spec.leaseTransitions": "int"},
    "CustomResourceDefinition": {"spec": "obj", "status": "obj"},
}
_GO_TYPES = {"str": "string", "int": "int64", "bool": "bool", "obj": "struct",
             "map": "map[string]string", "strs": "[]string", "objs": "[]struct",
             "time": "v1.Time"}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _fits(shape: str, value: Any) -> bool:
    if shape in ("str", "time"):
        return isinstance(value, str)
    if shape == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if shape == "bool":
        return isinstance(value, bool)
    if shape == "obj":
        return isinstance(value, dict)
    if shape == "map":
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    if shape == "strs":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def decode_problem(rt: ResourceType, obj: dict[str, Any]) -> str | None:
    """Why the kind's Go struct could not decode `obj` (None when it could).

    Nulls are dropped on the way, as decoding into Go and encoding again drops
    them, so later code never meets a null where it expects a value.
    """
    shapes = _META_SHAPE if rt.custom else {**_META_SHAPE, **_KIND_SHAPES.get(rt.kind, {})}
    for path, shape in shapes.items():
        parent: Any = obj
        *parents, key = path.split(".")
        for part in parents:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or key not in parent:
            continue
        value = parent[key]
        if value is None:
            del parent[key]
        elif not _fits(shape, value):
            return (f"json: cannot unmarshal {_json_type(value)} into Go struct field "
                    f"{rt.kind}.{path} of type {_GO_TYPES[shape]}")
    return None


def on_create(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Defaults a real API server fills on create (mutates `obj`)."""
    if rt.kind == "Pod":
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif rt.kind == "Namespace":
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = (
            obj["metadata"]["name"])
    elif rt.kind == "CustomResourceDefinition":
        # Malformed specs reach here too; `on_write` refuses them right after.
        raw_spec = obj.get("spec")
        crd_spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
        raw_versions = crd_spec.get("versions")
        versions: list[Any] = raw_versions if isinstance(raw_versions, list) else []
        obj["status"] = {
            "acceptedNames": crd_spec.get("names"),
            "storedVersions": [v.get("name") for v in versions
                               if isinstance(v, dict) and v.get("storage")],
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
    if rt.kind == "Pod" and isinstance(obj.get("spec"), dict):
        # Defaulting is part of decoding in kube-apiserver, so an update (a `kubectl
        # replace` of the manifest) gets the same defaults as the create did.
        spec = obj["spec"]
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
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


def _need_text(causes: list[Cause], field: str, value: Any) -> None:
    if not value:
        causes.append((field, "FieldValueRequired", "Required value"))
    elif not isinstance(value, str):
        causes.append((field, "FieldValueInvalid", f"Invalid value: {quote(value)}: "
                                                   "must be a string"))


def _need_list_of_text(causes: list[Cause], field: str, value: Any) -> None:
    if value is not None and not (isinstance(value, list)
                                  and all(isinstance(v, str) for v in value)):
        causes.append((field, "FieldValueInvalid", "Invalid value: must be a list of strings"))


def _crd(obj: dict[str, Any]) -> list[Cause]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "FieldValueRequired", "Required value")]
    names = spec.get("names")
    if names is None:
        names = {}
    elif not isinstance(names, dict):
        return [("spec.names", "FieldValueInvalid", "Invalid value: must be an object")]
    causes = _crd_names(spec, names)
    versions = spec.get("versions")
    if not versions:
        causes.append(("spec.versions", "FieldValueRequired",
                       "Required value: must have exactly one version marked as storage version"))
        return causes
    if not isinstance(versions, list) or not all(isinstance(v, dict) for v in versions):
        causes.append(("spec.versions", "FieldValueInvalid",
                       "Invalid value: must be a list of versions"))
        return causes
    for i, version in enumerate(versions):
        causes += _crd_version(f"spec.versions[{i}]", version)
    if sum(1 for v in versions if v.get("storage") is True) != 1:
        causes.append(("spec.versions", "FieldValueInvalid",
                       "Invalid value: must have exactly one version marked as storage version"))
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if not causes and obj["metadata"]["name"] != expected:
        causes.append(("metadata.name", "FieldValueInvalid",
                       f"Invalid value: {quote(obj['metadata']['name'])}: must be spec.names.plural"
                       f"+\".\"+spec.group"))
    return causes


def _crd_names(spec: dict[str, Any], names: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    _need_text(causes, "spec.group", spec.get("group"))
    _need_text(causes, "spec.names.plural", names.get("plural"))
    _need_text(causes, "spec.names.kind", names.get("kind"))
    for field in ("singular", "listKind"):
        if names.get(field) is not None and not isinstance(names[field], str):
            causes.append((f"spec.names.{field}", "FieldValueInvalid",
                           "Invalid value: must be a string"))
    _need_list_of_text(causes, "spec.names.shortNames", names.get("shortNames"))
    _need_list_of_text(causes, "spec.names.categories", names.get("categories"))
    if spec.get("scope", "Namespaced") not in ("Namespaced", "Cluster"):
        causes.append(("spec.scope", "FieldValueNotSupported",
                       f"Unsupported value: {quote(spec.get('scope'))}: supported values: "
                       '"Cluster", "Namespaced"'))
    return causes


def _column_ok(column: Any) -> bool:
    return (isinstance(column, dict) and bool(column.get("name"))
            and isinstance(column.get("name"), str) and isinstance(column.get("jsonPath"), str)
            and isinstance(column.get("type", ""), str)
            and isinstance(column.get("priority", 0), int))


def _crd_version(where: str, version: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    _need_text(causes, f"{where}.name", version.get("name"))
    for field in ("served", "storage"):
        if not isinstance(version.get(field, False), bool):
            causes.append((f"{where}.{field}", "FieldValueInvalid",
                           "Invalid value: must be a boolean"))
    for field in ("schema", "subresources"):
        if not isinstance(version.get(field) or {}, dict):
            causes.append((f"{where}.{field}", "FieldValueInvalid",
                           "Invalid value: must be an object"))
    columns = version.get("additionalPrinterColumns") or []
    if not isinstance(columns, list) or not all(_column_ok(c) for c in columns):
        causes.append((f"{where}.additionalPrinterColumns", "FieldValueInvalid",
                       "Invalid value: each column needs a name, a type and a jsonPath"))
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
