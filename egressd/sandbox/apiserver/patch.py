"""Patch kinds: JSON merge (RFC 7386), JSON patch (RFC 6902), strategic merge, apply.

Strategic merge is the subset built-in kinds need: a merge patch in which
the lists kube-apiserver merges by key (containers by name, conditions by
type, ...) are merged by that key, `finalizers` merges as a set, and the
`$patch`, `$setElementOrder`, `$retainKeys` and `$deleteFromPrimitiveList`
directives kubectl sends are honoured or dropped. Server-side apply merges
the applied configuration into the live object the same way (maps merged,
keyed lists merged by key, other lists replaced); field ownership is not
tracked, so a field removed from the applied configuration stays.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import yaml

from egressd.sandbox.apiserver.errors import ApiError, bad_request, unprocessable

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

# Lists merged by a key in strategic merge and apply (kube's patchMergeKey tags).
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "volumes": "name", "env": "name", "volumeMounts": "mountPath", "ports": "containerPort",
    "conditions": "type", "imagePullSecrets": "name", "ownerReferences": "uid",
    "hostAliases": "ip", "containerStatuses": "name", "initContainerStatuses": "name",
    "versions": "name",
}
# Lists of scalars merged as sets.
SET_LISTS = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _rejected(detail: str) -> ApiError:
    # kube-apiserver's answer to a patch that cannot apply: a generic 422 whose
    # cause carries the JSON patch library's message.
    return ApiError(422, "Invalid", "the server rejected our request due to an error in our "
                    "request", details={"causes": [{"reason": "UnexpectedServerResponse",
                                                    "message": detail}]})


def json_patch(target: dict[str, Any], ops: Any) -> dict[str, Any]:
    """RFC 6902; an op that cannot apply (a failed `test` included) is a 422."""
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    result: Any = target
    # One op at a time, so an error can name the op's path as kube's library does.
    for op in ops:
        path = op.get("path") if isinstance(op, dict) else None
        try:
            result = jsonpatch.apply_patch(result, [op])
        except jsonpatch.JsonPatchTestFailed:
            raise _rejected(f"testing value {path} failed: test failed") from None
        except (jsonpatch.JsonPatchConflict, jsonpatch.JsonPointerException) as exc:
            raise _rejected(f"{exc} (op {op.get('op')!r} at {path})") from None
        except (jsonpatch.InvalidJsonPatch, TypeError, KeyError, ValueError,
                AttributeError) as exc:
            raise bad_request(f"invalid JSON patch: {exc}") from None
    if not isinstance(result, dict):
        raise unprocessable("the patch replaced the whole object with a non-object")
    return result


def _keyed_merge(live: list[Any], patch: list[Any], key: str, *, strategic: bool) -> list[Any]:
    result = copy.deepcopy(live)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            return copy.deepcopy(patch)  # not a keyed list after all: replace
        directive = item.get("$patch") if strategic else None
        index = next((i for i, old in enumerate(result)
                      if isinstance(old, dict) and old.get(key) == item[key]), None)
        if directive == "delete":
            if index is not None:
                result.pop(index)
            continue
        clean = {k: v for k, v in item.items() if k != "$patch"}
        if index is None:
            result.append(strategic_merge({}, clean) if strategic else copy.deepcopy(clean))
        else:
            result[index] = strategic_merge(result[index], clean, strategic=strategic)
    return result


def strategic_merge(target: Any, patch: Any, *, strategic: bool = True) -> Any:
    """Strategic merge patch (or, with strategic=False, apply's merge)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if strategic and patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if strategic and patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list) and isinstance(value, list):
                result[name] = [v for v in result[name] if v not in value]
            continue
        merged = _merge_member(key, result.get(key), value, strategic=strategic)
        if merged is None:
            result.pop(key, None)
        else:
            result[key] = merged
    return result


def _merge_member(key: str, current: Any, value: Any, *, strategic: bool) -> Any:
    """One member's merged value (None: remove the member)."""
    if value is None:
        return None
    if isinstance(value, list) and isinstance(current, list):
        if key in MERGE_KEYS:
            return _keyed_merge(current, value, MERGE_KEYS[key], strategic=strategic)
        if key in SET_LISTS and strategic:
            return current + [v for v in value if v not in current]
        return copy.deepcopy(value)
    if isinstance(value, dict):
        return strategic_merge(current, value, strategic=strategic)
    return copy.deepcopy(value)


def parse_json(body: bytes) -> Any:
    """A JSON request body, or 400 like kube-apiserver's decoder."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from None


def parse_apply(body: bytes) -> dict[str, Any]:
    """An apply body (YAML or JSON, which is YAML)."""
    try:
        doc = yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise bad_request(f"error decoding YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise bad_request("error decoding YAML: the applied configuration is not an object")
    return doc


def apply_patch(content_type: str, live: dict[str, Any], body: bytes, *,
                strategic_ok: bool) -> dict[str, Any]:
    """The object after a PATCH of `content_type` on `live` (apply handled by the caller)."""
    if content_type == MERGE:
        patch = parse_json(body)
        if not isinstance(patch, dict):
            raise bad_request("the merge patch is not a JSON object")
        result = merge_patch(live, patch)
    elif content_type == JSON_PATCH:
        result = json_patch(live, parse_json(body))
    elif content_type == STRATEGIC and strategic_ok:
        patch = parse_json(body)
        if not isinstance(patch, dict):
            raise bad_request("the strategic merge patch is not a JSON object")
        result = strategic_merge(live, patch)
    else:
        raise ApiError(415, "UnsupportedMediaType", "unreachable")  # caller checks types first
    if not isinstance(result, dict):
        raise unprocessable("the patch removed the whole object")
    return result


def accepted_types(*, strategic_ok: bool) -> list[str]:
    """Patch content types a resource takes, in kube-apiserver's order."""
    types = [JSON_PATCH, MERGE]
    if strategic_ok:
        types.append(STRATEGIC)
    types.append(APPLY)
    return types
