"""Watch semantics: resume from a resourceVersion, 410 Expired, bookmarks, timeouts, selectors."""

from __future__ import annotations

import httpx
import pytest
import trio

from egressd.sandbox.apiserver import FakeApiServer
from tests.fixtures.apiserver import make_client
from tests.sandbox.apiserver.support import (
    ALL_PROXIES,
    EVENTS,
    MERGE,
    PROXIES,
    created,
    proxy,
    watch,
)


async def test_watch_without_version_starts_with_the_current_objects(
        apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        await created(api_client, PROXIES, proxy("b"))
        for rv in ("", "0"):
            async with watch(api_client, ALL_PROXIES, resourceVersion=rv) as events:
                got = [await events.next(), await events.next()]
            assert [(e["type"], e["object"]["metadata"]["name"]) for e in got] == [
                ("ADDED", "a"), ("ADDED", "b")]


async def test_resume_replays_only_later_events(apiserver: FakeApiServer,
                                                api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        a = await created(api_client, PROXIES, proxy("a"))
        await api_client.patch(f"{PROXIES}/a", headers=MERGE, json={"spec": {"port": 1}})
        await created(api_client, PROXIES, proxy("b"))
        async with watch(api_client, ALL_PROXIES,
                         resourceVersion=a["metadata"]["resourceVersion"]) as events:
            got = [await events.next(), await events.next()]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in got] == [
            ("MODIFIED", "a"), ("ADDED", "b")]
        assert got[0]["object"]["spec"]["port"] == 1


async def test_too_old_version_is_410_expired(apiserver: FakeApiServer,
                                              api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        a = await created(api_client, PROXIES, proxy("a"))
        await created(api_client, PROXIES, proxy("b"))
        apiserver.compact()
        async with watch(api_client, ALL_PROXIES,
                         resourceVersion=a["metadata"]["resourceVersion"]) as events:
            rest = await events.rest()
        assert len(rest) == 1 and rest[0]["type"] == "ERROR"
        status = rest[0]["object"]
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
        response = await api_client.get(ALL_PROXIES, params={
            "resourceVersion": a["metadata"]["resourceVersion"],
            "resourceVersionMatch": "Exact"})
        assert response.status_code == 410 and response.json()["reason"] == "Expired"


async def test_history_is_bounded(nursery: trio.Nursery) -> None:
    server = FakeApiServer(history_limit=3)
    await nursery.start(server.serve)
    with trio.fail_after(10):
        async with make_client(server) as client:
            first = await created(client, PROXIES, proxy("p0"))
            for i in range(1, 5):
                await created(client, PROXIES, proxy(f"p{i}"))
            async with watch(client, ALL_PROXIES,
                             resourceVersion=first["metadata"]["resourceVersion"]) as events:
                assert (await events.next())["object"]["reason"] == "Expired"
            recent = server.resource_version - 2
            async with watch(client, ALL_PROXIES, resourceVersion=recent) as events:
                got = [await events.next(), await events.next()]
            assert [e["object"]["metadata"]["name"] for e in got] == ["p3", "p4"]


async def test_timeout_seconds_ends_the_stream(autojump_clock: trio.abc.Clock,
                                               api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(100):
        start = trio.current_time()
        async with watch(api_client, ALL_PROXIES, resourceVersion="0",
                         timeoutSeconds=30) as events:
            assert await events.rest() == []
        assert trio.current_time() - start == pytest.approx(30, abs=1)


async def test_no_timeout_means_no_server_side_cut(autojump_clock: trio.abc.Clock,
                                                   apiserver: FakeApiServer,
                                                   api_client: httpx.AsyncClient) -> None:
    async with watch(api_client, ALL_PROXIES, resourceVersion="0") as events:
        with trio.move_on_after(3 * 3600) as idle:
            await events.next()
        assert idle.cancelled_caught
        assert apiserver.watch_count("proxies") == 1


async def test_bookmarks_only_when_asked(autojump_clock: trio.abc.Clock,
                                         apiserver: FakeApiServer,
                                         api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(1000):
        await created(api_client, PROXIES, proxy("a"))
        async with watch(api_client, ALL_PROXIES, resourceVersion="0",
                         allowWatchBookmarks=True) as events:
            assert (await events.next())["type"] == "ADDED"
            bookmark = await events.next()
        assert bookmark["type"] == "BOOKMARK"
        assert bookmark["object"]["kind"] == "Proxy"
        assert bookmark["object"]["metadata"]["resourceVersion"] == str(
            apiserver.resource_version)
        async with watch(api_client, ALL_PROXIES, resourceVersion="0",
                         timeoutSeconds=300) as events:
            rest = await events.rest()
        assert [e["type"] for e in rest] == ["ADDED"]


async def test_send_initial_events_ends_with_a_marked_bookmark(
        api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        async with watch(api_client, ALL_PROXIES, sendInitialEvents=True,
                         allowWatchBookmarks=True, resourceVersionMatch="NotOlderThan") as events:
            added, bookmark = await events.next(), await events.next()
        assert added["type"] == "ADDED"
        assert bookmark["type"] == "BOOKMARK"
        assert bookmark["object"]["metadata"]["annotations"] == {
            "k8s.io/initial-events-end": "true"}


async def test_label_selector_turns_leaving_into_deleted(apiserver: FakeApiServer,
                                                         api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        body = proxy("a")
        body["metadata"]["labels"] = {"tier": "gold"}
        await created(api_client, PROXIES, body)
        async with watch(api_client, ALL_PROXIES, resourceVersion="0",
                         labelSelector="tier=gold") as events:
            assert (await events.next())["type"] == "ADDED"
            await apiserver.wait_for_watchers("proxies")
            await api_client.patch(f"{PROXIES}/a", headers=MERGE,
                                   json={"metadata": {"labels": {"tier": "iron"}}})
            left = await events.next()
            await api_client.patch(f"{PROXIES}/a", headers=MERGE,
                                   json={"metadata": {"labels": {"tier": "gold"}}})
            back = await events.next()
        assert left["type"] == "DELETED" and back["type"] == "ADDED"


async def test_field_selector_on_name_and_single_object_watch(
        apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        await created(api_client, PROXIES, proxy("b"))
        async with watch(api_client, PROXIES, resourceVersion="0",
                         fieldSelector="metadata.name=b") as events:
            assert (await events.next())["object"]["metadata"]["name"] == "b"
            await apiserver.wait_for_watchers("proxies")
            await api_client.patch(f"{PROXIES}/a", headers=MERGE, json={"spec": {"port": 2}})
            await api_client.patch(f"{PROXIES}/b", headers=MERGE, json={"spec": {"port": 3}})
            modified = await events.next()
        assert modified["object"]["metadata"]["name"] == "b"
        assert modified["object"]["spec"]["port"] == 3


async def test_watch_ends_when_the_client_goes(apiserver: FakeApiServer,
                                               api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        async with watch(api_client, ALL_PROXIES, resourceVersion="0"):
            await apiserver.wait_for_watchers("proxies")
        # The client closed its stream: the server notices without any new event.
        while apiserver.watch_count("proxies"):
            await apiserver.store.wait_changed()


async def test_events_watch_by_involved_object(apiserver: FakeApiServer,
                                               api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        for name, target in (("e1", "a"), ("e2", "b")):
            await created(api_client, EVENTS, {
                "apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
                "involvedObject": {"kind": "Proxy", "name": target, "namespace": "default"},
                "reason": "Test", "message": "m", "type": "Normal"})
        response = await api_client.get(EVENTS, params={
            "fieldSelector": "involvedObject.name=b,involvedObject.kind=Proxy,"
                             "involvedObject.namespace=default"})
        assert [e["metadata"]["name"] for e in response.json()["items"]] == ["e2"]
