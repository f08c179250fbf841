"""Serving an app with Hypercorn inside the caller's nursery, and stopping it gracefully.

`addrs = await nursery.start(serve_app, app, ":8090", grace=10)` returns the
bound URLs (use port 0 in tests). egressd binds and listens itself
(`listen_socket`, also the gateway's), with a backlog sized for bursts:
Hypercorn's default of 100 left 13 % of 4,000 connections opened 500 at a time
unanswered (issue 19). Cancelling the task is the stop: the server
stops accepting, idle keep-alive connections are closed, in-flight requests get
up to `grace` seconds, then whatever is left is cancelled (docs/reference.md).

Known limit: Hypercorn writes to sockets under a cancel shield, so a client
that stops reading a response larger than the socket buffers holds the stop
until the kernel drops that connection; nothing at this layer can close the
socket (Hypercorn keeps it private). The pod's termination grace is the backstop.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from egressd.errors import ConfigError

log = logging.getLogger(__name__)

# After the grace period Hypercorn cancels its own connections; this bounds the
# wait for that (and for Quart's after_serving hooks), except for a shielded write
# to a client that does not read (see above).
_STOP_MARGIN = 1.0

# Scheduler passes with no request in flight before the stop cuts the connections.
_SETTLE_PASSES = 10


class _InFlight:
    """Counts HTTP requests being handled, so a stop waits for those and nothing else.

    Hypercorn's own graceful shutdown waits for connections, and an idle
    keep-alive one (a metrics scraper, a kubelet probe) could hold it for the full
    grace period; counting requests ends the stop as soon as the last one is done.
    """

    def __init__(self, app: Any) -> None:
        self._app = app
        self._count = 0
        self._started = 0
        self._idle = trio.Event()
        self._idle.set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        finishing: trio.Event | None = None

        async def tracked_send(message: Any) -> None:
            nonlocal finishing
            if message["type"] != "http.response.body" or message.get("more_body", False):
                await send(message)
                return
            finishing = trio.Event()
            try:
                await send(message)
            finally:
                finishing.set()

        async def held_receive() -> Any:
            message = await receive()
            if message["type"] == "http.disconnect" and finishing is not None:
                # Hypercorn reports a finished response as a disconnect from inside the
                # final send, then starts the connection's keep-alive timer. Quart-Trio
                # cancels the request on that disconnect, which would kill the timer as
                # it starts (idle connections would never be closed, and would hold
                # Hypercorn's own shutdown): hand the disconnect over once the send is done.
                await finishing.wait()
            return message

        self._count += 1
        self._started += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        try:
            await self._app(scope, held_receive, tracked_send)
        finally:
            self._count -= 1
            if not self._count:
                self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no request is in flight and none has begun for a few scheduler passes.

        A request whose bytes reached the socket just before the stop needs a few
        passes (read, parse, spawn) before it reaches the app and counts; waiting
        for them means such a request is answered instead of cut off.
        """
        quiet, seen = 0, self._started
        while quiet < _SETTLE_PASSES:
            if self._count:
                await self._idle.wait()
                quiet = 0
            elif seen != self._started:
                seen, quiet = self._started, 0
            else:
                await trio.lowlevel.checkpoint()
                quiet += 1


DEFAULT_BACKLOG = 1024
"""Connections the kernel queues for accept; capped by net.core.somaxconn."""

SOMAXCONN = "/proc/sys/net/core/somaxconn"


def effective_backlog(requested: int, *, somaxconn_path: str = SOMAXCONN) -> int:
    """`requested`, capped by the kernel's somaxconn (which the kernel would apply silently)."""
    try:
        with open(somaxconn_path, encoding="ascii") as f:
            cap = int(f.read().strip())
    except (OSError, ValueError):
        return requested  # not Linux, or hidden: the kernel caps it if it must
    return max(1, min(requested, cap))


def listen_socket(addr: str, *, backlog: int = DEFAULT_BACKLOG, flag: str | None = None,
                  somaxconn_path: str = SOMAXCONN) -> socket.socket:
    """A socket bound to `addr` (`HOST:PORT` or `:PORT`) and listening, with `backlog`
    capped by somaxconn; ConfigError (naming `flag` if given) if it cannot be had.

    egressd binds it, not Hypercorn, so a taken port or a foreign address is one clear
    line at start (Hypercorn would raise it inside its own nursery and leak the socket).
    """
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - ":8090" means every interface
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(effective_backlog(backlog, somaxconn_path=somaxconn_path))
    except (OSError, ValueError) as exc:
        sock.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        message = f"{flag} {addr}: cannot listen: {reason}" if flag else (
            f"cannot listen on {addr}: {reason}")
        raise ConfigError(message) from None
    return sock


def hypercorn_config(sock: socket.socket, *, grace: float,
                     backlog: int = DEFAULT_BACKLOG) -> Config:
    """Hypercorn's config for serving on `sock`, which it takes over (fd://)."""
    config = Config()
    # Hypercorn calls listen() again on the socket it is handed, with its own default
    # backlog (100) unless told ours.
    config.backlog = effective_backlog(backlog)
    config.bind = [f"fd://{sock.detach()}"]
    config.graceful_timeout = grace
    config.accesslog = None  # the request-log middleware logs each request once
    config.errorlog = logging.getLogger("egressd.http.hypercorn")
    return config


async def serve_app(
    app: Any,
    addr: str,
    *,
    grace: float,
    backlog: int = DEFAULT_BACKLOG,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `addr` until cancelled; `task_status.started` gets the bound URLs."""
    config = hypercorn_config(listen_socket(addr, backlog=backlog), grace=grace,
                              backlog=backlog)
    in_flight = _InFlight(app)
    shutdown = trio.Event()
    # The server runs shielded so that our cancellation becomes a graceful stop
    # instead of cutting in-flight requests at once; its own deadline, set when
    # the stop begins, still bounds how long the stop may take.
    server_scope = trio.CancelScope(shield=True)

    async def run_server(task_status: trio.TaskStatus[list[str]]) -> None:
        with server_scope:
            await serve(in_flight, config, shutdown_trigger=shutdown.wait,
                        task_status=task_status)

    async with trio.open_nursery() as nursery:
        bound: list[str] = await nursery.start(run_server)
        log.info("listening", extra={"urls": " ".join(bound)})
        task_status.started(bound)
        try:
            await trio.sleep_forever()
        finally:
            shutdown.set()  # Hypercorn stops accepting
            server_scope.deadline = trio.current_time() + grace + _STOP_MARGIN
            with trio.CancelScope(shield=True) as wait_scope:
                wait_scope.deadline = trio.current_time() + grace
                await in_flight.wait_idle()
            # What is left are idle keep-alive connections (or requests past the grace).
            server_scope.cancel()
