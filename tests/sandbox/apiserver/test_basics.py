"""The fake API server's core verbs over real HTTPS: create, get, list, update, watch, status."""

from __future__ import annotations

import httpx
import trio

from egressd.sandbox.apiserver import FakeApiServer
from tests.fixtures.apiserver import make_client
from tests.sandbox.apiserver.support import (
    ALL_PROXIES,
    MERGE,
    PODS,
    PROXIES,
    SECRETS,
    created,
    pod,
    proxy,
    watch,
)


async def test_create_get_list_and_metadata(apiserver: FakeApiServer,
                                            api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, PROXIES, proxy("a"))
        meta = obj["metadata"]
        assert meta["namespace"] == "default"
        assert meta["generation"] == 1
        assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
        got = (await api_client.get(f"{PROXIES}/a")).json()
        assert got == obj
        listed = (await api_client.get(ALL_PROXIES)).json()
        assert listed["kind"] == "ProxyList"
        assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
        assert int(listed["metadata"]["resourceVersion"]) >= int(meta["resourceVersion"])


async def test_resource_version_is_one_global_counter(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        a = await created(api_client, PROXIES, proxy("a"))
        p = await created(api_client, PODS, pod("p"))
        b = await created(api_client, PROXIES, proxy("b"))
        versions = [int(o["metadata"]["resourceVersion"]) for o in (a, p, b)]
        assert versions == sorted(versions) and len(set(versions)) == 3


async def test_create_existing_is_409_already_exists(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        response = await api_client.post(PROXIES, json=proxy("a"))
        assert response.status_code == 409
        status = response.json()
        assert status["kind"] == "Status" and status["reason"] == "AlreadyExists"
        assert status["message"] == 'proxies.crawl.example.com "a" already exists'


async def test_get_missing_is_404_status(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        response = await api_client.get(f"{PROXIES}/nope")
        assert response.status_code == 404
        assert response.json()["reason"] == "NotFound"
        assert response.json()["message"] == 'proxies.crawl.example.com "nope" not found'


async def test_token_is_required(apiserver: FakeApiServer) -> None:
    with trio.fail_after(10):
        async with make_client(apiserver, token="wrong") as client:
            response = await client.get(ALL_PROXIES)
        assert response.status_code == 401
        assert response.json()["reason"] == "Unauthorized"


async def test_update_bumps_generation_only_on_spec_change(
        api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, PROXIES, proxy("a"))
        obj["metadata"]["labels"] = {"tier": "x"}
        relabelled = (await api_client.put(f"{PROXIES}/a", json=obj)).json()
        assert relabelled["metadata"]["generation"] == 1
        relabelled["spec"]["port"] = 8080
        changed = (await api_client.put(f"{PROXIES}/a", json=relabelled)).json()
        assert changed["metadata"]["generation"] == 2
        # A stale resourceVersion is a 409 Conflict.
        response = await api_client.put(f"{PROXIES}/a", json=relabelled)
        assert response.status_code == 409
        assert response.json()["reason"] == "Conflict"


async def test_status_subresource_is_isolated_both_ways(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        body = proxy("a")
        body["status"] = {"phase": "Ready"}
        obj = await created(api_client, PROXIES, body)
        assert "status" not in obj  # create cannot set status
        # A status write changes status only.
        response = await api_client.patch(
            f"{PROXIES}/a/status", headers=MERGE,
            json={"spec": {"port": 1}, "metadata": {"labels": {"x": "y"}},
                  "status": {"phase": "Ready"}})
        assert response.status_code == 200, response.text
        after = response.json()
        assert after["status"] == {"phase": "Ready"}
        assert after["spec"]["port"] == 3128 and "labels" not in after["metadata"]
        assert after["metadata"]["generation"] == 1
        # A main-resource write ignores status.
        response = await api_client.patch(f"{PROXIES}/a", headers=MERGE,
                                          json={"status": {"phase": "Failed"}})
        assert response.json()["status"] == {"phase": "Ready"}


async def test_watch_sees_changes_after_the_list(apiserver: FakeApiServer,
                                                 api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        listed = (await api_client.get(ALL_PROXIES)).json()
        rv = listed["metadata"]["resourceVersion"]
        async with watch(api_client, ALL_PROXIES, resourceVersion=rv) as events:
            await apiserver.wait_for_watchers("proxies")
            await created(api_client, PROXIES, proxy("b"))
            await api_client.delete(f"{PROXIES}/a")
            first, second = await events.next(), await events.next()
        assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "b")
        assert (second["type"], second["object"]["metadata"]["name"]) == ("DELETED", "a")


async def test_secrets_fold_string_data(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, SECRETS, {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "data": {"a": "YQ=="}, "stringData": {"user-data": "#cloud-config\n"}})
        assert obj["data"] == {"a": "YQ==", "user-data": "I2Nsb3VkLWNvbmZpZwo="}
        assert "stringData" not in obj and obj["type"] == "Opaque"


async def test_pods_start_pending_and_have_a_status_subresource(
        api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, PODS, pod("p"))
        assert obj["status"]["phase"] == "Pending"
        assert obj["spec"]["restartPolicy"] == "Always"
        # The same manifest again (kubectl replace) gets the same defaults: no spec change.
        replaced = await api_client.put(f"{PODS}/p", json=pod("p"))
        assert replaced.status_code == 200, replaced.text
        response = await api_client.patch(f"{PODS}/p/status", headers=MERGE,
                                          json={"status": {"phase": "Running",
                                                           "podIP": "127.0.0.5"}})
        assert response.json()["status"]["podIP"] == "127.0.0.5"
