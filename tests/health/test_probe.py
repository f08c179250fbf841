"""One probe through one real proxy (Squid, tinyproxy) to a real TLS target on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from egressd.errors import ConfigError
from egressd.health.probe import BadProbeURL, Prober, ProbeTarget, parse_probe_url
from egressd.metrics import REGISTRY
from tests.health.conftest import StartTarget
from tests.health.peers import ProxyProcess, closed_port, serve_silent


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
        assert len(target.requests) == 3
        access = next(squid.log_dir.glob(f"access-{squid.port}.log")).read_text()
        assert access.count(f"CONNECT 127.0.0.1:{target.port}") >= 3


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
])
def test_bad_probe_urls(url: str, reason: str) -> None:
    with pytest.raises(BadProbeURL) as info:
        parse_probe_url(url)
    assert str(info.value) == reason
