"""serve_app: bound addresses from nursery.start, and a graceful stop on cancellation."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from egressd.http.common import json_response, new_app
from egressd.http.serve import serve_app


def slow_app(entered: trio.Event, release: trio.Event):  # type: ignore[no-untyped-def]
    app = new_app("test.slow")

    @app.get("/slow")
    async def slow():  # type: ignore[no-untyped-def]
        entered.set()
        await release.wait()
        return json_response({"done": True})

    return app


async def test_cancel_lets_in_flight_requests_finish() -> None:
    entered, release = trio.Event(), trio.Event()
    results: list[httpx.Response] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as outer:
            server = trio.CancelScope()

            async def run_server(task_status: trio.TaskStatus[list[str]]) -> None:
                with server:
                    await serve_app(slow_app(entered, release), "127.0.0.1:0", grace=5,
                                    task_status=task_status)

            urls = await outer.start(run_server)
            assert urls[0].startswith("http://127.0.0.1:") and not urls[0].endswith(":0")
            async with httpx.AsyncClient(base_url=urls[0]) as client:

                async def request() -> None:
                    results.append(await client.get("/slow"))

                async with trio.open_nursery() as requests:
                    requests.start_soon(request)
                    await entered.wait()
                    server.cancel()  # stop while the request is in flight
                    await trio.testing.wait_all_tasks_blocked()
                    # No longer accepting new connections.
                    with pytest.raises(httpx.ConnectError):
                        async with httpx.AsyncClient(base_url=urls[0]) as other:
                            await other.get("/slow")
                    release.set()
    assert [r.status_code for r in results] == [200]
    assert results[0].json() == {"done": True}


async def test_grace_bounds_the_stop() -> None:
    entered, never = trio.Event(), trio.Event()
    stopped = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as outer:
            server = trio.CancelScope()

            async def run_server(task_status: trio.TaskStatus[list[str]]) -> None:
                with server:
                    await serve_app(slow_app(entered, never), "127.0.0.1:0", grace=0.2,
                                    task_status=task_status)
                stopped.set()

            urls = await outer.start(run_server)
            async with httpx.AsyncClient(base_url=urls[0]) as client:

                async def request() -> None:
                    # The handler never finishes: after the grace the connection is cut.
                    with pytest.raises(httpx.RemoteProtocolError):
                        await client.get("/slow")

                async with trio.open_nursery() as requests:
                    requests.start_soon(request)
                    await entered.wait()
                    server.cancel()
            await stopped.wait()
