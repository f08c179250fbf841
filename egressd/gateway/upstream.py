"""Connecting to an upstream proxy: TCP, then a CONNECT (or a forwarded plain request).

Every library error is mapped here, once, to `UpstreamFailed` with a short
reason ("connect refused", "CONNECT answered 407: proxy refused the
credentials", "timeout after 10s waiting for the CONNECT answer"), the way
`egressd.health.probe` maps its own; the caller reports it as `proxy_error`
and tries another proxy.

Credentials: an `Upstream` carries the proxy's username and password when its
proxyUrl has them (the credentials issue), sent as `Proxy-Authorization:
Basic`; they are `repr=False` and never appear in a reason.
"""

from __future__ import annotations

import base64
import errno
import socket

import attrs
import h11
import trio

from egressd.gateway.wire import (
    BadHead,
    HeadTooLarge,
    PeerClosed,
    ResponseHead,
    connect_request,
    read_head,
)

HEAD_LIMIT = 65536
"""Largest head accepted from an upstream proxy."""


@attrs.frozen(kw_only=True)
class Upstream:
    """One proxy as the gateway dials it: key "namespace/name", address, credentials."""

    key: str
    host: str
    port: int
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)

    def authorization(self) -> bytes | None:
        """The `Proxy-Authorization` value for this proxy, or None if it needs none."""
        if self.username is None and self.password is None:
            return None
        pair = f"{self.username or ''}:{self.password or ''}".encode()
        return b"Basic " + base64.b64encode(pair)


class UpstreamFailed(Exception):
    """The upstream proxy failed: refused, timed out, closed, answered non-2xx or 407."""

    def __init__(self, reason: str, *, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def _ip_family(host: str) -> int | None:
    """The address family of a numeric host, or None for a name."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family
    return None


async def dial(up: Upstream) -> trio.SocketStream:
    """A TCP connection to the proxy (the caller bounds it with `fail_after`).

    A proxy's address is an IP almost always (status.ip, a Pod IP): that is one
    socket and one connect, without `open_tcp_stream`'s resolver and happy-eyeballs
    nursery, which cost more Python per tunnel than the rest of the setup (issue 15
    item 8). A name goes through `open_tcp_stream`. trio sets TCP_NODELAY on both.
    """
    family = _ip_family(up.host)
    try:
        if family is None:
            return await trio.open_tcp_stream(up.host, up.port)
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            await sock.connect((up.host, up.port))
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)
    except OSError as exc:
        raise UpstreamFailed(_connect_reason(exc)) from None


async def open_tunnel(up: Upstream, authority: str) -> tuple[trio.SocketStream, bytes]:
    """A CONNECT tunnel to `authority` through `up`; returns the stream and any bytes the
    target already sent after the proxy's answer (a server that speaks first)."""
    stream = await dial(up)
    try:
        await stream.send_all(connect_request(authority, authorization=up.authorization()))
        head = await read_head(stream, role=h11.CLIENT, limit=HEAD_LIMIT)
    except BaseException as exc:
        await trio.aclose_forcefully(stream)
        mapped = _failure(exc, phase="waiting for the CONNECT answer")
        if mapped is exc:
            raise  # Cancelled (a timeout at the call site) and the unexpected, as they are
        raise mapped from None
    assert isinstance(head.event, ResponseHead)
    status = head.event.status_code
    if not 200 <= status < 300:
        await trio.aclose_forcefully(stream)
        raise UpstreamFailed(_status_reason("CONNECT", status), status=status)
    return stream, head.rest


async def read_answer(stream: trio.SocketStream) -> tuple[ResponseHead, bytes]:
    """The head of the proxy's answer to a forwarded plain-http request, and what follows."""
    try:
        head = await read_head(stream, role=h11.CLIENT, limit=HEAD_LIMIT)
    except Exception as exc:
        mapped = _failure(exc, phase="waiting for the answer")
        if mapped is exc:
            raise
        raise mapped from None
    assert isinstance(head.event, ResponseHead)
    return head.event, head.rest


def _failure(exc: BaseException, *, phase: str) -> BaseException:
    """The UpstreamFailed for a library error (anything else, Cancelled included, as is)."""
    if isinstance(exc, PeerClosed):
        return UpstreamFailed(f"proxy closed the connection {phase}")
    if isinstance(exc, BadHead | HeadTooLarge):
        return UpstreamFailed(f"bad HTTP from the proxy {phase}: {exc}")
    if isinstance(exc, trio.BrokenResourceError | OSError):
        return UpstreamFailed(f"connection lost {phase}")
    return exc


def _status_reason(what: str, status: int) -> str:
    if status == 407:
        return f"{what} answered 407: proxy refused the credentials"
    return f"{what} answered {status}"


def _connect_reason(exc: OSError) -> str:
    leaves = _leaves(exc)
    if leaves and all(isinstance(x, ConnectionRefusedError) for x in leaves):
        return "connect refused"
    first = leaves[0] if leaves else exc
    if isinstance(first, OSError) and first.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "proxy unreachable"
    text = first.strerror if isinstance(first, OSError) and first.strerror else str(first)
    return f"connect failed: {text}"


def _leaves(exc: BaseException) -> list[BaseException]:
    # trio.open_tcp_stream raises OSError from a group of the per-address attempts.
    cause = exc.__cause__
    if not isinstance(cause, BaseExceptionGroup):
        return [exc]
    out: list[BaseException] = []
    stack: list[BaseException] = [cause]
    while stack:
        item = stack.pop()
        if isinstance(item, BaseExceptionGroup):
            stack.extend(item.exceptions)
        else:
            out.append(item)
    return out
