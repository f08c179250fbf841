"""The transport under clients that leave: watch responses end the connection cleanly,
and a client that vanishes mid-stream never takes the server down."""

from __future__ import annotations

import socket
import struct

import httpx
import trio

from egressd.sandbox.apiserver import FakeApiServer
from tests.sandbox.apiserver.support import ALL_PROXIES, PROXIES, created, proxy, watch

WATCH_REQUEST = ("GET {path}?watch=true HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Authorization: Bearer {token}\r\n\r\n")


async def _churn(server: FakeApiServer) -> None:
    """Events without end: one Proxy created and deleted over and over."""
    while True:
        server.create(proxy("churn"))
        await trio.sleep(0.001)
        server.delete("crawl.example.com/v1alpha1", "Proxy", "churn", namespace="default")
        await trio.sleep(0.001)


async def _watch_then_vanish(server: FakeApiServer, *, reset: bool) -> None:
    """Open a watch, read until events stream, then drop the TCP connection (an RST
    with `reset`, else a FIN without TLS close_notify): a client process killed mid-read."""
    port = int(server.url.rsplit(":", 1)[1])
    tcp = await trio.open_tcp_stream("127.0.0.1", port)
    tls = trio.SSLStream(tcp, server.client_ssl_context(), server_hostname="127.0.0.1")
    await tls.send_all(WATCH_REQUEST.format(path=ALL_PROXIES, token=server.token).encode())
    seen = b""
    while b'"type"' not in seen:
        seen += await tls.receive_some(65536)
    if reset:
        tcp.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await tcp.aclose()


async def test_watchers_leaving_mid_stream_hundreds_of_times_never_stop_the_server(
        nursery: trio.Nursery) -> None:
    server = FakeApiServer()
    await nursery.start(server.serve)
    with trio.fail_after(90):
        async with trio.open_nursery() as inner:
            inner.start_soon(_churn, server)
            for i in range(200):
                await _watch_then_vanish(server, reset=i % 2 == 0)
            inner.cancel_scope.cancel()
        async with httpx.AsyncClient(base_url=server.url, verify=server.client_ssl_context(),
                                     headers={"Authorization": f"Bearer {server.token}"}
                                     ) as client:
            assert (await client.get("/version")).status_code == 200
            await created(client, PROXIES, proxy("after"))
            # Every abandoned watcher was closed: none is left streaming to nobody.
            while server.watch_count("proxies"):
                await server.store.wait_changed()


async def test_a_watch_response_says_the_connection_closes_and_the_client_reconnects(
        apiserver: FakeApiServer) -> None:
    # One pooled connection: a client that reused the watch's connection would fail
    # ("Server disconnected without sending a response") on the request after it.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=apiserver.url, limits=limits,
                                 verify=apiserver.client_ssl_context(),
                                 headers={"Authorization": f"Bearer {apiserver.token}"},
                                 timeout=httpx.Timeout(10, read=None)) as client:
        with trio.fail_after(20):
            await created(client, PROXIES, proxy("a"))
            for _ in range(5):
                async with watch(client, ALL_PROXIES, timeoutSeconds=1) as events:
                    assert events.response.headers["connection"] == "close"
                    rest = await events.rest()
                assert [e["type"] for e in rest] == ["ADDED"]
                assert (await client.get(f"{PROXIES}/a")).status_code == 200
