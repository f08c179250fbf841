"""Opening one tunnel through one leased proxy: CONNECT, or a forwarded plain-http request.

For CONNECT the proxy's 2xx becomes the client's `200 Connection
established` with `X-Egressd-Lease` and `X-Egressd-Proxy`. For plain http the
request goes on with the upstream's credentials instead of the client's, and
the gateway reads the answer's status: 429 is reported `rate_limited` (with its
Retry-After), a ban status `banned` (docs/reference.md, issue 15 item 5). A request
without a body has its answer read before the tunnel counts as open, so a 407
or a dead proxy is retried on another one; a request with a body streams it
while the answer is awaited (it cannot be replayed), so there only the dial is
retried.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Awaitable, Callable

import attrs
import h11
import trio

from egressd.gateway import wire
from egressd.gateway.request import Ask
from egressd.gateway.upstream import (
    Upstream,
    UpstreamFailed,
    dial,
    open_tunnel,
    read_answer,
)
from egressd.leases import Grant, Result
from egressd.metrics import GATEWAY_BYTES

# Label lookups once, not per tunnel (issue 15 item 8).
_UP = GATEWAY_BYTES.labels("upstream")
_DOWN = GATEWAY_BYTES.labels("downstream")


@attrs.frozen(kw_only=True)
class TunnelSettings:
    connect_timeout: float
    head_limit: int
    ban_statuses: frozenset[int]


@attrs.define(kw_only=True)
class Opened:
    """A tunnel ready to relay: send `to_client` first, then relay the two streams.

    `answer_head`, when set, must run first in the downstream direction: it
    reads the proxy's answer and returns the bytes for the client (the head
    as forwarded, or a 502) and whether to go on relaying. `report` is an
    outcome to report on the lease (set at open, or by `answer_head`).
    """

    grant: Grant
    stream: trio.SocketStream
    to_client: bytes
    answer_head: Callable[[], Awaitable[tuple[bytes, bool]]] | None = None
    report: Result | None = None
    retry_after: float | None = None

    def take_report(self) -> tuple[Result, float | None] | None:
        """The outcome to report (once), with its Retry-After, or None."""
        report, self.report = self.report, None
        return None if report is None else (report, self.retry_after)


def lease_headers(grant: Grant) -> list[tuple[str, str]]:
    return [("X-Egressd-Lease", grant.lease.id), ("X-Egressd-Proxy", grant.lease.key)]


async def open_upstream(up: Upstream, ask: Ask, rest: bytes, grant: Grant,
                        cfg: TunnelSettings) -> Opened:
    """Open the tunnel for `ask` through `up` within the connect timeout; UpstreamFailed
    if the proxy fails (a timeout included)."""
    try:
        with trio.fail_after(cfg.connect_timeout):
            return await _open(up, ask, rest, grant, cfg)
    except trio.TooSlowError:
        raise UpstreamFailed(f"timeout after {cfg.connect_timeout:g}s opening the tunnel"
                             ) from None


async def _open(up: Upstream, ask: Ask, rest: bytes, grant: Grant,
                cfg: TunnelSettings) -> Opened:
    if ask.connect:
        stream, early = await open_tunnel(up, ask.authority)
        if rest:
            # A client that sent its first bytes (a TLS ClientHello) without waiting.
            await _send(stream, rest)
        # Tunnelled bytes that did not go through the relay count as relayed too.
        _UP.inc(len(rest))
        _DOWN.inc(len(early))
        to_client = wire.answer(200, headers=lease_headers(grant)) + early
        return Opened(grant=grant, stream=stream, to_client=to_client)
    return await _open_forward(up, ask, rest, grant, cfg)


async def _send(stream: trio.SocketStream, data: bytes) -> None:
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, OSError):
        await trio.aclose_forcefully(stream)
        raise UpstreamFailed("connection lost sending the request") from None


def _has_body(req: h11.Request) -> bool:
    length = wire.header(req, b"content-length")
    return wire.header(req, b"transfer-encoding") is not None or (
        length is not None and length.strip() not in (b"", b"0"))


async def _open_forward(up: Upstream, ask: Ask, rest: bytes, grant: Grant,
                        cfg: TunnelSettings) -> Opened:
    stream = await dial(up)
    head = wire.forward_request(ask.request, authorization=up.authorization())
    await _send(stream, head + rest)
    opened = Opened(grant=grant, stream=stream, to_client=b"")
    if _has_body(ask.request):

        async def answer_head() -> tuple[bytes, bool]:
            try:
                with trio.fail_after(cfg.connect_timeout):
                    resp, early = await read_answer(stream)
            except trio.TooSlowError:
                exc = UpstreamFailed(f"timeout after {cfg.connect_timeout:g}s waiting for "
                                     "the answer")
                opened.report = Result.PROXY_ERROR
                return wire.error(502, "upstream_failed", f"proxy {up.key}: {exc.reason}"), False
            except UpstreamFailed as exc:
                opened.report = Result.PROXY_ERROR
                return wire.error(502, "upstream_failed", f"proxy {up.key}: {exc.reason}"), False
            _judge(opened, resp, cfg)
            return wire.forward_response(resp, extra=lease_headers(grant)) + early, True

        opened.answer_head = answer_head
        return opened
    try:
        resp, early = await read_answer(stream)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    if resp.status_code == 407:
        await trio.aclose_forcefully(stream)
        raise UpstreamFailed("answered 407: proxy refused the credentials", status=407)
    _judge(opened, resp, cfg)
    opened.to_client = wire.forward_response(resp, extra=lease_headers(grant)) + early
    return opened


def _judge(opened: Opened, resp: wire.ResponseHead, cfg: TunnelSettings) -> None:
    """What the answer's status says about the proxy for this target."""
    status = resp.status_code
    if status == 429:
        opened.report = Result.RATE_LIMITED
        try:
            opened.retry_after = retry_after(wire.header(resp, b"retry-after"))
        except wire.BadHead:
            opened.retry_after = None  # two Retry-After headers: the store's --cooldown
    elif status in cfg.ban_statuses:
        opened.report = Result.BANNED
    elif status == 407:
        opened.report = Result.PROXY_ERROR


def retry_after(value: bytes | None, *, now: float | None = None) -> float | None:
    """A Retry-After header (seconds or an HTTP date) as seconds from now; None if absent
    or unreadable (the store then applies --cooldown)."""
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None
