"""Fault injection: failing requests, cut watches, refused connections, token rotation."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from egressd.sandbox.apiserver import FakeApiServer
from tests.fixtures.apiserver import make_client
from tests.sandbox.apiserver.support import (
    ALL_PROXIES,
    PODS,
    PROXIES,
    created,
    proxy,
    watch,
)


@pytest.mark.parametrize(("code", "reason"), [(409, "Conflict"), (410, "Expired"),
                                              (500, "InternalError"),
                                              (503, "ServiceUnavailable")])
async def test_fail_next_answers_status_errors(apiserver: FakeApiServer,
                                               api_client: httpx.AsyncClient, code: int,
                                               reason: str) -> None:
    with trio.fail_after(10):
        rule = apiserver.faults.fail_next(2, code=code, method="GET", resource="proxies")
        for _ in range(2):
            response = await api_client.get(ALL_PROXIES)
            assert response.status_code == code
            assert response.json()["reason"] == reason
        assert (await api_client.get(ALL_PROXIES)).status_code == 200
        assert rule.hits == 2


async def test_429_carries_retry_after(apiserver: FakeApiServer,
                                       api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        apiserver.faults.fail_next(code=429, retry_after=7, path="/status")
        await created(api_client, PROXIES, proxy("a"))
        assert (await api_client.get(f"{PROXIES}/a")).status_code == 200
        response = await api_client.get(f"{PROXIES}/a/status")
        assert response.status_code == 429
        assert response.headers["Retry-After"] == "7"
        assert response.json()["details"]["retryAfterSeconds"] == 7


async def test_faults_match_by_resource_and_watch(apiserver: FakeApiServer,
                                                  api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        apiserver.faults.fail_next(code=410, resource="proxies", watch=True,
                                   as_watch_event=True)
        assert (await api_client.get(PODS)).status_code == 200
        assert (await api_client.get(ALL_PROXIES)).status_code == 200
        async with watch(api_client, ALL_PROXIES, resourceVersion="1") as events:
            rest = await events.rest()
        assert [(e["type"], e["object"]["code"]) for e in rest] == [("ERROR", 410)]


async def test_cut_watches_cleanly_and_abruptly(apiserver: FakeApiServer,
                                                api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        async with watch(api_client, ALL_PROXIES, resourceVersion="0") as events:
            await apiserver.wait_for_watchers("proxies")
            assert apiserver.faults.cut_watches("pods") == 0
            assert apiserver.faults.cut_watches("proxies") == 1
            assert await events.rest() == []
        async with watch(api_client, ALL_PROXIES, resourceVersion="0") as events:
            await apiserver.wait_for_watchers("proxies")
            apiserver.faults.cut_watches(abrupt=True)
            with pytest.raises(httpx.RemoteProtocolError):
                await events.rest()


async def test_drop_bookmarks(autojump_clock: trio.abc.Clock, apiserver: FakeApiServer,
                              api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(1000):
        apiserver.faults.drop_bookmarks = True
        async with watch(api_client, ALL_PROXIES, resourceVersion="0",
                         allowWatchBookmarks=True, timeoutSeconds=600) as events:
            assert await events.rest() == []


async def test_refuse_connections_for_a_while(mock_clock: trio.testing.MockClock,
                                              apiserver: FakeApiServer,
                                              api_client: httpx.AsyncClient) -> None:
    # The refusal runs on trio's clock: a mock clock that only moves when told makes
    # "still refused" and "listening again" exact, whatever the machine's speed.
    with trio.fail_after(60):
        async with watch(api_client, ALL_PROXIES, resourceVersion="0") as events:
            await apiserver.wait_for_watchers("proxies")
            apiserver.faults.refuse_connections(30)
            with pytest.raises(httpx.TransportError):
                await events.rest()
        async with make_client(apiserver) as fresh:
            with pytest.raises(httpx.ConnectError):
                await fresh.get(ALL_PROXIES)
            mock_clock.jump(29)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(httpx.ConnectError):
                await fresh.get(ALL_PROXIES)
            mock_clock.jump(1)
            await apiserver.accepting.wait()
            assert (await fresh.get(ALL_PROXIES)).status_code == 200


async def test_rotate_token(apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        old = apiserver.token
        new = apiserver.faults.rotate_token()
        assert new != old and apiserver.token == new
        assert (await api_client.get(ALL_PROXIES)).status_code == 401
        async with make_client(apiserver, token=new) as client:
            assert (await client.get(ALL_PROXIES)).status_code == 200


async def test_server_stops_at_once_when_cancelled() -> None:
    server = FakeApiServer()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            async with make_client(server) as client, watch(client, ALL_PROXIES,
                                                            resourceVersion="0"):
                await server.wait_for_watchers("proxies")
                nursery.cancel_scope.cancel()
