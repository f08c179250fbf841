"""The discovery API's middleware stack in its SPEC §7 order, seen from the wire.

Recovery is outermost, then the request log, then auth, then the 64 KiB body
cap: so an oversized unauthenticated body is a 401 without a byte of it read
(issue 19 item 4), every refused request is still logged once, and a crash is
logged as the 500 it became.
"""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from egressd.http.discovery import create_discovery_app
from egressd.http.middleware import BODY_TIMEOUT
from tests.http.support import TOKEN, MemorySource, discovery, make_proxy, make_store, running


def request_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, int | None]]:
    return [(r.method, r.path, r.status) for r in caplog.records  # type: ignore[attr-defined]
            if r.name == "egressd.http.middleware" and r.getMessage() == "request"]


async def test_order_recovery_log_cap_auth(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="egressd")
    app = create_discovery_app(MemorySource([make_proxy("a")]), store=make_store(),
                               default_ttl=300, max_ttl=3600, token=TOKEN)

    @app.get("/boom")
    async def boom() -> str:
        raise RuntimeError("kaboom")

    big = b"{" + b" " * (65 * 1024) + b"}"
    with trio.fail_after(10):
        async with running(app) as anonymous:
            # Auth before the body cap: no token, oversized body -> 401, not 413.
            r = await anonymous.post("/v1/leases", content=big)
            assert (r.status_code, r.json()["error"]) == (401, "unauthorized")
            r = await anonymous.post("/v1/leases", content=big,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
            assert (r.status_code, r.json()["error"]) == (413, "body_too_large")
            r = await anonymous.post("/v1/leases", json={})
            assert (r.status_code, r.json()["error"]) == (401, "unauthorized")
            r = await anonymous.get("/healthz")
            assert r.status_code == 200
            headers = {"Authorization": f"Bearer {TOKEN}"}
            r = await anonymous.get("/boom", headers=headers)
            assert r.json() == {"error": "internal_error", "message": "internal server error"}
    # The log sits outside cap and auth (refusals are logged) and inside recovery
    # (the crash is logged with the status the client got).
    assert request_lines(caplog) == [
        ("POST", "/v1/leases", 401), ("POST", "/v1/leases", 413), ("POST", "/v1/leases", 401),
        ("GET", "/healthz", 200),
        ("GET", "/boom", 500)]
    assert TOKEN not in caplog.text


async def test_a_trickled_body_times_out_with_408(clock: trio.testing.MockClock) -> None:
    with trio.fail_after(10 + BODY_TIMEOUT):  # the deadline moves with the jumps below
        async with discovery(MemorySource([make_proxy("a")])) as client:
            stream = await trio.open_tcp_stream(client.base_url.host, client.base_url.port or 0)
            async with stream:
                await stream.send_all(
                    b"POST /v1/leases HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n"
                    b"authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n{")
                await trio.testing.wait_all_tasks_blocked()
                clock.jump(BODY_TIMEOUT - 1)
                await trio.testing.wait_all_tasks_blocked()
                with trio.move_on_after(0.2) as early:  # no answer before the timeout
                    await stream.receive_some()
                assert early.cancelled_caught
                clock.jump(2)
                data = b""
                while b"}" not in data:
                    chunk = await stream.receive_some()
                    assert chunk, data
                    data += chunk
            assert data.startswith(b"HTTP/1.1 408 ")
            assert b'"error":"body_timeout"' in data
            # Nothing was leased.
            view = (await client.get("/v1/proxies")).json()["items"][0]
            assert view["activeLeases"] == 0


async def test_a_client_hanging_up_after_a_413_is_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The 413 is sent without reading the announced body; when the client hangs up at
    # once, Hypercorn's close can race the response's last (empty) write. That is the
    # client leaving, not a server fault: no error log, no traceback.
    caplog.set_level(logging.INFO, logger="egressd")
    with trio.fail_after(20):
        async with discovery(MemorySource([make_proxy("a")])) as client:
            for _ in range(30):
                stream = await trio.open_tcp_stream(client.base_url.host,
                                                    client.base_url.port or 0)
                async with stream:
                    await stream.send_all(b"POST /v1/leases HTTP/1.1\r\nhost: x\r\n"
                                          b"authorization: Bearer " + TOKEN.encode() +
                                          b"\r\ncontent-length: 99999999999\r\n\r\n")
                    data = b""
                    while not data.endswith(b"}"):
                        data += await stream.receive_some()
                    assert data.startswith(b"HTTP/1.1 413 ")
            await trio.testing.wait_all_tasks_blocked()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_the_request_log_never_shows_a_lease_id(caplog: pytest.LogCaptureFixture) -> None:
    # A lease id lets whoever has it release or report on the lease: keep it out of logs.
    caplog.set_level(logging.INFO, logger="egressd")
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a")])) as client:
            granted = await client.post("/v1/leases", json={})
            lease_id = granted.json()["leaseId"]
            r = await client.post(f"/v1/leases/{lease_id}/report", json={"result": "ok"})
            assert r.status_code == 204
            r = await client.delete(f"/v1/leases/{lease_id}")
            assert r.status_code == 204
    assert lease_id not in caplog.text
    assert request_lines(caplog) == [
        ("POST", "/v1/leases", 201), ("POST", "/v1/leases/{id}/report", 204),
        ("DELETE", "/v1/leases/{id}", 204)]


async def read_response(stream: trio.SocketStream) -> bytes:
    """One whole response whose JSON body ends the bytes read."""
    data = b""
    while not data.endswith(b"}"):
        chunk = await stream.receive_some()
        assert chunk, data
        data += chunk
    return data


async def test_auth_is_checked_before_any_body_byte_is_awaited() -> None:
    # The client announces a body and never sends it: without a token it is refused at
    # once, not after the 60 s body timeout (no MockClock: a wait would fail_after).
    with trio.fail_after(5):
        async with discovery(MemorySource([make_proxy("a")])) as client:
            stream = await trio.open_tcp_stream(client.base_url.host, client.base_url.port or 0)
            async with stream:
                await stream.send_all(b"POST /v1/leases HTTP/1.1\r\nhost: x\r\n"
                                      b"content-length: 60000\r\n\r\n")
                data = await read_response(stream)
            assert data.startswith(b"HTTP/1.1 401 ")
            assert b'"error":"unauthorized"' in data
            view = (await client.get("/v1/proxies")).json()["items"][0]
            assert view["activeLeases"] == 0


async def test_two_authorization_headers_are_a_400() -> None:
    right = b"authorization: Bearer " + TOKEN.encode() + b"\r\n"
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a")])) as client:
            for path in (b"/v1/leases", b"/healthz"):
                for headers in (right + right, right + b"authorization: Bearer nope\r\n",
                                b"authorization: Bearer nope\r\n" + right):
                    stream = await trio.open_tcp_stream(client.base_url.host,
                                                        client.base_url.port or 0)
                    async with stream:
                        await stream.send_all(b"POST " + path + b" HTTP/1.1\r\nhost: x\r\n"
                                              + headers + b"content-length: 2\r\n\r\n{}")
                        data = await read_response(stream)
                    assert data.startswith(b"HTTP/1.1 400 "), data
                    assert b"application/json" in data
                    assert data.endswith(
                        b'{"error":"invalid_header",'
                        b'"message":"more than one Authorization header"}')
            view = (await client.get("/v1/proxies")).json()["items"][0]
            assert view["activeLeases"] == 0
