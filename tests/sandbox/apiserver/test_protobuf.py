"""Protobuf request bodies as client-go's typed clients send them (kubectl create ns/secret).

The first two bodies are byte for byte what kubectl 1.32.4 sent (its -v=8
dump); the others are built with a small encoder of the same wire format.
"""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from egressd.sandbox.apiserver.protobuf import ProtobufError, UnsupportedKind, decode
from tests.sandbox.apiserver.support import PODS, PROXIES, SECRETS, created, pod, proxy

PROTOBUF = {"Content-Type": "application/vnd.kubernetes.protobuf",
            "Accept": "application/vnd.kubernetes.protobuf,application/json"}

# `kubectl create namespace foo`
KUBECTL_NAMESPACE = bytes.fromhex(
    "6b3873000a0f0a02763112094e616d657370616365121b0a130a03666f6f12001a00"
    "22002a0032003800420012001a020a001a002200")
# `kubectl create secret generic s1 --from-literal=user=bob --from-file=pw=<hunter2>`
KUBECTL_SECRET = bytes.fromhex(
    "6b3873000a0c0a02763112065365637265741238"
    "0a120a02733112001a0022002a0032003800420012"
    "0d0a027077120768756e74657232120b0a04757365721203626f621a064f70617175651a002200")


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def entry(number: int, key: str, value: str | bytes) -> bytes:
    return field(number, field(1, key) + field(2, value))


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    return b"k8s\x00" + field(1, field(1, api_version) + field(2, kind)) + field(2, raw)


def test_kubectls_own_bytes_decode() -> None:
    assert decode(KUBECTL_NAMESPACE) == {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": "foo"}}
    assert decode(KUBECTL_SECRET) == {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"},
        "data": {"pw": "aHVudGVyMg==", "user": "Ym9i"}, "type": "Opaque"}


def test_metadata_fields_decode_like_their_json() -> None:
    owner = (field(5, "v1") + field(1, "Pod") + field(3, "p") + field(4, "u-1")
             + field(6, 1))
    meta = (field(1, "s") + field(3, "team") + field(7, 0) + field(8, field(1, 1767225600))
            + field(10, -1) + entry(11, "tier", "gold") + entry(11, "zone", "b")
            + entry(12, "note", "x") + field(13, owner) + field(14, "a/b") + field(14, "c/d")
            + field(99, "from a newer version"))
    body = envelope("v1", "Secret", field(1, meta) + entry(4, "k", "v") + field(5, 0))
    assert decode(body) == {"apiVersion": "v1", "kind": "Secret", "metadata": {
        "name": "s", "namespace": "team", "creationTimestamp": "2026-01-01T00:00:00Z",
        "deletionGracePeriodSeconds": -1, "labels": {"tier": "gold", "zone": "b"},
        "annotations": {"note": "x"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-1",
                             "controller": True}],
        "finalizers": ["a/b", "c/d"]}, "stringData": {"k": "v"}, "immutable": False}


def test_delete_options_decode_from_any_group_version() -> None:
    body = envelope("meta.k8s.io/v1", "DeleteOptions",
                    field(2, field(1, "u-1")) + field(4, "Foreground") + field(5, "All"))
    assert decode(body) == {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions",
                            "preconditions": {"uid": "u-1"}, "propagationPolicy": "Foreground",
                            "dryRun": ["All"]}


@pytest.mark.parametrize("body", [
    b"", b"{}", b"k8s\x00\n\x0f", b"k8s\x00\x0a\x05ab", b"k8s\x00\xff\xff\xff\xff\xff\xff\xff"
    b"\xff\xff\xff\x01", b"k8s\x00\x0b", b"k8s\x00\x10\x01",
    envelope("v1", "Secret", field(1, field(1, b"\xff\xfe"))),
    envelope("v1", "Secret", field(1, 7)),
    b"k8s\x00" + field(1, field(1, "v1") + field(2, "Secret")) + field(3, "gzip"),
])
def test_malformed_bodies_raise_protobuf_error(body: bytes) -> None:
    with pytest.raises(ProtobufError):
        decode(body)


def test_other_kinds_are_unsupported() -> None:
    with pytest.raises(UnsupportedKind):
        decode(envelope("v1", "Pod", field(1, field(1, "p"))))


async def test_typed_client_creates_over_http(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        response = await api_client.post("/api/v1/namespaces", content=KUBECTL_NAMESPACE,
                                         headers=PROTOBUF, params={"fieldManager": "kubectl"})
        assert response.status_code == 201, response.text
        assert response.headers["content-type"] == "application/json"
        assert response.json()["status"]["phase"] == "Active"
        response = await api_client.post(SECRETS, content=KUBECTL_SECRET, headers=PROTOBUF)
        assert response.status_code == 201, response.text
        assert response.json()["data"] == {"pw": "aHVudGVyMg==", "user": "Ym9i"}
        again = await api_client.post(SECRETS, content=KUBECTL_SECRET, headers=PROTOBUF)
        assert again.status_code == 409 and again.json()["reason"] == "AlreadyExists"


async def test_protobuf_delete_options_are_honoured(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, PROXIES, proxy("a"))
        stale = envelope("v1", "DeleteOptions", field(2, field(1, "not-the-uid")))
        response = await api_client.request("DELETE", f"{PROXIES}/a", content=stale,
                                            headers=PROTOBUF)
        assert response.status_code == 409, response.text
        right = envelope("v1", "DeleteOptions", field(2, field(1, obj["metadata"]["uid"])))
        response = await api_client.request("DELETE", f"{PROXIES}/a", content=right,
                                            headers=PROTOBUF)
        assert response.status_code == 200, response.text


async def test_bad_protobuf_bodies_are_400_or_415(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        truncated = await api_client.post("/api/v1/namespaces", content=b"k8s\x00\n\x0f",
                                          headers=PROTOBUF)
        assert truncated.status_code == 400 and truncated.json()["reason"] == "BadRequest"
        wrong_kind = await api_client.post("/api/v1/namespaces", content=KUBECTL_SECRET,
                                           headers=PROTOBUF)
        assert wrong_kind.status_code == 400
        pod_body = envelope("v1", "Pod", field(1, field(1, "p")))
        unknown = await api_client.post(PODS, content=pod_body, headers=PROTOBUF)
        assert unknown.status_code == 415
        assert unknown.json()["reason"] == "UnsupportedMediaType"
        assert "protobuf" not in unknown.json()["message"]
        cbor = await api_client.post(SECRETS, content=b"\xa0",
                                     headers={"Content-Type": "application/cbor"})
        assert cbor.status_code == 415
        assert "application/vnd.kubernetes.protobuf" in cbor.json()["message"]
        assert (await api_client.get(PODS)).json()["items"] == []
        await created(api_client, PODS, pod("p"))  # the server is still fine


@settings(max_examples=300, deadline=None, database=None)
@given(tail=st.binary(max_size=64), kind=st.sampled_from(["Secret", "Namespace", "DeleteOptions"]))
def test_any_bytes_decode_or_raise_protobuf_error(tail: bytes, kind: str) -> None:
    for body in (b"k8s\x00" + tail, envelope("v1", kind, tail)):
        try:
            result = decode(body)
        except (ProtobufError, UnsupportedKind):
            continue
        assert isinstance(result, dict)
        json.dumps(result)  # plain JSON values only, as the write pipeline expects
