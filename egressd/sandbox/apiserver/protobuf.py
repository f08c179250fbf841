"""Kubernetes protobuf request bodies, read for the kinds kubectl's typed clients write.

Since client-go 1.31 (kubernetes/kubernetes#125314) the generated clientsets
of built-in kinds send `application/vnd.kubernetes.protobuf` bodies, and
kubectl's imperative `create namespace` and `create secret` go through them.
Nothing the server advertises changes that: client-go steps back to JSON
after a 415 only for CBOR (`requestClientContentConfigProvider`), and a
kubeconfig has no content-type field. So the server reads protobuf for
Namespace, Secret and DeleteOptions: the `k8s\\x00` envelope (runtime.Unknown)
and the fields of those messages (k8s.io/api/core/v1 and apimachinery
meta/v1 `generated.proto`), decoded into the JSON the same object would
have. Answers stay JSON, which those clients also accept.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from egressd import timestamps

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    """Raised for a body that is not a well-formed Kubernetes protobuf envelope."""


class UnsupportedKind(Exception):
    """Raised for a well-formed body of a kind this module cannot decode."""

    def __init__(self, api_version: str, kind: str) -> None:
        super().__init__(f"{api_version}/{kind}")
        self.api_version = api_version
        self.kind = kind


@attrs.frozen
class _Field:
    """How one protobuf field becomes a JSON member.

    kind: string, int, bool, time (meta/v1 Time), message,
    strings (repeated string), messages (repeated message), map (string to
    string), bytesmap (string to base64 bytes). `keep` marks a Go pointer or
    required field, kept even at its zero value; other zero values are
    omitted, as Go's `omitempty` does.
    """

    name: str
    kind: str
    message: Mapping[int, _Field] | None = None
    keep: bool = False


_OWNER_REFERENCE = {
    5: _Field("apiVersion", "string", keep=True), 1: _Field("kind", "string", keep=True),
    3: _Field("name", "string", keep=True), 4: _Field("uid", "string", keep=True),
    6: _Field("controller", "bool", keep=True),
    7: _Field("blockOwnerDeletion", "bool", keep=True),
}

_OBJECT_META = {
    1: _Field("name", "string"), 2: _Field("generateName", "string"),
    3: _Field("namespace", "string"), 4: _Field("selfLink", "string"),
    5: _Field("uid", "string"), 6: _Field("resourceVersion", "string"),
    7: _Field("generation", "int"), 8: _Field("creationTimestamp", "time"),
    9: _Field("deletionTimestamp", "time"),
    10: _Field("deletionGracePeriodSeconds", "int", keep=True),
    11: _Field("labels", "map"), 12: _Field("annotations", "map"),
    13: _Field("ownerReferences", "messages", _OWNER_REFERENCE),
    14: _Field("finalizers", "strings"),
}

_NAMESPACE_CONDITION = {
    1: _Field("type", "string"), 2: _Field("status", "string"),
    4: _Field("lastTransitionTime", "time"), 5: _Field("reason", "string"),
    6: _Field("message", "string"),
}

_NAMESPACE = {
    1: _Field("metadata", "message", _OBJECT_META),
    2: _Field("spec", "message", {1: _Field("finalizers", "strings")}),
    3: _Field("status", "message", {1: _Field("phase", "string"),
                                    2: _Field("conditions", "messages", _NAMESPACE_CONDITION)}),
}

_SECRET = {
    1: _Field("metadata", "message", _OBJECT_META), 2: _Field("data", "bytesmap"),
    3: _Field("type", "string"), 4: _Field("stringData", "map"),
    5: _Field("immutable", "bool", keep=True),
}

_DELETE_OPTIONS = {
    1: _Field("gracePeriodSeconds", "int", keep=True),
    2: _Field("preconditions", "message", {1: _Field("uid", "string", keep=True),
                                           2: _Field("resourceVersion", "string", keep=True)},
              keep=True),
    3: _Field("orphanDependents", "bool", keep=True),
    4: _Field("propagationPolicy", "string", keep=True),
    5: _Field("dryRun", "strings"),
    6: _Field("ignoreStoreReadErrorWithClusterBreakingPotential", "bool", keep=True),
}

_TYPE_META = {1: _Field("apiVersion", "string"), 2: _Field("kind", "string")}

# authorization/v1 (kubectl auth can-i sends its reviews in protobuf).
_RESOURCE_ATTRIBUTES = {
    1: _Field("namespace", "string"), 2: _Field("verb", "string"), 3: _Field("group", "string"),
    4: _Field("version", "string"), 5: _Field("resource", "string"),
    6: _Field("subresource", "string"), 7: _Field("name", "string"),
}
_ACCESS_REVIEW = {
    1: _Field("metadata", "message", _OBJECT_META),
    2: _Field("spec", "message", {
        1: _Field("resourceAttributes", "message", _RESOURCE_ATTRIBUTES),
        2: _Field("nonResourceAttributes", "message", {1: _Field("path", "string"),
                                                       2: _Field("verb", "string")})}),
}
_RULES_REVIEW = {
    1: _Field("metadata", "message", _OBJECT_META),
    2: _Field("spec", "message", {1: _Field("namespace", "string")}),
}

# (apiVersion, kind) → message; DeleteOptions is registered in every group version.
_KINDS = {("v1", "Namespace"): _NAMESPACE, ("v1", "Secret"): _SECRET,
          ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): _ACCESS_REVIEW,
          ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): _RULES_REVIEW}
_ANY_VERSION = {"DeleteOptions": _DELETE_OPTIONS}
# Kinds whose objects can be written in protobuf.
READABLE_KINDS = frozenset(kind for _, kind in _KINDS)


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf request body.

    Raises ProtobufError for a malformed body and UnsupportedKind for a kind
    whose message is not described here.
    """
    if not body.startswith(_MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic number")
    type_meta: dict[str, Any] = {}
    raw, encoding, content_type = b"", "", ""
    for number, _, value in _fields(body[len(_MAGIC):]):
        if number == 1:
            type_meta = _message(_bytes(value), _TYPE_META)
        elif number == 2:
            raw = _bytes(value)
        elif number == 3:
            encoding = _text(value)
        elif number == 4:
            content_type = _text(value)
    if encoding or content_type not in ("", MEDIA_TYPE):
        raise ProtobufError("the envelope carries an encoding or content type that is not "
                            "plain protobuf")
    api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
    message = _KINDS.get((api_version, kind)) or _ANY_VERSION.get(kind)
    if message is None:
        raise UnsupportedKind(api_version, kind)
    obj = _message(raw, message)
    return {"apiVersion": api_version, "kind": kind, **obj}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 64:
            raise ProtobufError("varint longer than 64 bits")


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field of one message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ProtobufError("field number 0")
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ProtobufError("length-delimited field runs past the end")
            yield number, wire, data[pos:pos + length]
            pos += length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > len(data):
                raise ProtobufError("fixed-width field runs past the end")
            yield number, wire, int.from_bytes(data[pos:pos + size], "little")
            pos += size
        else:
            raise ProtobufError(f"unsupported wire type {wire}")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise ProtobufError("a string field is not length-delimited")
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise ProtobufError("a string field is not UTF-8") from None


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise ProtobufError("a bytes or message field is not length-delimited")
    return value


def _number(value: int | bytes) -> int:
    if isinstance(value, bytes):
        raise ProtobufError("a numeric field is length-delimited")
    return value


def _time(data: bytes) -> str | None:
    seconds = nanos = 0
    for number, _, value in _fields(data):
        if number == 1:
            seconds = _signed(_number(value))
        elif number == 2:
            nanos = _signed(_number(value))
    if seconds == 0 and nanos == 0:
        return None  # Go's zero Time: the member is null, so it is left out
    try:
        when = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        raise ProtobufError("a timestamp is out of range") from None
    # meta/v1 Time marshals to whole seconds in RFC 3339.
    return timestamps.format_time(when, precision="seconds")


def _entry(data: bytes, *, binary: bool) -> tuple[str, str]:
    key, value = "", b""
    for number, _, field in _fields(data):
        if number == 1:
            key = _text(field)
        elif number == 2:
            value = _bytes(field)
    if binary:
        return key, base64.b64encode(value).decode()
    try:
        return key, value.decode()
    except UnicodeDecodeError:
        raise ProtobufError("a string map value is not UTF-8") from None


def _scalar(spec: _Field, value: int | bytes) -> Any:
    if spec.kind == "string":
        return _text(value)
    if spec.kind == "int":
        return _signed(_number(value))
    if spec.kind == "bool":
        return bool(_number(value))
    if spec.kind == "time":
        return _time(_bytes(value))
    assert spec.message is not None
    return _message(_bytes(value), spec.message)


def _message(data: bytes, fields: Mapping[int, _Field]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, _, value in _fields(data):
        spec = fields.get(number)
        if spec is None:
            continue  # a field this reader does not know: skipped, as protobuf does
        if spec.kind in ("map", "bytesmap"):
            key, item = _entry(_bytes(value), binary=spec.kind == "bytesmap")
            out.setdefault(spec.name, {})[key] = item
        elif spec.kind == "strings":
            out.setdefault(spec.name, []).append(_text(value))
        elif spec.kind == "messages":
            assert spec.message is not None
            out.setdefault(spec.name, []).append(_message(_bytes(value), spec.message))
        else:
            result = _scalar(spec, value)
            if result is None or (not spec.keep and result in ("", 0, False, {})):
                out.pop(spec.name, None)
            else:
                out[spec.name] = result
    return out
