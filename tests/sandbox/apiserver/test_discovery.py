"""Discovery, OpenAPI and server-side Table rendering, as kubectl reads them."""

from __future__ import annotations

import datetime

import httpx
import pytest
import trio

from egressd.sandbox.apiserver import FakeApiServer
from egressd.sandbox.apiserver.table import human_duration
from tests.fixtures.apiserver import make_client
from tests.sandbox.apiserver.support import ALL_PROXIES, MERGE, PROXIES, proxy, watch

TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}


async def test_version_and_group_discovery(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        assert (await api_client.get("/version")).json()["minor"] == "32"
        assert (await api_client.get("/api")).json()["versions"] == ["v1"]
        groups = {g["name"] for g in (await api_client.get("/apis")).json()["groups"]}
        assert {"crawl.example.com", "coordination.k8s.io", "apiextensions.k8s.io"} <= groups
        group = (await api_client.get("/apis/crawl.example.com")).json()
        assert group["preferredVersion"]["version"] == "v1alpha1"
        resources = {r["name"]: r for r in (await api_client.get(
            "/apis/crawl.example.com/v1alpha1")).json()["resources"]}
        assert resources["proxies"]["shortNames"] == ["px"]
        assert resources["proxies"]["namespaced"] is True
        assert "watch" in resources["proxies"]["verbs"]
        assert resources["proxies/status"]["verbs"] == ["get", "patch", "update"]
        core = {r["name"] for r in (await api_client.get("/api/v1")).json()["resources"]}
        assert {"pods", "pods/status", "secrets", "namespaces", "events"} <= core
        assert (await api_client.get("/apis/nope.example/v1")).status_code == 404
        # An unserved API is a 404 for every verb.
        unserved = await api_client.post("/apis/policy/v1/poddisruptionbudgets", json={})
        assert unserved.status_code == 404 and unserved.json()["reason"] == "NotFound"
        # A served review without attributes is a 400 (kubectl auth can-i sends them).
        review = await api_client.post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json={})
        assert review.status_code == 400 and review.json()["reason"] == "BadRequest"
        assert (await api_client.post("/apis", json={})).status_code == 405


async def test_openapi_v3_tells_kubectl_about_field_validation(
        api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        index = (await api_client.get("/openapi/v3")).json()["paths"]
        url = index["apis/crawl.example.com/v1alpha1"]["serverRelativeURL"]
        doc = (await api_client.get(url)).json()
        base = "/apis/crawl.example.com/v1alpha1"
        item = doc["paths"][f"{base}/namespaces/{{namespace}}/proxies/{{name}}"]
        assert item["patch"]["x-kubernetes-group-version-kind"]["kind"] == "Proxy"
        assert "fieldValidation" in {p["name"] for p in item["patch"]["parameters"]}
        schema = doc["components"]["schemas"]["com.example.crawl.v1alpha1.Proxy"]
        assert "spec" in schema["properties"]


async def test_table_rendering_with_printer_columns(nursery: trio.Nursery) -> None:
    created_at = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    clock = {"now": created_at}
    server = FakeApiServer(now=lambda: clock["now"])
    await nursery.start(server.serve)
    with trio.fail_after(10):
        async with make_client(server) as client:
            await client.post(PROXIES, json=proxy("a"))
            await client.patch(f"{PROXIES}/a/status", headers=MERGE, json={"status": {
                "phase": "Ready", "host": "192.0.2.1", "port": 3128, "latencyMs": 9,
                "conditions": [{"type": "Provisioned", "status": "True", "reason": "External",
                                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                               {"type": "Healthy", "status": "False", "reason": "ProbeFailed",
                                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
            clock["now"] = created_at + datetime.timedelta(minutes=5)
            result = (await client.get(ALL_PROXIES, headers=TABLE)).json()
            assert result["kind"] == "Table"
            assert [c["name"] for c in result["columnDefinitions"]] == [
                "Name", "Mode", "Phase", "Host", "Port", "Healthy", "Latency", "Age",
                "Provider-ID", "IP"]  # the last two are priority 1: kubectl -o wide only
            row = result["rows"][0]
            assert row["cells"] == ["a", "External", "Ready", "192.0.2.1", 3128, "False", 9, "5m",
                                    None, None]
            assert row["object"]["kind"] == "PartialObjectMetadata"
            assert row["object"]["metadata"]["namespace"] == "default"
            one = (await client.get(f"{PROXIES}/a", headers=TABLE,
                                    params={"includeObject": "Object"})).json()
            assert one["rows"][0]["object"]["spec"]["mode"] == "External"
            async with watch(client, ALL_PROXIES, headers=TABLE, resourceVersion="0") as events:
                event = await events.next()
            assert event["type"] == "ADDED" and event["object"]["kind"] == "Table"
            assert event["object"]["rows"][0]["cells"][0] == "a"


async def test_builtin_tables(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        result = (await api_client.get("/api/v1/namespaces", headers=TABLE)).json()
        assert [c["name"] for c in result["columnDefinitions"]] == ["Name", "Status", "Age"]
        assert result["rows"][0]["cells"][:2] == ["default", "Active"]


@pytest.mark.parametrize(("seconds", "text"), [
    (-5, "<invalid>"), (-0.5, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (150, "2m30s"),
    (600, "10m"), (3 * 3600 - 1, "179m"), (3 * 3600, "3h"), (7 * 3600 + 60, "7h1m"),
    (30 * 3600, "30h"), (50 * 3600, "2d2h"), (8 * 86400, "8d"), (800 * 86400, "2y70d"),
    (9 * 365 * 86400, "9y"),
])
def test_human_duration(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text
