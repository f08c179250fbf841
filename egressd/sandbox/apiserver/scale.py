"""The scale subresource of custom resources (`subresources.scale` of a CRD version).

kube-apiserver serves `/{plural}/{name}/scale` as an `autoscaling/v1` Scale:
`spec.replicas` read from and written to `specReplicasPath`, `status.replicas`
from `statusReplicasPath`, `status.selector` from `labelSelectorPath`. A write
goes through the object's own write pipeline (schema, CEL rules, generation),
so `kubectl scale` and a HorizontalPodAutoscaler are held to the same rules as
an edit of the object.
"""

from __future__ import annotations

import copy
from typing import Any

from egressd.sandbox.apiserver import bodies, patch, reads
from egressd.sandbox.apiserver.errors import (
    bad_request,
    conflict,
    method_not_allowed,
    unsupported_media_type,
)
from egressd.sandbox.apiserver.resources import ScalePaths
from egressd.sandbox.apiserver.respond import json_response, out
from egressd.sandbox.apiserver.routing import Target
from egressd.sandbox.apiserver.store import Obj
from egressd.sandbox.apiserver.wire import Request, Response
from egressd.sandbox.apiserver.writes import Writer

SCALE_API_VERSION = "autoscaling/v1"


def _parts(path: str) -> list[str]:
    return [p for p in path.split(".") if p]


def _read(obj: Obj, path: str) -> Any:
    value: Any = obj
    for part in _parts(path):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _write(obj: Obj, path: str, value: Any) -> None:
    *parents, last = _parts(path)
    for part in parents:
        obj = obj.setdefault(part, {})
    obj[last] = value


def scale_of(paths: ScalePaths, obj: Obj) -> Obj:
    """The Scale document of a stored object."""
    meta = obj["metadata"]
    status: Obj = {"replicas": int(_read(obj, paths.status_replicas) or 0)}
    selector = _read(obj, paths.label_selector) if paths.label_selector else None
    if selector:
        status["selector"] = selector
    return {"kind": "Scale", "apiVersion": SCALE_API_VERSION,
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                              "creationTimestamp") if k in meta},
            "spec": {"replicas": int(_read(obj, paths.spec_replicas) or 0)},
            "status": status}


def handle(writer: Writer, target: Target, request: Request) -> Response:
    """GET, PUT or PATCH of `/scale`."""
    rt = target.rt
    paths = rt.scale
    assert paths is not None and target.name is not None
    old = reads.get(writer.store, target)
    if request.method == "GET":
        return json_response(200, scale_of(paths, old))
    if request.method == "PUT":
        wanted = bodies.decoded(request, rt)
    elif request.method == "PATCH":
        media = bodies.content_type(request)
        if media not in (patch.MERGE, patch.JSON_PATCH):
            raise unsupported_media_type([patch.JSON_PATCH, patch.MERGE])
        wanted = patch.apply_patch(media, scale_of(paths, old), request.body,
                                   strategic_ok=False)
    else:
        raise method_not_allowed(request.method)
    replicas = _replicas(wanted)
    given_rv = (wanted.get("metadata") or {}).get("resourceVersion")
    if given_rv and given_rv != old["metadata"]["resourceVersion"]:
        raise conflict(rt.plural, rt.group, target.name)
    new = out(rt, copy.deepcopy(old))
    _write(new, paths.spec_replicas, replicas)
    result = writer.write(rt, new, old, subresource=None, dry_run=bodies.dry_run(request),
                          field_validation="Strict")
    return json_response(200, scale_of(paths, result.obj))


def _replicas(scale: Any) -> int:
    if not isinstance(scale, dict):
        raise bad_request("the body of the request is not a Scale object")
    if scale.get("kind") not in (None, "Scale"):
        raise bad_request(f"kind in the data ({scale.get('kind')}) does not match the "
                          "expected kind (Scale)")
    replicas = (scale.get("spec") or {}).get("replicas")
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise bad_request("Scale.spec.replicas: expected an integer")
    return replicas
