"""Relaying bytes both ways between a client and an upstream proxy until both sides are done.

One task per direction, each `receive_some(BUFFER)` then `send_all`: Python
runs once per chunk of up to 256 KiB, never per byte, and a side that stops
reading stops the other side's reads (TCP back-pressure), so a client that
never reads costs one buffer, not the whole download.

Half-close is honoured: EOF from one side is passed on as `send_eof` to the
other, whose answer keeps flowing until it ends too. Any byte either way
pushes one shared idle deadline forward; when it passes, or a side breaks,
the relay ends and the caller closes both streams.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import AsyncGenerator, Awaitable, Callable

import attrs
import trio

from egressd.metrics import GATEWAY_BYTES

BUFFER = 262144
"""Bytes asked for per read: big enough that a fast download costs few Python steps."""

_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)

_UP = GATEWAY_BYTES.labels("upstream")
_DOWN = GATEWAY_BYTES.labels("downstream")


@attrs.define
class RelayResult:
    """How a relay ended and what it moved; `ended` is "closed", "idle" or "broken"."""

    ended: str = "closed"
    upstream_bytes: int = 0
    downstream_bytes: int = 0


_SPLICE = hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")
"""Linux: move tunnel bytes socket → pipe → socket in the kernel, never through Python."""


async def _copy(src: trio.SocketStream, dst: trio.SocketStream) -> AsyncGenerator[int, None]:
    """Relay through user space; yields each chunk's size (0 first: the read started)."""
    while True:
        data = await src.receive_some(BUFFER)
        if not data:
            return
        yield 0
        await dst.send_all(data)
        yield len(data)


async def _splice(src: trio.SocketStream, dst: trio.SocketStream) -> AsyncGenerator[int, None]:
    """Relay with splice(2) through a pipe: the bytes are never copied into Python.

    Both sockets are non-blocking (trio's); each side is waited on with trio's
    own readiness calls, so cancellation and the idle deadline work as for any
    await. One reader and one writer per socket at a time, as trio requires:
    this direction only reads `src` and writes `dst`.
    """
    # The first chunk is copied: most tunnels that end at once (a refused TLS
    # handshake, a short answer) then never pay for a pipe (six syscalls).
    data = await src.receive_some(BUFFER)
    if not data:
        return
    yield 0
    await dst.send_all(data)
    yield len(data)
    src_fd, dst_fd = src.socket.fileno(), dst.socket.fileno()
    pipe_r, pipe_w = os.pipe()
    try:
        with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: the default
            fcntl.fcntl(pipe_w, fcntl.F_SETPIPE_SZ, BUFFER)
        while True:
            await trio.lowlevel.wait_readable(src.socket)
            try:
                n = os.splice(src_fd, pipe_w, BUFFER, flags=_FLAGS)
            except BlockingIOError:
                continue
            if n == 0:
                return  # EOF
            yield 0
            left = n
            while left:
                try:
                    left -= os.splice(pipe_r, dst_fd, left, flags=_FLAGS)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(dst.socket)
            yield n
    finally:
        os.close(pipe_r)
        os.close(pipe_w)


First = Callable[[], Awaitable[tuple[bytes, bool]]]
"""Runs first in the downstream direction: the bytes to send the client, and go on?"""


async def relay(client: trio.SocketStream, upstream: trio.SocketStream, *,
                idle_timeout: float, downstream_first: First | None = None) -> RelayResult:
    """Relay until both directions saw EOF, a side broke, or nothing moved for `idle_timeout`.

    `downstream_first` (a plain-http answer's head, read while the request body
    streams up) runs before the downstream direction relays anything.
    """
    result = RelayResult()
    with trio.CancelScope(deadline=trio.current_time() + idle_timeout) as idle:

        async def pump(src: trio.SocketStream, dst: trio.SocketStream, up: bool) -> None:
            counter = _UP if up else _DOWN
            moved = 0
            try:
                if not up and downstream_first is not None:
                    data, go_on = await downstream_first()
                    await dst.send_all(data)
                    if not go_on:
                        nursery.cancel_scope.cancel()
                        return
                move = _splice if _SPLICE else _copy
                async with contextlib.aclosing(move(src, dst)) as chunks:
                    async for n in chunks:
                        # Any byte either way is activity: push the one idle deadline.
                        idle.deadline = trio.current_time() + idle_timeout
                        counter.inc(n)
                        moved += n
                await dst.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                result.ended = "broken"
                nursery.cancel_scope.cancel()
            finally:
                if up:
                    result.upstream_bytes = moved
                else:
                    result.downstream_bytes = moved

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, upstream, True)
            nursery.start_soon(pump, upstream, client, False)
    if idle.cancelled_caught:
        result.ended = "idle"
    return result
