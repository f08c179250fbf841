"""HTTP/1.1 over TLS with h11 on trio: connections, requests, responses, streams.

A small server rather than an ASGI stack because the fake API server must
control the transport: end a watch stream cleanly or cut it mid-chunk, drop
every connection and refuse new ones for a while, and notice at once when a
watching client goes away (a reader task sees the EOF).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl, urlsplit

import attrs
import h11
import trio

from egressd.sandbox.apiserver.errors import too_large

MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's request body limit
_MAX_HEADERS = 64 * 1024


@attrs.frozen
class Request:
    """One parsed request; header names are lower-case, repeated query keys keep the last."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes

    def param(self, name: str, default: str = "") -> str:
        return self.query.get(name, default)

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("true", "1")


@attrs.frozen
class Response:
    """A complete response."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str = "application/json"


class AbortStream(Exception):
    """Raised by a stream body to end the connection without the closing chunk."""


Send = Callable[[bytes], Awaitable[None]]


@attrs.frozen
class Stream:
    """A chunked response whose body `run(send)` writes until it returns."""

    status: int
    run: Callable[[Send], Awaitable[None]]
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str = "application/json"


Handler = Callable[[Request], Awaitable[Response | Stream]]

_REASONS = {200: b"OK", 201: b"Created", 202: b"Accepted", 400: b"Bad Request",
            401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
            405: b"Method Not Allowed", 409: b"Conflict", 410: b"Gone",
            413: b"Request Entity Too Large", 415: b"Unsupported Media Type",
            422: b"Unprocessable Entity", 429: b"Too Many Requests",
            500: b"Internal Server Error", 503: b"Service Unavailable",
            504: b"Gateway Timeout"}


class _BodyTooLarge(Exception):
    """The request body passed MAX_BODY."""


class _ClientGone(Exception):
    """The peer closed or broke the connection."""


async def _next_event(stream: trio.abc.Stream, conn: h11.Connection) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError) as exc:
            raise _ClientGone from exc
        # b"" is EOF: h11 answers ConnectionClosed (or an error mid-message) next.
        conn.receive_data(bytes(data))


async def _read_request(stream: trio.abc.Stream, conn: h11.Connection) -> Request | None:
    event = await _next_event(stream, conn)
    if isinstance(event, h11.ConnectionClosed):
        return None
    if not isinstance(event, h11.Request):
        raise _ClientGone
    chunks: list[bytes] = []
    size = 0
    while True:
        part = await _next_event(stream, conn)
        if isinstance(part, h11.Data):
            size += len(part.data)
            if size > MAX_BODY:
                raise _BodyTooLarge
            chunks.append(bytes(part.data))
        elif isinstance(part, h11.EndOfMessage):
            break
        else:
            raise _ClientGone
    target = urlsplit(event.target.decode("latin-1"))
    headers = {name.decode("latin-1").lower(): value.decode("latin-1")
               for name, value in event.headers}
    return Request(method=event.method.decode("ascii"), path=target.path or "/",
                   query=dict(parse_qsl(target.query, keep_blank_values=True)),
                   headers=headers, body=b"".join(chunks))


def _head(status: int, headers: tuple[tuple[str, str], ...], content_type: str,
          length: int | None) -> h11.Response:
    pairs = [("Content-Type", content_type), ("Cache-Control", "no-cache, private"), *headers]
    if length is not None:
        pairs.append(("Content-Length", str(length)))
    return h11.Response(status_code=status, headers=pairs, reason=_REASONS.get(status, b""))


async def _send(stream: trio.abc.Stream, data: bytes) -> None:
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError) as exc:
        raise _ClientGone from exc


async def _stream_body(stream: trio.abc.Stream, conn: h11.Connection, body: Stream) -> None:
    """Run a streaming body, then end the response; the connection closes after it.

    The head says `Connection: close`: the peer reader below may consume pipelined
    bytes, so the connection is never reused, and a client told so opens a new one
    instead of sending its next request into a closed socket.
    """
    headers = (*body.headers, ("Connection", "close"))
    await _send(stream, conn.send(_head(body.status, headers, body.content_type, None)))

    async def send(data: bytes) -> None:
        await _send(stream, conn.send(h11.Data(data=data)))

    gone = False
    try:
        async with trio.open_nursery() as nursery:
            async def watch_peer() -> None:
                # A client that hangs up mid-watch sends EOF; without this reader a
                # quiet watch would never notice and its watcher would live on.
                nonlocal gone
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
                    data = b""
                if not data:
                    gone = True
                    nursery.cancel_scope.cancel()

            nursery.start_soon(watch_peer)
            try:
                await body.run(send)
            except AbortStream:
                return
            finally:
                nursery.cancel_scope.cancel()
    except* _ClientGone:
        # A send failed inside the nursery: the client left mid-stream (the group
        # wraps it; a bare `except _ClientGone` would let it kill the server).
        gone = True
    if not gone:
        await _send(stream, conn.send(h11.EndOfMessage()))


async def serve_connection(tcp: trio.SocketStream, ssl_context: ssl.SSLContext,
                           handler: Handler) -> None:
    """Serve one client connection until it closes (or the caller cancels)."""
    stream = trio.SSLStream(tcp, ssl_context, server_side=True)
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEADERS)
    try:
        try:
            await stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            return
        while True:
            try:
                request = await _read_request(stream, conn)
            except _BodyTooLarge:
                body = json.dumps(too_large(MAX_BODY).status()).encode()
                await _send(stream, conn.send(_head(413, (("Connection", "close"),),
                                                    "application/json", len(body))))
                await _send(stream, conn.send(h11.Data(data=body)))
                await _send(stream, conn.send(h11.EndOfMessage()))
                return
            except h11.RemoteProtocolError:
                return
            if request is None:
                return
            reply = await handler(request)
            if isinstance(reply, Stream):
                await _stream_body(stream, conn, reply)
                return
            else:
                await _send(stream, conn.send(_head(reply.status, reply.headers,
                                                    reply.content_type, len(reply.body))))
                await _send(stream, conn.send(h11.Data(data=reply.body)))
                await _send(stream, conn.send(h11.EndOfMessage()))
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return
    except _ClientGone:
        return
    finally:
        # Closing the TCP stream, not the TLS one: no close_notify to wait on.
        await tcp.aclose()
