"""A write request's inputs: the body in JSON, YAML or protobuf, checked against the
resource's kind and apiVersion, and the `dryRun` and `fieldValidation` parameters."""

from __future__ import annotations

from typing import Any

from egressd.sandbox.apiserver import builtin, patch, protobuf
from egressd.sandbox.apiserver.errors import bad_request, unsupported_media_type
from egressd.sandbox.apiserver.resources import ResourceType
from egressd.sandbox.apiserver.store import Obj
from egressd.sandbox.apiserver.wire import Request


def content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def field_validation(request: Request) -> str:
    value = request.param("fieldValidation") or "Warn"
    if value not in ("Strict", "Warn", "Ignore"):
        raise bad_request(f'fieldValidation: Unsupported value: "{value}": supported values: '
                          '"Ignore", "Strict", "Warn"')
    return value


def dry_run(request: Request) -> bool:
    value = request.param("dryRun")
    if value and value != "All":
        raise bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
    return value == "All"


def decoded(request: Request, rt: ResourceType) -> Any:
    """A request body in whichever of JSON, YAML or protobuf its Content-Type names."""
    media = content_type(request)
    if media in ("application/yaml", "application/x-yaml"):
        return patch.parse_apply(request.body)
    if media in ("", "application/json", "*/*"):
        return patch.parse_json(request.body)
    accepted = ["application/json", "application/yaml"]
    if rt.kind in protobuf.READABLE_KINDS:
        accepted.append(protobuf.MEDIA_TYPE)
    if media == protobuf.MEDIA_TYPE:
        try:
            return protobuf.decode(request.body)
        except protobuf.UnsupportedKind:
            # Like kube-apiserver for a custom resource: a 415, here for any kind
            # whose protobuf message this server does not know.
            raise unsupported_media_type(accepted) from None
        except protobuf.ProtobufError as exc:
            raise bad_request(f"the protobuf body cannot be decoded: {exc}") from None
    # CBOR is not spoken here: 415 as kube-apiserver answers an unknown body type.
    raise unsupported_media_type(accepted)


def object_body(request: Request, rt: ResourceType) -> Obj:
    """The body of a create or replace: an object of the resource's kind."""
    body = decoded(request, rt)
    if not isinstance(body, dict):
        raise bad_request("the body of the request is not a JSON object")
    check_type(rt, body)
    return body


def check_type(rt: ResourceType, body: Obj) -> None:
    """400 unless `body`'s kind and apiVersion (when given) are the resource's."""
    kind, api_version = body.get("kind"), body.get("apiVersion")
    if kind is not None and kind != rt.kind:
        raise bad_request(f"kind in the data ({kind}) does not match the expected kind "
                          f"({rt.kind})")
    served = [f"{rt.group}/{v}" if rt.group else v
              for v in (rt.served_versions or (rt.version,))]
    if api_version is not None and api_version not in served:
        raise bad_request(f"the API version in the data ({api_version}) does not match the "
                          f"expected API version ({rt.api_version})")
    if not isinstance(body.get("metadata", {}), dict):
        raise bad_request("metadata: must be an object")


def check_decodable(rt: ResourceType, obj: Obj) -> None:
    """400 for a field of the wrong JSON type, as kube-apiserver's decoder answers it."""
    problem = builtin.decode_problem(rt, obj)
    if problem is not None:
        raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                          f"{rt.kind}: {problem}")


def url_name(body: Obj, rt: ResourceType, *, name: str, namespace: str | None) -> Obj:
    """`body`'s metadata, checked against and filled from the URL's name and namespace."""
    meta: Obj = body.setdefault("metadata", {})
    if meta.get("name") not in (None, name):
        raise bad_request(f"the name of the object ({meta.get('name')}) does not match the "
                          f"name on the URL ({name})")
    meta["name"] = name
    if rt.namespaced:
        if meta.get("namespace") not in (None, "", namespace):
            raise bad_request("the namespace of the provided object does not match the "
                              "namespace sent on the request")
        meta["namespace"] = namespace
    return meta
