"""The gateway: an HTTP forward proxy whose every tunnel is a lease (docs/gateway.md).

Per connection, a pipeline of small steps: read the head (bounded, timed),
authenticate (no token, no tunnel: never an open proxy), parse the target,
acquire a lease for it through the `LeaseStore` (so per-target cooldowns and
capacity apply), open the tunnel through the chosen proxy (another proxy on an
upstream failure, reported `proxy_error`, at most `retries` times), answer,
relay, release. A refusal at any step is a `Refusal` value: one answer, one
log line, one metric; no traceback reaches the log.

Shutdown: cancelling `serve` stops accepting at once; tunnels still relaying
get `grace` seconds, then are cancelled, and every lease is released.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Hashable

import attrs
import h11
import trio

from egressd import metrics
from egressd.errors import ConfigError
from egressd.gateway import answers
from egressd.gateway.answers import Refusal
from egressd.gateway.fleet import Fleet
from egressd.gateway.options import BadUsername, ClientOptions, Unauthenticated, authenticate
from egressd.gateway.relay import relay
from egressd.gateway.request import Ask, parse_ask
from egressd.gateway.sessions import Sessions
from egressd.gateway.tunnel import Opened, TunnelSettings, open_upstream
from egressd.gateway.upstream import UpstreamFailed
from egressd.gateway.wire import BadHead, HeadTooLarge, PeerClosed, header, read_head
from egressd.http.serve import DEFAULT_BACKLOG, listen_socket
from egressd.leases import Grant, LeaseStore, Result, UnknownLeaseError
from egressd.settings import Settings

log = logging.getLogger(__name__)

RELEASE_TIMEOUT = 2.0
"""Longest a lease release at a tunnel's end may take (shielded from cancellation)."""

BACKLOG = DEFAULT_BACKLOG
"""Listen backlog of the gateway socket: bursts of tunnel setups queue, not refused."""

ACCEPT_PAUSE = 0.1
"""Seconds the accept loop waits after running out of file descriptors (as trio's does)."""

# Label lookups once, not per tunnel (issue 15 item 8).
_OPENED = {True: metrics.GATEWAY_TUNNELS_OPENED.labels("connect"),
           False: metrics.GATEWAY_TUNNELS_OPENED.labels("http")}

_ACCEPT_PAUSE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


@attrs.frozen(kw_only=True)
class GatewayConfig:
    """The gateway's tunables (flags `--gateway-*`, docs in `Settings`)."""

    retries: int = 2
    max_tunnels: int = 1024
    idle_timeout: float = 300.0
    handshake_timeout: float = 10.0
    connect_timeout: float = 10.0
    lease_ttl: float = 3600.0
    ban_statuses: frozenset[int] = frozenset()
    head_limit: int = 32768
    grace: float = 10.0

    @classmethod
    def from_settings(cls, s: Settings) -> GatewayConfig:
        return cls(retries=s.gateway_retries, max_tunnels=s.gateway_max_tunnels,
                   idle_timeout=s.gateway_idle_timeout,
                   handshake_timeout=s.gateway_handshake_timeout,
                   connect_timeout=s.gateway_connect_timeout, lease_ttl=s.max_lease_ttl,
                   ban_statuses=s.gateway_ban_statuses, grace=s.shutdown_grace)


def listen(addr: str, *, backlog: int = BACKLOG) -> trio.SocketListener:
    """A listener on `addr` (`HOST:PORT` or `:PORT`); ConfigError naming it if taken."""
    sock = listen_socket(addr, backlog=backlog, flag="--gateway-addr")
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))


def listener_url(listener: trio.SocketListener) -> str:
    host, port = listener.socket.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Gateway:
    """One gateway (one per replica); `serve` runs it on a listener until cancelled."""

    def __init__(self, *, fleet: Fleet, store: LeaseStore, token: str,
                 config: GatewayConfig, sessions: Sessions | None = None) -> None:
        if not token:
            raise ConfigError("the gateway needs a discovery token: it is never an open proxy")
        self._fleet = fleet
        self._store = store
        fleet.feed(store)  # the store chooses among the fleet's leasable proxies
        self._token = token
        self._cfg = config
        self._sessions = sessions if sessions is not None else Sessions(idle=300.0)
        self._tunnel = TunnelSettings(connect_timeout=config.connect_timeout,
                                      head_limit=config.head_limit,
                                      ban_statuses=config.ban_statuses)
        self._connections = 0
        self._idle = trio.Event()
        self._idle.set()

    @property
    def connections(self) -> int:
        """Client connections being handled now (handshaking or relaying)."""
        return self._connections

    async def wait_idle(self) -> None:
        """Return once no client connection is being handled (every lease released)."""
        while self._connections:
            await self._idle.wait()

    async def serve(self, listener: trio.SocketListener, *,
                    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept and tunnel until cancelled; `task_status.started` gets the proxy URL."""
        tunnels_scope = trio.CancelScope(shield=True)

        async def run_tunnels(task_status: trio.TaskStatus[trio.Nursery]) -> None:
            # Shielded: our cancellation is a drain (below), not an instant cut.
            with tunnels_scope:
                async with trio.open_nursery() as tunnels:
                    task_status.started(tunnels)
                    await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            tunnels: trio.Nursery = await nursery.start(run_tunnels)
            url = listener_url(listener)
            log.info("gateway listening", extra={"url": url})
            task_status.started(url)
            try:
                async with listener:
                    while True:
                        stream = await self._accept(listener)
                        if self._connections >= 2 * self._cfg.max_tunnels:
                            # Far past the cap: not even a 503 (reading the head costs a
                            # buffer per connection), so memory stays bounded.
                            metrics.GATEWAY_TUNNELS_REFUSED.labels("too_many_tunnels").inc()
                            await trio.aclose_forcefully(stream)
                            continue
                        self._track(+1)
                        tunnels.start_soon(self._handle, stream)
            finally:
                with trio.CancelScope(shield=True) as drain:
                    drain.deadline = trio.current_time() + self._cfg.grace
                    await self.wait_idle()
                tunnels_scope.cancel()

    async def _accept(self, listener: trio.SocketListener) -> trio.SocketStream:
        """The next client; out of file descriptors or memory is a pause, not a crash."""
        while True:
            try:
                return await listener.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_PAUSE:
                    raise
                log.warning("gateway cannot accept; pausing", extra={
                    "error": exc.strerror or str(exc), "pause_s": ACCEPT_PAUSE})
                await trio.sleep(ACCEPT_PAUSE)

    def _track(self, delta: int) -> None:
        self._connections += delta
        if self._connections and self._idle.is_set():
            self._idle = trio.Event()
        elif not self._connections:
            self._idle.set()

    async def _handle(self, stream: trio.SocketStream) -> None:
        peer = _Peer(stream)
        try:
            async with stream:
                await self._serve_one(stream, peer)
        except Exception as exc:  # one line, never a traceback (issue 15 item 6)
            log.warning("gateway connection failed",
                        extra={"client": peer, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            self._track(-1)

    async def _serve_one(self, stream: trio.SocketStream, peer: _Peer) -> None:
        try:
            over = self._connections > self._cfg.max_tunnels
            ask, rest, opts = await self._setup(stream)
            if over:
                raise answers.too_many_tunnels(self._cfg.max_tunnels)
            await self._run(stream, ask, rest, opts, peer)
        except Refusal as refusal:
            metrics.GATEWAY_TUNNELS_REFUSED.labels(refusal.reason).inc()
            log.info("gateway refused", extra={"client": peer, "status": refusal.status,
                                               "reason": refusal.reason,
                                               "detail": refusal.message})
            with trio.move_on_after(self._cfg.handshake_timeout):
                await stream.send_all(refusal.answer())
        except (trio.BrokenResourceError, PeerClosed):
            pass  # the client left during setup: nothing to answer, nothing held

    async def _setup(self, stream: trio.SocketStream) -> tuple[Ask, bytes, ClientOptions]:
        """Read, authenticate and parse the request head, within the handshake timeout."""
        cfg = self._cfg
        try:
            with trio.fail_after(cfg.handshake_timeout):
                head = await read_head(stream, role=h11.SERVER, limit=cfg.head_limit)
        except trio.TooSlowError:
            raise answers.handshake_timeout(cfg.handshake_timeout) from None
        except HeadTooLarge as exc:
            raise answers.head_too_large(str(exc)) from None
        except BadHead as exc:
            raise answers.bad_request(f"malformed request: {exc}") from None
        req = head.event
        assert isinstance(req, h11.Request)
        try:
            # Authentication first: an anonymous client learns nothing, not even a 400.
            opts = authenticate(header(req, b"proxy-authorization"), token=self._token)
        except Unauthenticated as exc:
            raise answers.unauthenticated(str(exc)) from None
        except BadUsername as exc:
            raise answers.bad_username(str(exc)) from None
        except BadHead as exc:
            raise answers.bad_request(str(exc)) from None
        return parse_ask(req), head.rest, opts

    async def _run(self, stream: trio.SocketStream, ask: Ask, rest: bytes,
                   opts: ClientOptions, peer: _Peer) -> None:
        started = trio.current_time()
        session: Hashable | None = (
            (opts.session, tuple(sorted(opts.selector.items()))) if opts.session else None)
        opened = await self._open(ask, rest, opts, session)
        lease = opened.grant.lease
        _OPENED[ask.connect].inc()
        metrics.GATEWAY_TUNNELS_ACTIVE.inc()
        if session is not None:
            self._sessions.opened(session, lease.key)
        try:
            async with opened.stream:
                await self._report_taken(opened, ask.host)  # an answer's status known already
                await stream.send_all(opened.to_client)
                metrics.GATEWAY_SETUP_DURATION.observe(trio.current_time() - started)
                outcome = await relay(stream, opened.stream,
                                      idle_timeout=self._cfg.idle_timeout,
                                      downstream_first=opened.answer_head)
            log.debug("gateway tunnel closed", extra={
                "client": peer, "target": ask.host, "proxy": lease.key, "ended": outcome.ended,
                "up": outcome.upstream_bytes, "down": outcome.downstream_bytes})
            await self._report_taken(opened, ask.host)  # an answer read while relaying
        finally:
            metrics.GATEWAY_TUNNELS_ACTIVE.dec()
            if session is not None:
                self._sessions.closed(session)
            await self._release(lease.id)

    async def _open(self, ask: Ask, rest: bytes, opts: ClientOptions,
                    session: Hashable | None) -> Opened:
        """Lease a proxy and open the tunnel through it, trying others on upstream failure."""
        tried: set[str] = set()
        last = ""
        for attempt in range(self._cfg.retries + 1):
            grant = await self._acquire(ask.host, opts, session, tried)
            if not isinstance(grant, Grant):
                if not tried:
                    raise grant
                break  # every other matching proxy was tried (or none was free)
            lease = grant.lease
            up = self._fleet.upstream(lease.key)
            try:
                if up is None:
                    raise UpstreamFailed("proxy has no address any more")
                return await open_upstream(up, ask, rest, grant, self._tunnel)
            except UpstreamFailed as exc:
                last = f"proxy {lease.key}: {exc.reason}"
                log.info("gateway upstream failed", extra={
                    "proxy": lease.key, "target": ask.host, "attempt": attempt + 1,
                    "reason": exc.reason})
                if up is not None:
                    await self._report(lease.id, Result.PROXY_ERROR, ask.host, None)
            except BaseException:
                # Cancelled (shutdown) or a bug: the lease must not wait for its TTL.
                await self._release(lease.id)
                raise
            tried.add(lease.key)
            await self._release(lease.id)
            if attempt < self._cfg.retries:
                metrics.GATEWAY_UPSTREAM_RETRIES.inc()
        raise answers.upstream_failed(last, attempts=len(tried))

    async def _acquire(self, target: str, opts: ClientOptions, session: Hashable | None,
                       tried: set[str]) -> Grant | Refusal:
        """A lease for `target`: the session's proxy if it is still leasable, else the best."""
        ttl = self._cfg.lease_ttl
        if session is not None:
            kept = self._sessions.proxy(session)
            if kept is not None and kept not in tried:
                outcome = await self._store.acquire(
                    opts.selector, target=target, ttl=ttl, only=kept)
                if isinstance(outcome, Grant):
                    return outcome
        outcome = await self._store.acquire(opts.selector, target=target, ttl=ttl,
                                            exclude=tried)
        if isinstance(outcome, Grant):
            return outcome
        # The discovery API's 409 breakdown: every match that is not leasable is unhealthy.
        considered = self._fleet.count(opts.selector)
        return answers.no_proxy(
            considered=considered,
            unhealthy=considered - len(tried) - outcome.considered,
            at_capacity=outcome.at_capacity, in_cooldown=outcome.in_cooldown)

    async def _report_taken(self, opened: Opened, target: str) -> None:
        taken = opened.take_report()
        if taken is not None:
            await self._report(opened.grant.lease.id, taken[0], target, taken[1])

    async def _report(self, lease_id: str, result: Result, target: str,
                      retry_after: float | None) -> None:
        with contextlib.suppress(UnknownLeaseError):  # expired and forgotten: nothing to say
            await self._store.report(lease_id, result=result, target=target,
                                     retry_after=retry_after)

    async def _release(self, lease_id: str) -> None:
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + RELEASE_TIMEOUT
            await self._store.release(lease_id)


class _Peer:
    """The client's address, read only when a log line needs it (a syscall per tunnel)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            try:
                host, port = self._stream.socket.getpeername()[:2]
                self._text = f"{host}:{port}"
            except OSError:
                self._text = "?"
        return self._text
