"""One probe through one real proxy (Squid, tinyproxy) to a real TLS target on loopback."""

from __future__ import annotations

import ssl
from pathlib import Path

import h11
import pytest
import trio
import trio.testing
import trustme
from hypothesis import given, settings
from hypothesis import strategies as st

from egressd.errors import ConfigError
from egressd.health.probe import (
    BadProbeURL,
    Prober,
    ProbeResult,
    ProbeTarget,
    _parse_cached,
    parse_probe_url,
)
from egressd.metrics import REGISTRY
from tests.health.conftest import StartTarget
from tests.health.peers import (
    ProxyProcess,
    Target,
    closed_port,
    read_head,
    scripted_proxy,
    serve_silent,
    serve_target,
    serve_tcp,
)


def _target(proxy_port: int, url: str, *, timeout: float = 5.0) -> ProbeTarget:
    return ProbeTarget(key="ns/px", host="127.0.0.1", port=proxy_port, url=url, timeout=timeout)


def _count(result: str) -> float:
    return REGISTRY.get_sample_value("egressd_probes_total", {"result": result}) or 0.0


@pytest.mark.squid
async def test_https_probe_through_squid_succeeds(
        squid: ProxyProcess, prober: Prober, start_target: StartTarget) -> None:
    with trio.fail_after(10):
        target = await start_target(204)
        before = _count("success")
        url = f"https://127.0.0.1:{target.port}/generate_204?x=1"
        result = await prober.probe(_target(squid.port, url))
        assert result.ok, result
        assert result.reason == "status 204"
        assert result.latency > 0
        assert _count("success") == before + 1
        [request] = target.requests
        assert request.method == b"GET"
        assert request.target == b"/generate_204?x=1"
        assert (b"host", f"127.0.0.1:{target.port}".encode()) in request.headers
        assert (b"connection", b"close") in request.headers


@pytest.mark.squid
async def test_every_probe_opens_a_fresh_tunnel(
        squid: ProxyProcess, prober: Prober, start_target: StartTarget) -> None:
    with trio.fail_after(10):
        target = await start_target(204)
        url = f"https://127.0.0.1:{target.port}/"
        for _ in range(3):
            assert (await prober.probe(_target(squid.port, url))).ok
        # Three TLS sessions, so three tunnels. (Squid's access log is no
        # witness: it logs a tunnel only after seeing it close, which races
        # with the probe returning.)
        assert len(target.requests) == 3


async def test_no_connection_is_reused_even_when_the_proxy_keeps_it_open(
        prober: Prober, nursery: trio.Nursery) -> None:
    requests_per_connection: list[int] = []

    async def keep_alive_proxy(stream: trio.SocketStream) -> None:
        # Answers every forwarded GET and leaves the connection open for more.
        requests_per_connection.append(0)
        connection = len(requests_per_connection) - 1
        while await read_head(stream):
            requests_per_connection[connection] += 1
            await stream.send_all(b"HTTP/1.1 204 No Content\r\n\r\n")

    with trio.fail_after(10):
        port = await nursery.start(serve_tcp, keep_alive_proxy)
        for _ in range(3):
            assert (await prober.probe(_target(port, "http://t.example/"))).ok
        assert requests_per_connection == [1, 1, 1]


@pytest.mark.tinyproxy
async def test_https_probe_through_tinyproxy_succeeds(
        tinyproxy: ProxyProcess, prober: Prober, start_target: StartTarget) -> None:
    with trio.fail_after(10):
        target = await start_target(204)
        result = await prober.probe(_target(tinyproxy.port, f"https://localhost:{target.port}/"))
        assert result.ok, result
        assert len(target.requests) == 1


@pytest.mark.squid
async def test_http_probe_is_forwarded_by_squid(
        squid: ProxyProcess, prober: Prober, start_target: StartTarget) -> None:
    with trio.fail_after(10):
        target = await start_target(204, tls=False)
        result = await prober.probe(_target(squid.port, f"http://127.0.0.1:{target.port}/gen"))
        assert result.ok, result
        [request] = target.requests
        assert request.target == b"/gen"


@pytest.mark.tinyproxy
async def test_http_probe_is_forwarded_by_tinyproxy(
        tinyproxy: ProxyProcess, prober: Prober, start_target: StartTarget) -> None:
    with trio.fail_after(10):
        target = await start_target(200, tls=False)
        result = await prober.probe(_target(tinyproxy.port, f"http://127.0.0.1:{target.port}/"))
        assert result.ok, result
        assert result.reason == "status 200"


@pytest.mark.squid
async def test_squid_acl_refuses_connect(
        squid_deny_all: ProxyProcess, prober: Prober, start_target: StartTarget) -> None:
    with trio.fail_after(10):
        target = await start_target(204)
        before = _count("proxy_refused")
        result = await prober.probe(
            _target(squid_deny_all.port, f"https://127.0.0.1:{target.port}/"))
        assert not result.ok
        assert result.reason == "CONNECT refused: 403"
        assert _count("proxy_refused") == before + 1
        assert target.requests == []


@pytest.mark.tinyproxy
async def test_tinyproxy_connect_port_restriction_refuses_connect(
        tinyproxy_443_only: ProxyProcess, prober: Prober, start_target: StartTarget) -> None:
    with trio.fail_after(10):
        target = await start_target(204)
        result = await prober.probe(
            _target(tinyproxy_443_only.port, f"https://127.0.0.1:{target.port}/"))
        assert not result.ok
        assert result.reason == "CONNECT refused: 403"


@pytest.mark.squid
async def test_target_answering_503_fails(
        squid: ProxyProcess, prober: Prober, start_target: StartTarget) -> None:
    with trio.fail_after(10):
        target = await start_target(503)
        result = await prober.probe(_target(squid.port, f"https://127.0.0.1:{target.port}/"))
        assert not result.ok
        assert result.reason == "unexpected status 503"


@pytest.mark.squid
async def test_untrusted_target_certificate_is_a_tls_error(
        squid: ProxyProcess, start_target: StartTarget) -> None:
    with trio.fail_after(10):
        target = await start_target(204)
        result = await Prober().probe(_target(squid.port, f"https://127.0.0.1:{target.port}/"))
        assert not result.ok
        assert result.reason.startswith("TLS error: certificate verify failed"), result.reason


async def test_dead_proxy_is_connect_refused(prober: Prober) -> None:
    with trio.fail_after(10):
        before = _count("connect_error")
        result = await prober.probe(_target(closed_port(), "https://127.0.0.1:1/"))
        assert result == type(result)(False, result.latency, "connect refused")
        assert _count("connect_error") == before + 1


async def test_proxy_that_hangs_times_out(prober: Prober, nursery: trio.Nursery) -> None:
    with trio.fail_after(10):
        port = await nursery.start(serve_silent)
        before = _count("timeout")
        result = await prober.probe(_target(port, "https://127.0.0.1:1/", timeout=0.3))
        assert not result.ok
        assert result.reason == "timeout after 0.3s waiting for the CONNECT answer"
        assert result.latency >= 0.3
        assert _count("timeout") == before + 1


async def test_bad_scheme_is_a_failed_probe_not_an_exception(prober: Prober) -> None:
    with trio.fail_after(10):
        result = await prober.probe(_target(closed_port(), "ftp://example.org/"))
        assert not result.ok
        assert result.reason == "bad probe URL: unsupported scheme 'ftp'"


def test_bad_ca_file_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigError, match="--probe-ca-file"):
        Prober(ca_file=str(bad))
    with pytest.raises(ConfigError, match="--probe-ca-file"):
        Prober(ca_file=str(tmp_path / "missing.pem"))


@pytest.mark.parametrize(("url", "authority", "host_header", "target"), [
    ("https://www.gstatic.com/generate_204", "www.gstatic.com:443", "www.gstatic.com",
     "/generate_204"),
    ("https://h:8443", "h:8443", "h:8443", "/"),
    ("HTTPS://[::1]:9/a?b=c#frag", "[::1]:9", "[::1]:9", "/a?b=c"),
    ("http://h/x?y", "h:80", "h", "http://h/x?y"),
    ("http://bücher.example/", "xn--bcher-kva.example:80", "xn--bcher-kva.example",
     "http://xn--bcher-kva.example/"),
])
def test_probe_url_parsing(url: str, authority: str, host_header: str, target: str) -> None:
    parsed = parse_probe_url(url)
    assert (parsed.authority, parsed.host_header, parsed.target) == (
        authority, host_header, target)


@pytest.mark.parametrize(("url", "reason"), [
    ("ftp://example.org/", "bad probe URL: unsupported scheme 'ftp'"),
    ("example.org/generate_204", "bad probe URL: unsupported scheme ''"),
    ("https:///path", "bad probe URL: no host"),
    ("https://h:99999/", "bad probe URL: Port out of range 0-65535"),
    ("https://.:443/", "bad probe URL: invalid host '.'"),
    ("https://a..b/", "bad probe URL: invalid host 'a..b'"),
    (f"http://{'x' * 64}.example/", f"bad probe URL: invalid host '{'x' * 64}.example'"),
    ("https://a b/", "bad probe URL: invalid host 'a b'"),
])
def test_bad_probe_urls(url: str, reason: str) -> None:
    with pytest.raises(BadProbeURL) as info:
        parse_probe_url(url)
    assert str(info.value) == reason


# --- misbehaving proxies: h11 framing of the CONNECT answer -----------------

@pytest.mark.parametrize(("reply", "reason"), [
    (b"", "connection closed waiting for the CONNECT answer"),
    (b"HTTP/1.1 200 Conn", "connection closed waiting for the CONNECT answer"),
    (b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 5\r\n\r\nhello",
     "CONNECT refused: 407"),
    (b"HTTP/1.1 200 OK\r\n\r\nnot TLS", "bad HTTP waiting for the CONNECT answer: "
     "unexpected data after the answer"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "bad HTTP waiting for the CONNECT answer: "),
    # A 2xx switches protocols: what follows is the tunnel, here closed at once.
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", "TLS error: "),
])
async def test_connect_answer_framing(prober: Prober, nursery: trio.Nursery,
                                      reply: bytes, reason: str) -> None:
    with trio.fail_after(10):
        port = await nursery.start(serve_tcp, scripted_proxy(reply))
        result = await prober.probe(_target(port, "https://localhost:1/"))
        assert not result.ok
        assert result.reason.startswith(reason), result.reason


async def test_connect_refusal_is_read_without_waiting_for_its_body(
        prober: Prober, nursery: trio.Nursery) -> None:
    with trio.fail_after(10):
        # Headers promise a body that never comes; the status line decides.
        reply = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 100000\r\n\r\n<html>"
        port = await nursery.start(serve_tcp, scripted_proxy(reply, then_hang=True))
        before = _count("proxy_refused")
        result = await prober.probe(_target(port, "https://localhost:1/", timeout=5.0))
        assert result.reason == "CONNECT refused: 403"
        assert _count("proxy_refused") == before + 1


async def test_one_timeout_covers_the_whole_probe(
        prober: Prober, nursery: trio.Nursery, mock_clock: trio.testing.MockClock) -> None:
    # Virtual time moves only when the test jumps it: 0.6 s waiting for the
    # CONNECT answer plus 0.5 s in the TLS handshake exceed a 1 s timeout,
    # though neither phase does on its own.
    asked, answer, hello = trio.Event(), trio.Event(), trio.Event()

    async def slow_proxy(stream: trio.SocketStream) -> None:
        await read_head(stream)
        asked.set()
        await answer.wait()
        await stream.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        assert await stream.receive_some(4096)  # the ClientHello
        hello.set()
        await trio.sleep_forever()

    results: list[ProbeResult] = []
    with trio.fail_after(10):
        port = await nursery.start(serve_tcp, slow_proxy)
        async with trio.open_nursery() as inner:
            async def run() -> None:
                results.append(await prober.probe(_target(port, "https://localhost:1/",
                                                          timeout=1.0)))
            inner.start_soon(run)
            await asked.wait()
            mock_clock.jump(0.6)
            answer.set()
            await hello.wait()
            mock_clock.jump(0.5)
    [result] = results
    assert result.reason == "timeout after 1s in the TLS handshake"
    assert result.latency == pytest.approx(1.1)


@pytest.mark.squid
async def test_target_that_never_speaks_tls_times_out_through_squid(
        squid: ProxyProcess, prober: Prober, nursery: trio.Nursery) -> None:
    with trio.fail_after(10):
        port = await nursery.start(serve_silent)
        result = await prober.probe(_target(squid.port, f"https://127.0.0.1:{port}/",
                                            timeout=0.5))
        assert result.reason == "timeout after 0.5s in the TLS handshake"


@pytest.mark.tinyproxy
async def test_target_answering_503_through_tinyproxy_fails(
        tinyproxy: ProxyProcess, prober: Prober, start_target: StartTarget) -> None:
    with trio.fail_after(10):
        target = await start_target(503)
        result = await prober.probe(_target(tinyproxy.port,
                                            f"https://127.0.0.1:{target.port}/"))
        assert result == ProbeResult(False, result.latency, "unexpected status 503")


# --- TLS: SNI, hostname verification, the configured CA plus system roots ---

def _server_context(ca: trustme.CA, *names: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(ctx)
    return ctx


@pytest.mark.squid
async def test_tls_sends_the_url_host_as_sni(
        squid: ProxyProcess, prober: Prober, ca: trustme.CA, nursery: trio.Nursery) -> None:
    with trio.fail_after(10):
        ctx = _server_context(ca, "localhost")
        names: list[str | None] = []
        ctx.sni_callback = lambda _obj, name, _ctx: names.append(name)
        target: Target = await nursery.start(serve_target, 204, ctx)
        result = await prober.probe(_target(squid.port, f"https://localhost:{target.port}/"))
        assert result.ok, result
        assert names == ["localhost"]


@pytest.mark.squid
async def test_certificate_for_another_name_is_a_tls_error(
        squid: ProxyProcess, prober: Prober, ca: trustme.CA, nursery: trio.Nursery) -> None:
    with trio.fail_after(10):
        target: Target = await nursery.start(serve_target, 204,
                                             _server_context(ca, "other.example"))
        result = await prober.probe(_target(squid.port, f"https://localhost:{target.port}/"))
        assert result.reason.startswith(
            "TLS error: certificate verify failed: Hostname mismatch"), result.reason
        assert target.requests == []


@pytest.mark.squid
async def test_probe_ca_adds_to_the_system_roots(
        squid: ProxyProcess, ca: trustme.CA, ca_file: Path, nursery: trio.Nursery,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # OpenSSL reads its default trust store from SSL_CERT_FILE: here it stands
    # for the system roots, a second CA the probe CA file does not contain.
    system_ca = trustme.CA()
    system_ca.cert_pem.write_to_path(str(tmp_path / "system.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "system.pem"))
    prober = Prober(ca_file=str(ca_file))
    with trio.fail_after(10):
        private: Target = await nursery.start(serve_target, 204, _server_context(ca, "localhost"))
        public: Target = await nursery.start(serve_target, 204,
                                             _server_context(system_ca, "localhost"))
        for t in (private, public):
            result = await prober.probe(_target(squid.port, f"https://localhost:{t.port}/"))
            assert result.ok, result
        # Without the probe CA only the "system" one is trusted.
        result = await Prober().probe(
            _target(squid.port, f"https://localhost:{private.port}/"))
        assert result.reason.startswith("TLS error: certificate verify failed"), result.reason


async def test_unsendable_characters_in_the_url(prober: Prober) -> None:
    # The path is escaped as a browser would; a host h11 cannot send is a bad URL.
    assert parse_probe_url("https://h/a b/\x01é?q=a b").target == "/a%20b/%01%C3%A9?q=a%20b"
    with trio.fail_after(10):
        result = await prober.probe(_target(closed_port(), "https://a b/"))
        assert result == ProbeResult(False, result.latency, "bad probe URL: invalid host 'a b'")


async def test_a_probe_url_is_parsed_once_not_per_probe(prober: Prober) -> None:
    # Issue 7: nothing but the connection itself is rebuilt per probe.
    url = "https://parsed-once.example/"
    with trio.fail_after(10):
        before = _parse_cached.cache_info()
        for _ in range(3):
            await prober.probe(_target(closed_port(), url))
        after = _parse_cached.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 2)


_CLIENT_SSL = ssl.create_default_context()


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["http://", "https://", "HTTPS://", "ftp://", ""]), st.text(max_size=40))
def test_any_probe_url_is_sendable_or_a_bad_url(prefix: str, rest: str) -> None:
    # The CRD lets almost any string through: it must never reach h11 or the
    # ssl module in a form they refuse in the middle of a probe.
    try:
        url = parse_probe_url(prefix + rest)
    except BadProbeURL:
        return
    for request in (url.connect_request, url.get_request):
        if request is not None:
            conn = h11.Connection(h11.CLIENT)
            conn.send(request)
            conn.send(h11.EndOfMessage())
    if url.https:
        _CLIENT_SSL.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname=url.host)
