"""One probe through one proxy (docs/architecture.md), on trio streams with h11 doing the framing.

An https probe URL goes through an HTTP CONNECT tunnel, then TLS to the target
and a GET inside it; an http one is a GET with the absolute URL, forwarded by
the proxy. Every probe opens a fresh connection (`Connection: close`, no
pooling) so it exercises the proxy itself. Success is a 2xx answer within the
target's timeout; latency is the wall time of the whole probe up to the
answer's status line.

Why not httpx: measured on this machine kind, a probe on raw trio streams ran
~1,450 probes/s per core against ~800-930/s for a fresh httpx client or
transport per probe; the difference is Python inside httpx/httpcore (issue 7).

Failures are values, never exceptions: every library error is mapped here,
once, to a `ProbeResult` with a short reason ("connect refused",
"CONNECT refused: 403", "TLS error: ...", "timeout ...",
"connection closed ...", "unexpected status 503", "bad probe URL: ...").
"""

from __future__ import annotations

import functools
import ssl
import urllib.parse
from typing import Final

import attrs
import h11
import trio

from egressd.errors import ConfigError
from egressd.metrics import PROBE_DURATION, PROBES

USER_AGENT: Final = "egressd-probe/1"

# Read size for the proxy's and the target's answers; a status line plus
# headers fits in one read almost always.
_RECEIVE_SIZE: Final = 16384

# Distinct URLs kept parsed; a fleet uses a handful of probe URLs, so this
# only bounds memory against a pathological spread of URLs.
_URL_CACHE_SIZE: Final = 4096

_VISIBLE_ASCII: Final = "".join(map(chr, range(0x21, 0x7F)))


@attrs.frozen(kw_only=True)
class ProbeTarget:
    """What the health engine needs to know to probe one proxy.

    `key` is opaque to the health package (the reconciler uses
    "namespace/name"); `host`/`port` address the proxy; `url` is probed
    through it. Thresholds are counts of consecutive results (docs/reference.md).
    Out-of-range numbers raise `ValueError` here, at construction: the CRD
    bounds them, and a negative timeout reaching a timer would stop the engine.
    """

    key: str
    host: str
    port: int
    url: str
    interval: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    timeout: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))
    success_threshold: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    failure_threshold: int = attrs.field(default=3, validator=attrs.validators.ge(1))


@attrs.frozen
class ProbeResult:
    """The outcome of one probe: `latency` is seconds of wall time, `reason` a
    short human-readable text (the failure, or the answer's status on success)."""

    ok: bool
    latency: float
    reason: str


@attrs.frozen(kw_only=True)
class ProbeURL:
    """A probe URL parsed once, with everything a probe sends precomputed."""

    https: bool
    host: str  # as written in the URL, brackets stripped: used for SNI and checks
    authority: str  # host:port, IPv6 bracketed: the CONNECT target
    host_header: str  # host[:port] as the Host header carries it
    target: str  # request-target of the GET: origin-form (https) or absolute (http)
    # Built (and so validated by h11) once per URL, not once per probe.
    connect_request: h11.Request | None = attrs.field(eq=False)  # https only
    get_request: h11.Request = attrs.field(eq=False)


class BadProbeURL(ValueError):
    """Raised by `parse_probe_url` when a URL cannot be probed through a proxy.

    The CRD only checks that `probeURL` is a string, so this is user input: the
    engine turns it into a failed probe, never into a crash.
    """


class _PeerClosed(Exception):
    """Raised while reading an answer when the peer closed before sending one."""


class _ProbeFailed(Exception):
    """Raised inside a probe to end it with a failure; `kind` labels the metric."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def parse_probe_url(url: str) -> ProbeURL:
    """Parse and check a probe URL; raises `BadProbeURL` naming what is wrong."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        raise BadProbeURL(f"bad probe URL: {e}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise BadProbeURL(f"bad probe URL: unsupported scheme {parts.scheme!r}")
    host = parts.hostname
    if not host:
        raise BadProbeURL("bad probe URL: no host")
    try:
        # h11 wants ASCII: an internationalised name goes out as its A-label.
        # The codec also refuses empty and over-long labels ("a..b", ".x"),
        # which the ssl module would refuse as SNI in the middle of a probe.
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise BadProbeURL(f"bad probe URL: invalid host {host!r}") from None
    https = scheme == "https"
    default_port = 443 if https else 80
    effective_port = port if port is not None else default_port
    bracketed = f"[{host}]" if ":" in host else host
    host_header = bracketed if effective_port == default_port else f"{bracketed}:{effective_port}"
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    # A request-target is visible ASCII only (RFC 9112); escape the rest
    # (spaces, controls, non-ASCII) as a browser would, keep the rest as written.
    path = urllib.parse.quote(path, safe=_VISIBLE_ASCII)
    authority = f"{bracketed}:{effective_port}"
    target = path if https else f"http://{host_header}{path}"
    try:
        connect = h11.Request(method="CONNECT", target=authority, headers=[
            ("Host", authority), ("User-Agent", USER_AGENT), ("Connection", "close")]
            ) if https else None
        get = h11.Request(method="GET", target=target, headers=[
            ("Host", host_header), ("User-Agent", USER_AGENT), ("Accept", "*/*"),
            ("Connection", "close")])
    except h11.LocalProtocolError:
        # What h11 refuses to send here can only come from the host.
        raise BadProbeURL(f"bad probe URL: invalid host {host!r}") from None
    return ProbeURL(https=https, host=host, authority=authority, host_header=host_header,
                    target=target, connect_request=connect, get_request=get)


@functools.lru_cache(maxsize=_URL_CACHE_SIZE)
def _parse_cached(url: str) -> ProbeURL | BadProbeURL:
    # Caches the failure too, so a bad URL costs one parse, not one per probe.
    try:
        return parse_probe_url(url)
    except BadProbeURL as e:
        return e


def make_ssl_context(ca_file: str | None = None) -> ssl.SSLContext:
    """The client context for probe targets: system roots plus `ca_file`.

    Raises `ConfigError` when the CA file cannot be read or parsed.
    """
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    if ca_file:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"--probe-ca-file {ca_file}: {e}") from e
    return ctx


class Prober:
    """Probes proxies; build one per process (it owns the one SSL context).

    `await prober.probe(target)` never raises for a failed probe, only
    `trio.Cancelled` when its caller is cancelled.
    """

    def __init__(self, *, ca_file: str | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl = ssl_context if ssl_context is not None else make_ssl_context(ca_file)

    async def probe(self, target: ProbeTarget) -> ProbeResult:
        """Probe `target.url` through the proxy at `target.host:target.port`."""
        start = trio.current_time()
        kind = "success"
        try:
            parsed = _parse_cached(target.url)
            if isinstance(parsed, BadProbeURL):
                raise _ProbeFailed("bad_url", str(parsed))
            reason = await self._probe(target, parsed)
        except _ProbeFailed as e:
            kind, reason = e.kind, e.reason
        latency = trio.current_time() - start
        PROBES.labels(result=kind).inc()
        PROBE_DURATION.observe(latency)
        return ProbeResult(kind == "success", latency, reason)

    __call__ = probe

    async def _probe(self, target: ProbeTarget, url: ProbeURL) -> str:
        phase = "connecting to the proxy"
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(target.timeout):
                stream = await _connect(target.host, target.port)
                if url.https:
                    phase = "waiting for the CONNECT answer"
                    await _open_tunnel(stream, url)
                    phase = "in the TLS handshake"
                    tls = trio.SSLStream(stream, self._ssl, server_hostname=url.host,
                                         https_compatible=True)
                    stream = tls
                    await tls.do_handshake()
                phase = "waiting for the answer"
                status = await _get(stream, url)
        except trio.TooSlowError:
            raise _ProbeFailed("timeout", f"timeout after {target.timeout:g}s {phase}") from None
        except _PeerClosed:
            raise _ProbeFailed("connection_lost", f"connection closed {phase}") from None
        except trio.BrokenResourceError as e:
            if isinstance(e.__cause__, ssl.SSLError):
                raise _ProbeFailed("tls_error", f"TLS error: {_ssl_reason(e.__cause__)}") from None
            raise _ProbeFailed("connection_lost", f"connection lost {phase}") from None
        except h11.RemoteProtocolError as e:
            raise _ProbeFailed("protocol_error", f"bad HTTP {phase}: {e}") from None
        except OSError as e:
            raise _ProbeFailed("connection_lost", f"connection lost {phase}: {_os_reason(e)}"
                               ) from None
        finally:
            if stream is not None:
                # The answer is in hand: skip TLS close_notify and the body.
                await trio.aclose_forcefully(stream)
        if not 200 <= status < 300:
            raise _ProbeFailed("bad_status", f"unexpected status {status}")
        return f"status {status}"


async def _connect(host: str, port: int) -> trio.SocketStream:
    try:
        return await trio.open_tcp_stream(host, port)
    except OSError as e:
        leaves = _leaf_errors(e)
        if leaves and all(isinstance(x, ConnectionRefusedError) for x in leaves):
            raise _ProbeFailed("connect_error", "connect refused") from None
        raise _ProbeFailed("connect_error",
                           f"connect failed: {_os_reason(leaves[0] if leaves else e)}") from None


async def _open_tunnel(stream: trio.abc.Stream, url: ProbeURL) -> None:
    assert url.connect_request is not None  # an https URL always has one
    conn = h11.Connection(h11.CLIENT)
    await stream.send_all(_encode(conn, url.connect_request))
    response = await _read_response(conn, stream)
    if not 200 <= response.status_code < 300:
        raise _ProbeFailed("proxy_refused", f"CONNECT refused: {response.status_code}")
    # h11 switches protocol on a 2xx answer to CONNECT; anything after the
    # answer would be tunnelled bytes, and a TLS server never speaks first.
    data, _closed = conn.trailing_data
    if conn.their_state is not h11.SWITCHED_PROTOCOL or data:
        raise _ProbeFailed("protocol_error", "bad HTTP waiting for the CONNECT answer: "
                           "unexpected data after the answer")


async def _get(stream: trio.abc.Stream, url: ProbeURL) -> int:
    conn = h11.Connection(h11.CLIENT)
    await stream.send_all(_encode(conn, url.get_request))
    return (await _read_response(conn, stream)).status_code


def _encode(conn: h11.Connection, request: h11.Request) -> bytes:
    # A bodiless request: h11 frames it and moves to its end-of-message state.
    return (conn.send(request) or b"") + (conn.send(h11.EndOfMessage()) or b"")


async def _read_response(conn: h11.Connection, stream: trio.abc.Stream) -> h11.Response:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(_RECEIVE_SIZE)
            if not data:
                # EOF before a whole answer (h11 would word this after its
                # own state machine: "can't handle event type ConnectionClosed").
                raise _PeerClosed
            conn.receive_data(bytes(data))
        elif isinstance(event, h11.Response):
            return event
        # InformationalResponse (1xx): keep reading for the final answer.


def _leaf_errors(e: BaseException) -> list[BaseException]:
    # trio.open_tcp_stream raises OSError from an ExceptionGroup of the
    # per-address attempts.
    cause = e.__cause__
    if isinstance(cause, BaseExceptionGroup):
        return [leaf for group in [cause] for leaf in _flatten(group)]
    return [e]


def _flatten(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for x in group.exceptions:
        out.extend(_flatten(x) if isinstance(x, BaseExceptionGroup) else [x])
    return out


def _os_reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def _ssl_reason(e: ssl.SSLError) -> str:
    if isinstance(e, ssl.SSLCertVerificationError) and e.verify_message:
        return f"certificate verify failed: {e.verify_message}"
    return e.reason or str(e)
