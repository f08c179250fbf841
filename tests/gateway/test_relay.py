"""Sticky sessions, per-target cooldowns, the relay (half-close, idle, back-pressure),
plain-http reports and shutdown, through a real Squid."""

from __future__ import annotations

import logging
import os
import ssl

import pytest
import trio
import trio.testing

from egressd import metrics
from egressd.leases import Result
from tests.gateway.support import (
    TOKEN,
    auth,
    connect,
    running_gateway,
    send_raw,
    serve_auth_proxy,
    tls_get,
    upstream_proxy,
)
from tests.health.peers import (
    ProxyProcess,
    closed_port,
    read_head,
    serve_target,
    serve_tcp,
)


async def test_a_session_keeps_its_proxy_while_leasable_and_forgets_it_when_idle(
        squid: ProxyProcess, server_ssl: ssl.SSLContext, client_ssl: ssl.SSLContext) -> None:
    now = [0.0]
    proxies = [upstream_proxy(n, squid.host, squid.port) for n in ("p1", "p2", "p3")]
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            target = await nursery.start(serve_target, 204, server_ssl)
            authority = f"127.0.0.1:{target.port}"
            async with running_gateway(proxies, session_clock=lambda: now[0]) as gw:
                first = await connect(gw.port, authority, authorization=auth("session=s1"))
                kept = first.headers["x-egressd-proxy"]
                # Least loaded would pick another proxy now; the session keeps its own.
                agains = []
                for _ in range(3):
                    again = await connect(gw.port, authority,
                                          authorization=auth("session=s1"))
                    assert again.headers["x-egressd-proxy"] == kept
                    agains.append(again)
                plain = await connect(gw.port, authority, authorization=auth())
                assert plain.headers["x-egressd-proxy"] != kept
                other = await connect(gw.port, authority, authorization=auth("session=s2"))
                assert other.headers["x-egressd-proxy"] != kept
                assert await tls_get(again.stream, client_ssl) == 204
                # Its proxy cooled down for this target: the session moves, and stays moved.
                await gw.store.report(first.headers["x-egressd-lease"],
                                      result=Result.RATE_LIMITED, target="127.0.0.1")
                moved = await connect(gw.port, authority, authorization=auth("session=s1"))
                assert moved.headers["x-egressd-proxy"] not in (kept,)
                for stream in (first, plain, other, moved, *agains[:2]):
                    await stream.stream.aclose()
                with trio.fail_after(3):
                    await gw.gateway.wait_idle()
                again = await connect(gw.port, authority, authorization=auth("session=s1"))
                assert again.headers["x-egressd-proxy"] == moved.headers["x-egressd-proxy"]
                await again.stream.aclose()
                with trio.fail_after(3):
                    await gw.gateway.wait_idle()
                # 60 s (the session idle) after its last tunnel closed: forgotten.
                assert len(gw.gateway._sessions) == 2
                now[0] += 61
                assert len(gw.gateway._sessions) == 0
            nursery.cancel_scope.cancel()


async def test_a_target_cooldown_steers_tunnels_to_other_proxies_for_that_target_only(
        squid: ProxyProcess, server_ssl: ssl.SSLContext) -> None:
    proxies = [upstream_proxy("a", squid.host, squid.port, latency=1),
               upstream_proxy("b", squid.host, squid.port, latency=2)]
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            target = await nursery.start(serve_target, 204, server_ssl)
            async with running_gateway(proxies) as gw:
                first = await connect(gw.port, f"127.0.0.1:{target.port}",
                                      authorization=auth())
                assert first.headers["x-egressd-proxy"] == "crawl/a"
                await gw.store.report(first.headers["x-egressd-lease"],
                                      result=Result.BANNED)  # the lease's target: 127.0.0.1
                await first.stream.aclose()
                with trio.fail_after(3):
                    await gw.gateway.wait_idle()
                for _ in range(3):
                    answer = await connect(gw.port, f"127.0.0.1:{target.port}",
                                           authorization=auth())
                    assert answer.headers["x-egressd-proxy"] == "crawl/b"
                    await answer.stream.aclose()
                # "localhost" is another target: a is free for it (and has lower latency).
                answer = await connect(gw.port, f"localhost:{target.port}",
                                       authorization=auth())
                assert answer.headers["x-egressd-proxy"] == "crawl/a"
            nursery.cancel_scope.cancel()


def _bytes(direction: str) -> float:
    return metrics.REGISTRY.get_sample_value(
        "egressd_gateway_bytes_total", {"direction": direction}) or 0.0


async def _echo_after_eof(stream: trio.SocketStream) -> None:
    received = 0
    while data := await stream.receive_some(65536):
        received += len(data)
    await stream.send_all(b"got %d" % received)


async def test_half_close_is_passed_on_and_the_upstream_gets_its_credentials() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_tcp, _echo_after_eof)
            up = await nursery.start(serve_auth_proxy, "vendor", "pa:ss w0rd")
            proxy = upstream_proxy("up", "127.0.0.1", up.port)
            creds = {"crawl/up": ("vendor", "pa:ss w0rd")}
            async with running_gateway([proxy], credentials=creds) as gw:
                up_before, down_before = _bytes("upstream"), _bytes("downstream")
                answer = await connect(gw.port, f"127.0.0.1:{port}", authorization=auth(),
                                       extra=b"x" * 1000)  # bytes sent before the 200
                assert answer.status == 200
                await answer.stream.send_all(b"y" * 300_000)
                await answer.stream.send_eof()
                reply = answer.rest
                while data := await answer.stream.receive_some(65536):
                    reply += data
                assert reply == b"got 301000"
                await gw.gateway.wait_idle()
                # The 1000 bytes sent with the CONNECT count too.
                assert _bytes("upstream") - up_before == 301_000
                assert _bytes("downstream") - down_before == len(reply)
                # The upstream got its own credentials, never the client's token.
                assert up.seen == [auth("vendor", "pa:ss w0rd")]
            # Without them the upstream's 407 is a proxy_error, and a 502 here.
            async with running_gateway([proxy], retries=0) as gw:
                answer = await connect(gw.port, f"127.0.0.1:{port}", authorization=auth())
                assert answer.status == 502
                assert "407" in answer.json()["message"]
                assert gw.counted == ["crawl/up"]
            nursery.cancel_scope.cancel()


async def test_tunnels_leave_no_file_descriptor_behind() -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_tcp, _echo_after_eof)
            up = await nursery.start(serve_auth_proxy, "u", "p")
            creds = {"crawl/up": ("u", "p")}
            async with running_gateway([upstream_proxy("up", "127.0.0.1", up.port)],
                                       credentials=creds, idle_timeout=0.3) as gw:
                before = len(os.listdir("/proc/self/fd"))
                for i in range(20):
                    answer = await connect(gw.port, f"127.0.0.1:{port}", authorization=auth())
                    await answer.stream.send_all(b"z" * (i * 10_000))
                    if i % 2:
                        await answer.stream.send_eof()  # a clean half-close ...
                        while await answer.stream.receive_some(65536):
                            pass
                    await answer.stream.aclose()  # ... or a plain close mid-tunnel
                await gw.gateway.wait_idle()
                await trio.testing.wait_all_tasks_blocked()
                assert len(os.listdir("/proc/self/fd")) <= before
            nursery.cancel_scope.cancel()


async def test_an_idle_tunnel_is_closed_and_its_lease_released(squid: ProxyProcess) -> None:
    async def hold(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_tcp, hold)
            async with running_gateway([upstream_proxy("up", squid.host, squid.port)],
                                       idle_timeout=1.0) as gw:
                answer = await connect(gw.port, f"127.0.0.1:{port}", authorization=auth())
                assert answer.status == 200 and (await gw.active()) == 1
                # Traffic keeps it open past the idle timeout ...
                for _ in range(6):
                    await trio.sleep(0.25)
                    await answer.stream.send_all(b"ping")
                assert (await gw.active()) == 1
                # ... silence closes it.
                with trio.fail_after(3):
                    assert await answer.stream.receive_some(100) == b""
                    await gw.gateway.wait_idle()
            nursery.cancel_scope.cancel()


async def test_a_client_that_never_reads_costs_bounded_memory(squid: ProxyProcess) -> None:
    sent = [0]

    async def flood(stream: trio.SocketStream) -> None:
        chunk = b"z" * 65536
        try:
            while True:
                await stream.send_all(chunk)
                sent[0] += len(chunk)
        except trio.BrokenResourceError:
            pass  # the tunnel was closed: what this test waits for

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_tcp, flood)
            async with running_gateway([upstream_proxy("up", squid.host, squid.port)],
                                       idle_timeout=1.0) as gw:
                answer = await connect(gw.port, f"127.0.0.1:{port}", authorization=auth())
                assert answer.status == 200
                # The target is stopped by back-pressure: socket buffers, Squid's and one
                # gateway buffer, not the 10 GB it would send.
                stalled = -1
                while sent[0] != stalled:  # until the target's sends block
                    stalled = sent[0]
                    await trio.sleep(0.2)
                assert stalled < 64 * 1024 * 1024
                # No byte moved for the idle timeout: the tunnel is closed.
                with trio.fail_after(3):
                    await gw.gateway.wait_idle()
            nursery.cancel_scope.cancel()


async def test_shutdown_closes_every_tunnel_within_the_grace(squid: ProxyProcess) -> None:
    async def hold(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_tcp, hold)
            async with running_gateway([upstream_proxy("up", squid.host, squid.port)],
                                       grace=0.5) as gw:
                answers = [await connect(gw.port, f"127.0.0.1:{port}", authorization=auth())
                           for _ in range(3)]
                assert (await gw.active()) == 3
                start = trio.current_time()
                gw.scope.cancel()
                for answer in answers:
                    with trio.fail_after(2):
                        assert await answer.stream.receive_some(100) == b""
                stopped = trio.current_time() - start
                assert (await gw.active()) == 0
                assert gw.gateway.connections == 0
                # The grace was used (tunnels got their chance) and nothing outlived it long.
                assert stopped >= 0.4
                # New clients are not accepted any more.
                try:
                    late = await connect(gw.port, f"127.0.0.1:{port}", authorization=auth())
                except (OSError, EOFError):
                    pass
                else:
                    raise AssertionError(f"accepted after shutdown: {late.status}")
            nursery.cancel_scope.cancel()


async def _plain_http(status: int, headers: bytes = b"") -> object:
    async def handle(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        body = b"hello"
        await stream.send_all(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s"
                              % (status, len(body), headers, body))

    return handle


async def test_plain_http_answers_are_reported_429_rate_limited_and_bans_banned(
        squid: ProxyProcess) -> None:
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            limited = await nursery.start(serve_tcp, await _plain_http(
                429, b"Retry-After: 120\r\n"))
            banned = await nursery.start(serve_tcp, await _plain_http(403))
            fine = await nursery.start(serve_tcp, await _plain_http(200))
            async with running_gateway([upstream_proxy("up", squid.host, squid.port)],
                                       ban_statuses=frozenset({403})) as gw:
                def get(port: int, host: str = "127.0.0.1") -> bytes:
                    return (f"GET http://{host}:{port}/x HTTP/1.1\r\nHost: {host}:{port}\r\n"
                            f"Proxy-Authorization: {auth()}\r\n\r\n").encode()

                answer = await send_raw(gw.port, get(fine))
                assert answer.status == 200 and answer.body == b"hello"
                assert answer.headers["connection"] == "close"
                assert answer.headers["x-egressd-proxy"] == "crawl/up"
                assert len(answer.headers["x-egressd-lease"]) >= 32
                assert "proxy-authorization" not in answer.headers
                assert gw.store.cooldowns("crawl/up") == {}
                answer = await send_raw(gw.port, get(limited))
                assert answer.status == 429 and answer.body == b"hello"
                cooldown = gw.store.cooldowns("crawl/up")["127.0.0.1"]
                assert cooldown.reason is Result.RATE_LIMITED
                assert 110 < cooldown.until - gw.store.now() <= 121
                answer = await send_raw(gw.port, get(banned, "localhost"))
                assert answer.status == 403
                cooldown = gw.store.cooldowns("crawl/up")["localhost"]
                assert cooldown.reason is Result.BANNED
                assert cooldown.until - gw.store.now() > 3000
                # The cooled-down target now gets a 503; no client code was involved.
                answer = await send_raw(gw.port, get(fine))
                assert answer.status == 503 and answer.json()["inCooldown"] == 1
            nursery.cancel_scope.cancel()


async def test_a_plain_http_body_is_streamed_up_and_the_answer_judged(
        squid: ProxyProcess) -> None:
    async def upload(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 429 X\r\nRetry-After: 30\r\nContent-Length: %d\r\n"
                              b"\r\n%d" % (len(str(len(body))), len(body)))

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_tcp, upload)
            async with running_gateway([upstream_proxy("up", squid.host, squid.port)]) as gw:
                body = b"q" * 500_000
                head = (f"POST http://127.0.0.1:{port}/u HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                        f"Content-Length: {len(body)}\r\nProxy-Authorization: {auth()}\r\n\r\n")
                stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
                async with stream:
                    await stream.send_all(head.encode() + body)
                    data = b""
                    while chunk := await stream.receive_some(65536):
                        data += chunk
                assert data.startswith(b"HTTP/1.1 429")
                assert data.endswith(b"500000")
                with trio.fail_after(3):
                    await gw.gateway.wait_idle()
                cooldown = gw.store.cooldowns("crawl/up")["127.0.0.1"]
                assert cooldown.reason is Result.RATE_LIMITED
            nursery.cancel_scope.cancel()


async def test_shutdown_while_a_tunnel_opens_releases_its_lease() -> None:
    asked = trio.Event()

    async def silent_proxy(stream: trio.SocketStream) -> None:
        await read_head(stream)  # the CONNECT: the gateway holds its lease now
        asked.set()
        await trio.sleep_forever()  # and never answers

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            silent = await nursery.start(serve_tcp, silent_proxy)
            async with running_gateway([upstream_proxy("up", "127.0.0.1", silent)],
                                       grace=0.2, connect_timeout=30.0) as gw:
                stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
                async with stream:
                    await stream.send_all(f"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: x\r\n"
                                          f"Proxy-Authorization: {auth()}\r\n\r\n".encode())
                    await asked.wait()
                    assert await gw.active() == 1
                    gw.scope.cancel()
                    assert await stream.receive_some(100) == b""
                    await gw.gateway.wait_idle()
                    assert await gw.active() == 0
            nursery.cancel_scope.cancel()


async def _speaks_first(stream: trio.SocketStream) -> None:
    await stream.send_all(b"hello\n")
    while await stream.receive_some(100):
        pass


async def test_every_failure_is_one_log_line_without_a_traceback(
        squid: ProxyProcess, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="egressd.gateway")
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_tcp, _speaks_first)
            proxies = [upstream_proxy("dead", "127.0.0.1", closed_port(), latency=1),
                       upstream_proxy("up", squid.host, squid.port, latency=2)]
            async with running_gateway(proxies, head_limit=2048,
                                       handshake_timeout=0.3) as gw:
                before = metrics.REGISTRY.get_sample_value(
                    "egressd_gateway_tunnels_refused_total", {"reason": "bad_request"}) or 0
                for raw in (b"\x00\x01\x02garbage\r\n\r\n",
                            b"CONNECT x:1 HTTP/1.1\r\nX: " + b"a" * 4000 + b"\r\n\r\n",
                            b"CONNECT x:1 HTTP/1.1\r\n",  # never ends: the handshake timeout
                            f"GET / HTTP/1.1\r\nHost: x\r\nProxy-Authorization: {auth()}"
                            "\r\n\r\n".encode(),
                            f"CONNECT a:1 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: "
                            f"{auth('a,b')}\r\n\r\n".encode()):
                    answer = await send_raw(gw.port, raw)
                    assert answer.status in (400, 407, 408, 431), answer
                tunnel = await connect(gw.port, f"127.0.0.1:{port}", authorization=auth())
                assert tunnel.status == 200  # after one dead proxy
                greeting = tunnel.rest  # a server that speaks first (SMTP, SSH) is relayed
                while len(greeting) < 6:
                    greeting += await tunnel.stream.receive_some(100)
                assert greeting == b"hello\n"
                await tunnel.stream.aclose()
                await gw.gateway.wait_idle()
                after = metrics.REGISTRY.get_sample_value(
                    "egressd_gateway_tunnels_refused_total", {"reason": "bad_request"}) or 0
                assert after == before + 2
            nursery.cancel_scope.cancel()
    records = [r for r in caplog.records if r.name.startswith("egressd.gateway")]
    assert records
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in records)
    assert all(TOKEN not in str(r.__dict__) for r in records)
    refused = [r for r in records if r.getMessage() == "gateway refused"]
    assert sorted(r.reason for r in refused) == [  # type: ignore[attr-defined]
        "bad_request", "bad_request", "handshake_timeout", "header_too_large",
        "invalid_username"]
    assert [r.getMessage() for r in records].count("gateway upstream failed") == 1
