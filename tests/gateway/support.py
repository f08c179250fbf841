"""Test support for the gateway: a gateway on 127.0.0.1 port 0, raw proxy clients, targets.

Everything is real sockets: the gateway under test, real Squid/tinyproxy
upstreams (session fixtures in conftest.py), TLS targets with trustme
certificates. Timers are real too (sockets and trio's MockClock autojump do
not mix), so timeouts here are short and every test is under `fail_after`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import attrs
import h11
import trio

from egressd.gateway.fleet import SourceFleet
from egressd.gateway.server import Gateway, GatewayConfig, listen
from egressd.gateway.sessions import Sessions
from egressd.leases.store import MemoryLeaseStore
from egressd.model.proxy import Proxy
from tests.http.support import MemorySource, make_proxy

TOKEN = "gw-s3cret-token-0123456789"

# Client streams opened by `send_raw`, closed when the gateway they talk to stops.
_CLIENTS: list[trio.SocketStream] = []


def auth(username: str = "egressd", password: str = TOKEN) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def upstream_proxy(name: str, host: str, port: int, **kw: Any) -> Proxy:
    return make_proxy(name, host=host, port=port, **kw)


@attrs.define
class Running:
    gateway: Gateway
    store: MemoryLeaseStore
    source: MemorySource
    port: int
    counted: list[str]
    scope: trio.CancelScope

    async def active(self) -> int:
        """Leases active on the gateway's proxies now."""
        usage = await self.store.usage(p.key for p in self.source.proxies())
        return sum(u.active_leases for u in usage.values())


@contextlib.asynccontextmanager
async def running_gateway(proxies: Iterable[Proxy], *, session_clock: Callable[[], float]
                          | None = None, credentials: dict[str, tuple[str, str]] | None = None,
                          **config: Any) -> AsyncIterator[Running]:
    """A gateway over `proxies` with a fresh store; cancelled (and drained) on exit."""
    counted: list[str] = []
    store = MemoryLeaseStore(cooldown=600.0, ban_cooldown=3600.0, max_cooldown=3600.0,
                             on_proxy_error=counted.append)
    source = MemorySource(proxies)
    settings: dict[str, Any] = {"grace": 1.0, "connect_timeout": 3.0,
                                "handshake_timeout": 3.0, "idle_timeout": 30.0}
    settings.update(config)
    sessions = (Sessions(idle=60.0, clock=session_clock) if session_clock is not None
                else Sessions(idle=60.0))
    creds = credentials or {}
    fleet = SourceFleet(source, credentials=lambda proxy: creds.get(proxy.key))
    gateway = Gateway(fleet=fleet, store=store, token=TOKEN,
                      config=GatewayConfig(**settings), sessions=sessions)
    scope = trio.CancelScope()  # cancelling it stops the gateway (a shutdown), only that

    async def serve(listener: trio.SocketListener) -> None:
        with scope:
            await gateway.serve(listener)

    async with trio.open_nursery() as nursery:
        listener = listen("127.0.0.1:0")
        port = listener.socket.getsockname()[1]
        nursery.start_soon(serve, listener)
        try:
            yield Running(gateway=gateway, store=store, source=source, port=port,
                          counted=counted, scope=scope)
        finally:
            while _CLIENTS:
                await trio.aclose_forcefully(_CLIENTS.pop())
        nursery.cancel_scope.cancel()


@attrs.define
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    stream: trio.SocketStream
    rest: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)


async def read_answer(stream: trio.SocketStream) -> Answer:
    """Read one answer head (and a Content-Length body) from the gateway."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError(f"closed after {buf!r}")
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(head + b"\r\n\r\n")
    event = conn.next_event()
    assert isinstance(event, h11.Response), event
    headers = {k.decode().lower(): v.decode() for k, v in event.headers}
    length = int(headers.get("content-length", "0"))
    body = rest
    while len(body) < length:
        data = await stream.receive_some(65536)
        if not data:
            break
        body += data
    return Answer(status=event.status_code, headers=headers, body=body[:length] if length
                  else b"", stream=stream, rest=b"" if length else rest)


async def send_raw(port: int, data: bytes) -> Answer:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    _CLIENTS.append(stream)
    await stream.send_all(data)
    return await read_answer(stream)


async def connect(port: int, authority: str, *, authorization: str | None = None,
                  extra: bytes = b"") -> Answer:
    """CONNECT `authority` through the gateway; the answer's stream is the tunnel."""
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if authorization is not None:
        lines.append(f"Proxy-Authorization: {authorization}")
    return await send_raw(port, ("\r\n".join(lines) + "\r\n\r\n").encode() + extra)


async def tls_get(tunnel: trio.SocketStream, ctx: ssl.SSLContext, host: str = "127.0.0.1"
                  ) -> int:
    """A GET over TLS inside a tunnel; the answer's status."""
    tls = trio.SSLStream(tunnel, ctx, server_hostname=host, https_compatible=True)
    await tls.send_all(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    answer = await read_answer(tls)  # type: ignore[arg-type]
    await trio.aclose_forcefully(tls)
    return answer.status


@attrs.define
class AuthProxy:
    """A minimal CONNECT proxy that demands credentials and honours half-close.

    Squid and tinyproxy both close the whole tunnel when the client half-closes
    (checked by hand), so half-close needs an upstream that passes EOF on; this
    one does, and nothing else (no plain-http forwarding).
    """

    port: int
    username: str
    password: str
    seen: list[str] = attrs.field(factory=list)


async def serve_auth_proxy(username: str, password: str, *,
                           task_status: trio.TaskStatus[AuthProxy] = trio.TASK_STATUS_IGNORED
                           ) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    proxy = AuthProxy(listeners[0].socket.getsockname()[1], username, password)
    wanted = auth(username, password)

    async def pipe(src: trio.SocketStream, dst: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await src.receive_some(65536):
                await dst.send_all(data)
            await dst.send_eof()

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            given = [v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
                     if k.lower() == "proxy-authorization"]
            proxy.seen.append(given[0] if given else "")
            if given != [wanted]:
                await stream.send_all(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                                      b"Content-Length: 0\r\n\r\n")
                return
            host, _, port = lines[0].split(" ")[1].rpartition(":")
            target = await trio.open_tcp_stream(host, int(port))
            async with target:
                await stream.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    await target.send_all(rest)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pipe, stream, target)
                    nursery.start_soon(pipe, target, stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(proxy)
