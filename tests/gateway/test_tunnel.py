"""CONNECT tunnels through real Squid and tinyproxy to trustme TLS targets, and the refusals.

Each test runs a gateway on 127.0.0.1 port 0 over an in-memory Proxy cache
whose proxies are real upstream processes (or dead/misbehaving ports).
"""

from __future__ import annotations

import logging
import os
import resource
import ssl

import pytest
import trio

from egressd import metrics
from egressd.leases import Grant, Result
from tests.gateway.support import (
    TOKEN,
    auth,
    connect,
    running_gateway,
    send_raw,
    tls_get,
    upstream_proxy,
)
from tests.health.peers import ProxyProcess, closed_port, scripted_proxy, serve_target, serve_tcp


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("kind", ["squid", "tinyproxy"])
async def test_a_tunnel_reaches_a_tls_target_and_its_lease_is_released(
        kind: str, request: pytest.FixtureRequest, server_ssl: ssl.SSLContext,
        client_ssl: ssl.SSLContext) -> None:
    proc: ProxyProcess = request.getfixturevalue(kind)
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            target = await nursery.start(serve_target, 204, server_ssl)
            async with running_gateway([upstream_proxy("up", proc.host, proc.port)]) as gw:
                opened = sample("egressd_gateway_tunnels_opened_total", kind="connect")
                answer = await connect(gw.port, f"127.0.0.1:{target.port}",
                                       authorization=auth())
                assert answer.status == 200
                assert answer.headers["x-egressd-proxy"] == "crawl/up"
                lease_id = answer.headers["x-egressd-lease"]
                assert len(lease_id) >= 32
                assert (await gw.active()) == 1
                assert await tls_get(answer.stream, client_ssl) == 204
                assert target.requests, "the GET went through the upstream to the target"
                with trio.fail_after(3):
                    await gw.gateway.wait_idle()
                assert (await gw.active()) == 0, "the tunnel's lease was not released"
                assert sample("egressd_gateway_tunnels_opened_total", kind="connect") == opened + 1
                # The lease is the client's to report on: the header names a real lease.
                with pytest.raises(Exception, match="no lease"):
                    await gw.store.report("not-" + lease_id, result=Result.OK)
                await gw.store.report(lease_id, result=Result.OK)
            nursery.cancel_scope.cancel()


async def test_no_open_proxy_407_for_missing_wrong_or_odd_credentials(
        squid: ProxyProcess) -> None:
    with trio.fail_after(10):
        async with running_gateway([upstream_proxy("up", squid.host, squid.port)]) as gw:
            for authorization in (None, auth(password="wrong"), auth(password=TOKEN[:-1]),
                                  "Bearer " + TOKEN, "Basic !!!notbase64", auth("x", "")):
                answer = await connect(gw.port, "example.org:443", authorization=authorization)
                assert answer.status == 407, authorization
                assert answer.headers["proxy-authenticate"] == 'Basic realm="egressd"'
                assert answer.json()["error"] == "unauthenticated"
                assert TOKEN not in answer.body.decode()
            # Even a malformed request is a 407 to an anonymous client (it learns nothing).
            answer = await send_raw(gw.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer.status == 407
            assert (await gw.active()) == 0


@pytest.mark.parametrize("username,needle", [
    ("session=", "session must be"),
    ("session=a b", "session must be"),
    ("region=eu,", "is not key=value"),
    ("=eu", "is not key=value"),
    ("region=eu,region=us", "twice"),
    ("session=a,session=b", "twice"),
    ("a,b", "is not key=value"),
    ("region=e u", "label selector term"),
])
async def test_a_malformed_username_is_a_407_with_its_reason(
        squid: ProxyProcess, username: str, needle: str) -> None:
    with trio.fail_after(10):
        async with running_gateway([upstream_proxy("up", squid.host, squid.port)]) as gw:
            answer = await connect(gw.port, "example.org:443", authorization=auth(username))
            assert answer.status == 407
            body = answer.json()
            assert body["error"] == "invalid_username" and needle in body["message"]


@pytest.mark.parametrize("head", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nProxy-Authorization: %s\r\n\r\n",
    b"CONNECT example.org HTTP/1.1\r\nHost: x\r\nProxy-Authorization: %s\r\n\r\n",
    b"CONNECT example.org:99999 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: %s\r\n\r\n",
    b"CONNECT ex_ample..org:443 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: %s\r\n\r\n",
    b"GET https://example.org/ HTTP/1.1\r\nHost: x\r\nProxy-Authorization: %s\r\n\r\n",
    b"CONNECT a:1 HTTP/1.1\r\nProxy-Authorization: %s\r\nProxy-Authorization: %s\r\n\r\n",
])
async def test_malformed_requests_are_400(squid: ProxyProcess, head: bytes) -> None:
    with trio.fail_after(10):
        async with running_gateway([upstream_proxy("up", squid.host, squid.port)]) as gw:
            value = auth().encode()
            answer = await send_raw(gw.port, head.replace(b"%s", value))
            assert answer.status == 400, answer.body
            assert answer.json()["error"] == "bad_request"
            assert (await gw.active()) == 0


async def test_a_head_over_the_cap_is_431_without_reading_it_all(squid: ProxyProcess) -> None:
    with trio.fail_after(10):
        async with running_gateway([upstream_proxy("up", squid.host, squid.port)],
                                   head_limit=4096) as gw:
            head = (f"CONNECT example.org:443 HTTP/1.1\r\nProxy-Authorization: {auth()}\r\n"
                    + "X-Pad: " + "a" * 8000 + "\r\n\r\n")
            answer = await send_raw(gw.port, head.encode())
            assert answer.status == 431
            assert answer.json()["error"] == "header_too_large"
            # A head that never ends is cut at the cap too, not buffered forever.
            stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
            await stream.send_all(b"CONNECT example.org:443 HTTP/1.1\r\nX-Pad: ")
            with pytest.raises(trio.BrokenResourceError):
                for _ in range(1000):
                    await stream.send_all(b"b" * 4096)
            await stream.aclose()


async def test_a_silent_client_gets_408_after_the_handshake_timeout(
        squid: ProxyProcess) -> None:
    with trio.fail_after(10):
        async with running_gateway([upstream_proxy("up", squid.host, squid.port)],
                                   handshake_timeout=0.3) as gw:
            answer = await send_raw(gw.port, b"CONNECT example.org:443 HTTP/1.1\r\n")
            assert answer.status == 408
            assert answer.json()["error"] == "handshake_timeout"


async def test_no_proxy_is_503_with_retry_after_and_the_breakdown(squid: ProxyProcess) -> None:
    pool_a = {"pool": "a"}
    proxies = [
        upstream_proxy("sick", squid.host, squid.port, healthy=False, attributes=pool_a),
        upstream_proxy("full", squid.host, squid.port, max_leases=0, attributes=pool_a),
        upstream_proxy("cool", squid.host, squid.port, attributes=pool_a),
        upstream_proxy("other", squid.host, squid.port, attributes={"pool": "b"}),
    ]
    with trio.fail_after(10):
        async with running_gateway(proxies) as gw:
            grant = await gw.store.acquire({}, target="shop.example", ttl=60,
                                           only="crawl/cool")
            assert isinstance(grant, Grant)
            await gw.store.report(grant.lease.id, result=Result.BANNED)
            await gw.store.release(grant.lease.id)
            # No proxy matches pool=none; pool=a is one of each bucket.
            answer = await connect(gw.port, "shop.example:443",
                                   authorization=auth("pool=none"))
            assert answer.status == 503
            assert answer.headers["retry-after"] == "5"
            assert answer.json() == {
                "error": "no_proxy_available",
                "message": "no proxy matching the selector is free for this target",
                "considered": 0, "unhealthy": 0, "atCapacity": 0, "inCooldown": 0}
            answer = await connect(gw.port, "shop.example:443", authorization=auth("pool=a"))
            body = answer.json()
            assert answer.status == 503
            assert {k: body[k] for k in ("considered", "unhealthy", "atCapacity",
                                        "inCooldown")} == {
                "considered": 3, "unhealthy": 1, "atCapacity": 1, "inCooldown": 1}


async def test_a_dead_upstream_is_retried_on_another_and_reported_proxy_error(
        squid: ProxyProcess, server_ssl: ssl.SSLContext, client_ssl: ssl.SSLContext) -> None:
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            target = await nursery.start(serve_target, 204, server_ssl)
            refuses_auth = await nursery.start(serve_tcp, scripted_proxy(
                b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"))
            proxies = [
                # Lowest latency first: the gateway tries the dead ones before Squid.
                upstream_proxy("a-dead", "127.0.0.1", closed_port(), latency=1),
                upstream_proxy("b-407", "127.0.0.1", refuses_auth, latency=2),
                upstream_proxy("c-squid", squid.host, squid.port, latency=3),
            ]
            async with running_gateway(proxies, retries=2) as gw:
                retries = sample("egressd_gateway_upstream_retries_total")
                answer = await connect(gw.port, f"127.0.0.1:{target.port}",
                                       authorization=auth())
                assert answer.status == 200
                assert answer.headers["x-egressd-proxy"] == "crawl/c-squid"
                assert await tls_get(answer.stream, client_ssl) == 204
                assert gw.counted == ["crawl/a-dead", "crawl/b-407"]
                assert sample("egressd_gateway_upstream_retries_total") == retries + 2
                # No cooldown: a proxy_error is health's business.
                assert gw.store.cooldowns("crawl/a-dead") == {}
            async with running_gateway(proxies[:2], retries=5) as gw:
                answer = await connect(gw.port, f"127.0.0.1:{target.port}",
                                       authorization=auth())
                assert answer.status == 502
                body = answer.json()
                assert body["error"] == "upstream_failed" and body["attempts"] == 2
                assert "407" in body["message"] or "refused" in body["message"]
                assert (await gw.active()) == 0
            async with running_gateway(proxies[:2], retries=0) as gw:
                answer = await connect(gw.port, f"127.0.0.1:{target.port}",
                                       authorization=auth())
                assert answer.status == 502 and answer.json()["attempts"] == 1
                assert answer.json()["message"] == "proxy crawl/a-dead: connect refused"
            nursery.cancel_scope.cancel()


async def test_past_max_tunnels_a_client_gets_503(
        squid: ProxyProcess, server_ssl: ssl.SSLContext) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            target = await nursery.start(serve_target, 204, server_ssl)
            async with running_gateway([upstream_proxy("up", squid.host, squid.port)],
                                       max_tunnels=1) as gw:
                first = await connect(gw.port, f"127.0.0.1:{target.port}",
                                      authorization=auth())
                assert first.status == 200
                second = await connect(gw.port, f"127.0.0.1:{target.port}",
                                       authorization=auth())
                assert second.status == 503
                assert second.json()["error"] == "too_many_tunnels"
                assert second.headers["retry-after"] == "1"
                # Far past the cap (a silent connection holds the second place): closed
                # without reading a byte, so a flood costs no buffers.
                silent = await trio.open_tcp_stream("127.0.0.1", gw.port)
                async with silent:
                    with trio.fail_after(3):
                        # The accept is observable only as the count (bounded by fail_after).
                        while gw.gateway.connections < 2:  # noqa: ASYNC110
                            await trio.sleep(0.01)
                    flood = await trio.open_tcp_stream("127.0.0.1", gw.port)
                    async with flood:
                        assert await flood.receive_some(100) == b""
                await first.stream.aclose()
                with trio.fail_after(3):
                    await gw.gateway.wait_idle()
                third = await connect(gw.port, f"127.0.0.1:{target.port}",
                                      authorization=auth())
                assert third.status == 200
            nursery.cancel_scope.cancel()


async def test_out_of_file_descriptors_the_gateway_pauses_and_then_serves(
        squid: ProxyProcess) -> None:
    paused = trio.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "gateway cannot accept; pausing":
                paused.set()

    handler = Seen()
    logging.getLogger("egressd.gateway").addHandler(handler)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        with trio.fail_after(15):
            async with running_gateway([upstream_proxy("up", squid.host, squid.port)]) as gw:
                clients = [trio.socket.socket() for _ in range(6)]
                in_use = len(os.listdir("/proc/self/fd"))
                resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 1, hard))
                try:
                    for sock in clients:
                        await sock.connect(("127.0.0.1", gw.port))
                    await paused.wait()
                finally:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
                for sock in clients:
                    stream = trio.SocketStream(sock)
                    async with stream:
                        await stream.send_all(b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r\n")
                        data = b""
                        while b"\r\n\r\n" not in data:
                            data += await stream.receive_some(4096)
                        assert data.startswith(b"HTTP/1.1 407")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        logging.getLogger("egressd.gateway").removeHandler(handler)
