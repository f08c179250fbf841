"""ASGI middleware of the discovery API (docs/reference.md), outermost first.

`wrap(app, token=...)` stacks: recovery (an unhandled error becomes a logged 500
with the JSON error shape), request log (one line per request), bearer auth
(constant-time compare; `/healthz` exempt; more than one Authorization header is
a 400), a body cap (64 KiB, 413). Auth runs before the cap, so an anonymous
client cannot make the server read (or wait for) a single body byte. Each is a
plain ASGI callable wrapper, so the order is exactly what `wrap` says and holds
for every request, including ones that match no route.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# Any in the app's own signature: Quart and Hypercorn type scopes and events as TypedDicts.
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

MAX_BODY = 64 * 1024
"""docs/reference.md: request bodies are capped at 64 KiB."""

BODY_TIMEOUT = 60.0
"""Seconds a client gets to send its whole body (Quart's own default, which the cap bypasses)."""

AUTH_EXEMPT = frozenset({"/healthz"})


async def send_error(
    send: Send, status: int, code: str, message: str,
    *, headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer with the API's error shape `{"error": code, "message": text}`."""
    body = json.dumps({"error": code, "message": message}, separators=(",", ":")).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ],
    })
    await send({"type": "http.response.body", "body": body, "more_body": False})


_CLIENT_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError)


def recovery(app: ASGIApp) -> ASGIApp:
    """Turn any error escaping the app into a logged 500 (the connection survives)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await app(scope, receive, tracking_send)
        except* Exception as group:
            # except* leaves trio.Cancelled (a BaseException) to propagate.
            where = {"method": scope.get("method"),
                     "path": loggable_path(str(scope.get("path") or ""))}
            _, other = group.split(_CLIENT_GONE)
            if started and other is None:
                # The socket failed under a response already under way: the client hung
                # up (Hypercorn can also race its own close against the last write).
                log.info("client went away during the response", extra=where)
            else:
                log.exception("unhandled error", extra=where)
                if not started:
                    await send_error(send, 500, "internal_error", "internal server error")

    return middleware


_LEASE_ID = re.compile(r"^(/v1/leases/)[^/]+")


def loggable_path(path: str) -> str:
    """`path` with any lease id replaced by `{id}`: a lease id lets its holder release and
    report on the lease, so it is a credential of sorts and stays out of logs."""
    return _LEASE_ID.sub(r"\1{id}", path)


def request_log(app: ASGIApp) -> ASGIApp:
    """Log one line per request: method, path (lease ids redacted), status, duration
    (never headers or bodies)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        status = 0
        start = time.monotonic()

        async def status_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, status_send)
        except Exception:
            # Recovery, outside this layer, answers 500 for it; log what the client gets.
            status = status or 500
            raise
        finally:
            log.info("request", extra={
                "method": scope.get("method"),
                "path": loggable_path(str(scope.get("path") or "")),
                "status": status or None,
                "ms": round((time.monotonic() - start) * 1000, 1),
            })

    return middleware


class _TooLarge(Exception):
    """The body passed the cap."""


class _ClientLeft(Exception):
    """The client left before its body was complete: nothing to answer."""


async def _read_body(receive: Receive, *, limit: int) -> bytes:
    """The whole body (at most `limit` bytes kept); _TooLarge past it."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise _ClientLeft
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _announced_too_large(scope: Scope, limit: int) -> bool:
    return any(name == b"content-length" and value.isdigit() and int(value) > limit
               for name, value in scope.get("headers", ()))


def body_cap(app: ASGIApp, *, limit: int = MAX_BODY, timeout: float = BODY_TIMEOUT) -> ASGIApp:
    """Read the whole body up front; answer 413 above `limit` before the app runs.

    Reading first (at most `limit` bytes kept) means the app never sees a
    partial body and a too-large request changes no state. A body not complete
    within `timeout` seconds is answered 408, so a client trickling its body
    cannot hold a request open forever.
    """

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        body = b""
        try:
            if _announced_too_large(scope, limit):
                raise _TooLarge
            with trio.fail_after(timeout):
                body = await _read_body(receive, limit=limit)
        except _ClientLeft:
            return
        except _TooLarge:
            await send_error(send, 413, "body_too_large",
                             f"request body larger than {limit} bytes")
            return
        except trio.TooSlowError:
            await send_error(send, 408, "body_timeout",
                             f"request body not received within {timeout:g} s")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return middleware


def bearer_auth(app: ASGIApp, *, token: str) -> ASGIApp:
    """Require `Authorization: Bearer <token>` except on AUTH_EXEMPT paths.

    Two or more Authorization headers are a 400 on every path: which one a proxy
    in front or the framework would pick differs, so none is picked.
    """
    expected = token.encode()

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        given = [value for name, value in scope.get("headers", ()) if name == b"authorization"]
        if len(given) > 1:
            await send_error(send, 400, "invalid_header",
                             "more than one Authorization header")
            return
        if scope.get("path") in AUTH_EXEMPT or _bearer_matches(given, expected):
            await app(scope, receive, send)
            return
        await send_error(send, 401, "unauthorized", "missing or wrong bearer token",
                         headers=[(b"www-authenticate", b'Bearer realm="egressd"')])

    return middleware


def _bearer_matches(given: list[bytes], expected: bytes) -> bool:
    if not given:
        return False
    scheme, _, rest = given[0].partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    # compare_digest: the time taken does not reveal how much of the token matched
    # (a prefix of the token is as wrong as any other string).
    return hmac.compare_digest(rest.strip(), expected)


def wrap(app: ASGIApp, *, token: str | None) -> ASGIApp:
    """The discovery API's stack, outermost first: recovery, log, auth, body cap."""
    inner = body_cap(app)
    if token is not None:
        inner = bearer_auth(inner, token=token)
    return recovery(request_log(inner))
