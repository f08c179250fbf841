"""Patch kinds: merge, JSON patch, strategic merge, server-side apply, and bad patches."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
import trio

from egressd.sandbox.apiserver.wire import MAX_BODY
from tests.sandbox.apiserver.support import (
    APPLY,
    EVENTS,
    JSON_PATCH,
    LEASES,
    MERGE,
    PODS,
    PROXIES,
    SECRETS,
    STRATEGIC,
    created,
    pod,
    proxy,
)


async def test_merge_patch_merges_and_null_deletes(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        body = proxy("a", attributes={"region": "eu", "tier": "x"})
        await created(api_client, PROXIES, body)
        response = await api_client.patch(f"{PROXIES}/a", headers=MERGE, json={
            "spec": {"attributes": {"tier": None, "zone": "b"}}})
        assert response.status_code == 200, response.text
        assert response.json()["spec"]["attributes"] == {"region": "eu", "zone": "b"}
        assert response.json()["metadata"]["generation"] == 2


async def test_json_patch_and_a_failed_test_op(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        ok = await api_client.patch(f"{PROXIES}/a", headers=JSON_PATCH, json=[
            {"op": "test", "path": "/spec/port", "value": 3128},
            {"op": "replace", "path": "/spec/port", "value": 8080}])
        assert ok.status_code == 200 and ok.json()["spec"]["port"] == 8080
        failed = await api_client.patch(f"{PROXIES}/a", headers=JSON_PATCH, json=[
            {"op": "test", "path": "/spec/port", "value": 3128},
            {"op": "replace", "path": "/spec/port", "value": 9090}])
        assert failed.status_code == 422
        assert failed.json()["kind"] == "Status" and failed.json()["reason"] == "Invalid"
        assert failed.json()["details"]["causes"] == [{
            "reason": "UnexpectedServerResponse",
            "message": "testing value /spec/port failed: test failed"}]
        missing = await api_client.patch(f"{PROXIES}/a", headers=JSON_PATCH, json=[
            {"op": "remove", "path": "/spec/nothing/here"}])
        assert missing.status_code == 422
        assert (await api_client.get(f"{PROXIES}/a")).json()["spec"]["port"] == 8080


async def test_stale_resource_version_in_a_patch_is_409(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, PROXIES, proxy("a"))
        rv = obj["metadata"]["resourceVersion"]
        ok = await api_client.patch(f"{PROXIES}/a", headers=MERGE, json={
            "metadata": {"resourceVersion": rv}, "spec": {"port": 1}})
        assert ok.status_code == 200
        stale = await api_client.patch(f"{PROXIES}/a", headers=MERGE, json={
            "metadata": {"resourceVersion": rv}, "spec": {"port": 2}})
        assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
        assert "the object has been modified" in stale.json()["message"]


async def test_patch_content_types(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        strategic = await api_client.patch(f"{PROXIES}/a", headers=STRATEGIC,
                                           json={"spec": {"port": 1}})
        assert strategic.status_code == 415
        assert strategic.json()["reason"] == "UnsupportedMediaType"
        assert "application/strategic-merge-patch+json" not in strategic.json()["message"]
        odd = await api_client.patch(f"{PROXIES}/a", headers={"Content-Type": "text/plain"},
                                     content=b"port=1")
        assert odd.status_code == 415


async def test_strategic_merge_on_pods_merges_lists_by_key(
        api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        body = pod("p")
        body["metadata"]["finalizers"] = ["a/one"]
        await created(api_client, PODS, body)
        response = await api_client.patch(f"{PODS}/p", headers=STRATEGIC, json={
            "metadata": {"finalizers": ["b/two"], "labels": {"x": "y"}},
            "spec": {"containers": [{"name": "squid", "image": "squid:7"}]}})
        assert response.status_code == 200, response.text
        obj = response.json()
        assert obj["metadata"]["finalizers"] == ["a/one", "b/two"]
        assert obj["spec"]["containers"] == [{"name": "squid", "image": "squid:7"}]
        status = await api_client.patch(f"{PODS}/p/status", headers=STRATEGIC, json={
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        status = await api_client.patch(f"{PODS}/p/status", headers=STRATEGIC, json={
            "status": {"conditions": [{"type": "Initialized", "status": "True"}]}})
        assert [c["type"] for c in status.json()["status"]["conditions"]] == [
            "Ready", "Initialized"]
        removed = await api_client.patch(f"{PODS}/p", headers=STRATEGIC, json={
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["a/one"]}})
        assert removed.json()["metadata"]["finalizers"] == ["b/two"]


async def test_server_side_apply_creates_then_merges(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        manifest = ("apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
                    "metadata: {name: s}\nspec:\n  mode: External\n"
                    "  endpoint: {host: 192.0.2.9, port: 3128}\n")
        params = {"fieldManager": "tester"}
        first = await api_client.patch(f"{PROXIES}/s", headers=APPLY, params=params,
                                       content=manifest.encode())
        assert first.status_code == 201, first.text
        second = await api_client.patch(f"{PROXIES}/s", headers=APPLY, params=params,
                                        content=manifest.replace("3128", "8080").encode())
        assert second.status_code == 200
        assert second.json()["spec"]["endpoint"]["port"] == 8080
        assert second.json()["metadata"]["uid"] == first.json()["metadata"]["uid"]
        no_manager = await api_client.patch(f"{PROXIES}/s", headers=APPLY,
                                            content=manifest.encode())
        assert no_manager.status_code == 400


@pytest.mark.parametrize(("headers", "content"), [
    (MERGE, b"{not json"),
    (MERGE, b"[1, 2]"),
    (JSON_PATCH, b'{"op": "add"}'),
    (JSON_PATCH, b'[{"op": "frobnicate", "path": "/spec"}]'),
    (APPLY, b"- just\n- a list\n"),
    (APPLY, b"key: [unclosed"),
    (MERGE, b"\xff\xfe"),
])
async def test_malformed_patches_are_400s(api_client: httpx.AsyncClient,
                                          headers: dict[str, str], content: bytes) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        response = await api_client.patch(f"{PROXIES}/a", headers=headers, content=content,
                                          params={"fieldManager": "t"})
        assert response.status_code == 400, response.text
        assert response.json()["kind"] == "Status"
        assert (await api_client.get(f"{PROXIES}/a")).status_code == 200


@pytest.mark.parametrize("content", [b"", b"{", b"[]", b'"x"', b'{"metadata": 5}',
                                     b'{"kind": "Pod", "metadata": {"name": "x"}}',
                                     b'{"apiVersion": "v9", "metadata": {"name": "x"}}'])
async def test_malformed_bodies_are_400s(api_client: httpx.AsyncClient, content: bytes) -> None:
    with trio.fail_after(10):
        response = await api_client.post(PROXIES, content=content,
                                         headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        assert response.json()["reason"] == "BadRequest"
        assert (await api_client.get(PROXIES)).status_code == 200


async def test_patch_of_a_missing_object_is_404(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        response = await api_client.patch(f"{PROXIES}/nope", headers=MERGE, json={})
        assert response.status_code == 404 and response.json()["reason"] == "NotFound"


async def test_bodies_in_yaml_are_taken_and_cbor_is_415(
        api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        yaml_body = b"apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n"
        response = await api_client.post("/api/v1/namespaces", content=yaml_body,
                                         headers={"Content-Type": "application/yaml"})
        assert response.status_code == 201, response.text
        response = await api_client.post("/api/v1/namespaces", content=b"\xa0",
                                         headers={"Content-Type": "application/cbor"})
        assert response.status_code == 415
        assert response.json()["reason"] == "UnsupportedMediaType"


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    *parents, key = path.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    node[key] = value
    return out


_SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}
_LEASE = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}}
_EVENT = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}}


@pytest.mark.parametrize(("collection", "body"), [
    (PROXIES, _with(proxy("a"), "metadata.labels", 5)),
    (PROXIES, _with(proxy("a"), "metadata.labels", {"tier": 5})),
    (PROXIES, _with(proxy("a"), "metadata.name", 5)),
    (PROXIES, _with(proxy("a"), "metadata.finalizers", [1])),
    (PROXIES, _with(proxy("a"), "metadata.annotations", ["x"])),
    (PODS, _with(pod("p"), "spec", "x")),
    (PODS, _with(pod("p"), "spec.containers", 5)),
    (SECRETS, _with(_SECRET, "data", {"a": 5})),
    (SECRETS, _with(_SECRET, "type", 5)),
    (LEASES, _with(_LEASE, "spec.leaseDurationSeconds", "15")),
    (EVENTS, _with(_EVENT, "involvedObject", "x")),
])
async def test_a_field_of_the_wrong_type_is_400_and_stores_nothing(
        api_client: httpx.AsyncClient, collection: str, body: dict[str, Any]) -> None:
    with trio.fail_after(10):
        response = await api_client.post(collection, json=body)
        assert response.status_code == 400, response.text
        assert "cannot be handled as a" in response.json()["message"]
        listed = await api_client.get(collection, params={"labelSelector": "tier!=gold"})
        assert listed.status_code == 200 and listed.json()["items"] == []


async def test_a_patch_to_a_wrong_type_is_400(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        response = await api_client.patch(f"{PROXIES}/a", headers=MERGE,
                                          json={"metadata": {"labels": ["x"]}})
        assert response.status_code == 400, response.text
        nulled = await api_client.patch(f"{PROXIES}/a", headers=JSON_PATCH,
                                        json=[{"op": "add", "path": "/metadata/labels",
                                               "value": None}])
        assert nulled.status_code == 200, nulled.text  # null is "unset", as in Go
        assert "labels" not in nulled.json()["metadata"]
        listed = await api_client.get(PROXIES, params={"labelSelector": "tier"})
        assert listed.status_code == 200


async def test_a_body_over_the_limit_is_413_status(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        response = await api_client.post(PROXIES, content=b" " * (MAX_BODY + 10),
                                         headers={"Content-Type": "application/json"})
        assert response.status_code == 413
        assert response.json()["reason"] == "RequestEntityTooLarge"
        assert (await api_client.get(PROXIES)).status_code == 200
