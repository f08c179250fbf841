"""Retries, backoff and timeouts of the calls to egressd, against a scripted HTTP server.

egressd does not fail on demand, so these use a loopback server that answers a
script of egressd's own wire forms (503s, a 409 with Retry-After, a hang) and
counts what it received. Everything else is tested against the real daemon.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from egressd_client import (
    ApiError,
    Client,
    EgressdUnavailable,
    NoProxyAvailable,
    RetryPolicy,
    classify,
    is_proxy_failure,
    parse_retry_after,
)
from egressd_client import _sync as sync_module

LEASE = {"leaseId": "L1", "proxyUrl": "http://u%40x:p%3Aw@127.0.0.9:3128",
         "expiresAt": "2030-01-01T00:00:00Z", "activeLeases": 1,
         "proxy": {"namespace": "default", "name": "p1", "host": "127.0.0.9", "port": 3128,
                   "attributes": {}, "healthy": True, "latencyMs": 3, "activeLeases": 1,
                   "maxLeases": 10, "phase": "Ready", "cooldowns": {}}}
NO_PROXY = {"error": "no_proxy_available", "message": "no proxy is free", "considered": 2,
            "unhealthy": 0, "atCapacity": 1, "inCooldown": 1}
HANG = -1


@dataclass
class Scripted:
    """Answers each request with the next (status, body, headers) of `script`."""

    script: list[tuple[int, object, dict[str, str]]]
    seen: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    tls: ssl.SSLContext | None = None


@pytest.fixture
def scripted() -> Iterator[tuple[Scripted, str]]:
    state = Scripted([])

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            state.seen.append(f"{self.command} {self.path}")
            if length := int(self.headers.get("Content-Length") or 0):
                self.rfile.read(length)
            status, body, headers = state.script.pop(0) if state.script else (500, {}, {})
            if status == HANG:
                state.release.wait(10)
                return
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def get_request(self) -> tuple[socket.socket, Any]:
            sock, addr = super().get_request()
            if state.tls is not None:  # handshake in the handler's thread, on first read
                sock = state.tls.wrap_socket(sock, server_side=True,
                                             do_handshake_on_connect=False)
            return sock, addr

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    state.release.set()
    server.shutdown()
    server.server_close()


FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


def test_5xx_is_retried_with_backoff_then_succeeds(scripted: tuple[Scripted, str]) -> None:
    state, url = scripted
    state.script = [(503, {}, {}), (502, {}, {}), (201, LEASE, {})]
    with Client(url, token="t", retry=FAST) as egressd:
        lease = egressd.acquire(target="x.test")
    assert len(state.seen) == 3
    assert lease.proxy.key == "default/p1"
    # The proxy URL (with its credentials) is in no repr.
    assert "p%3Aw" not in repr(lease) and "L1" not in repr(lease)


def test_persistent_5xx_is_one_clear_error(scripted: tuple[Scripted, str]) -> None:
    state, url = scripted
    state.script = [(503, {}, {})] * 3
    with Client(url, token="t", retry=FAST) as egressd, pytest.raises(EgressdUnavailable) as e:
        egressd.acquire()
    assert "answered 503 (3 tries)" in str(e.value)
    assert len(state.seen) == 3


def test_a_lost_answer_to_an_acquire_is_not_retried(scripted: tuple[Scripted, str]) -> None:
    # A second acquire could take a second lease while the first holds capacity.
    state, url = scripted
    state.script = [(HANG, None, {}), (201, LEASE, {})]
    with (Client(url, token="t", timeout=0.3, retry=FAST) as egressd,
          pytest.raises(EgressdUnavailable, match="ReadTimeout")):
        egressd.acquire()
    assert state.seen == ["POST /v1/leases"]


def test_a_lost_answer_to_a_release_is_retried(scripted: tuple[Scripted, str]) -> None:
    state, url = scripted
    state.script = [(HANG, None, {}), (204, None, {})]
    with Client(url, token="t", timeout=0.3, retry=FAST) as egressd:
        egressd.release("L1")
    assert state.seen == ["DELETE /v1/leases/L1"] * 2


def test_wait_sleeps_the_409s_retry_after(scripted: tuple[Scripted, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    state, url = scripted
    state.script = [(409, NO_PROXY, {"Retry-After": "4"}), (201, LEASE, {})]
    slept: list[float] = []
    monkeypatch.setattr(sync_module.time, "sleep", slept.append)
    with Client(url, token="t", retry=FAST) as egressd:
        egressd.acquire(wait=10)
    assert slept == [4.0]


def test_a_409_beyond_the_wait_is_raised_with_its_retry_after(
    scripted: tuple[Scripted, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, url = scripted
    state.script = [(409, NO_PROXY, {"Retry-After": "30"})]
    monkeypatch.setattr(sync_module.time, "sleep", pytest.fail)
    with Client(url, token="t", retry=FAST) as egressd, pytest.raises(NoProxyAvailable) as e:
        egressd.acquire(wait=10)
    error = e.value
    assert (error.retry_after, error.at_capacity, error.in_cooldown) == (30.0, 1, 1)


def test_an_unknown_error_keeps_egressds_code(scripted: tuple[Scripted, str]) -> None:
    state, url = scripted
    state.script = [(400, {"error": "invalid_ttl", "message": "ttlSeconds must be above 0"}, {})]
    with Client(url, token="t", retry=FAST) as egressd, pytest.raises(ApiError) as e:
        egressd.acquire(ttl=-1)
    assert (e.value.status, e.value.code) == (400, "invalid_ttl")
    assert len(state.seen) == 1


@pytest.mark.parametrize(("value", "seconds"), [
    ("120", 120.0), (" 7 ", 7.0), ("-3", 0.0), ("soon", None), ("", None), (None, None),
    (b"5", 5.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), ("nan", None),
])
def test_retry_after_forms(value: str | bytes | None, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds


def test_classify_markers_and_statuses() -> None:
    from egressd_client import Classifier, Result

    class Scrapyish:
        status = 200
        headers = {"Retry-After": b"9"}
        body = b"<html>Please solve this CAPTCHA</html>"

    assert classify(Scrapyish()).result is Result.OK
    custom = Classifier(ban_statuses={403, 503}, ban_markers=["captcha"])
    assert custom(Scrapyish()).result is Result.BANNED
    Scrapyish.status = 503
    assert custom(Scrapyish()).reason == "status 503"
    Scrapyish.status = 429
    assert (custom(Scrapyish()).result, custom(Scrapyish()).retry_after) == (
        Result.RATE_LIMITED, 9.0)


def test_proxy_failures_are_told_from_the_callers_errors() -> None:
    import httpx
    import requests

    assert is_proxy_failure(httpx.ConnectError("refused"))
    assert is_proxy_failure(httpx.ProxyError("407"))
    assert is_proxy_failure(requests.exceptions.ProxyError("tunnel refused"))
    assert is_proxy_failure(requests.exceptions.ConnectTimeout("slow"))
    assert is_proxy_failure(ConnectionRefusedError())
    assert not is_proxy_failure(requests.exceptions.SSLError("bad cert"))
    assert not is_proxy_failure(httpx.UnsupportedProtocol("ftp"))
    assert not is_proxy_failure(KeyError("mine"))


def test_an_https_egressd_with_a_private_ca(scripted: tuple[Scripted, str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    import trustme

    state, url = scripted
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    state.tls = server_context
    https = url.replace("http://", "https://")
    state.script = [(204, None, {})]
    with Client(https, token="t", retry=FAST) as untrusting, pytest.raises(EgressdUnavailable):
        untrusting.release("L1")
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("EGRESSD_CA_FILE", str(ca_file))
    state.script = [(204, None, {})]
    with Client(https, token="t", retry=FAST) as trusting:
        trusting.release("L1")
    assert state.seen == ["DELETE /v1/leases/L1"]


def test_the_distribution_needs_httpx_only() -> None:
    import importlib.metadata
    import subprocess
    import sys

    requires = importlib.metadata.requires("egressd-client") or []
    assert [r for r in requires if "extra ==" not in r] == ["httpx<1,>=0.27"]
    # Importing the client pulls in neither egressd, trio nor Scrapy.
    probe = ("import sys, egressd_client, egressd_client.cli; "
             "print(sorted({'egressd', 'trio', 'scrapy', 'twisted', 'requests'} & "
             "{m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    assert out.strip() == "[]"


async def test_the_async_client_retries_and_times_out_like_the_sync_one(
    scripted: tuple[Scripted, str],
) -> None:
    import trio
    from egressd_client import AsyncClient

    state, url = scripted
    with trio.fail_after(10):
        state.script = [(503, {}, {}), (502, {}, {}), (201, LEASE, {})]
        async with AsyncClient(url, token="t", retry=FAST) as egressd:
            assert (await egressd.acquire()).proxy.key == "default/p1"
        assert len(state.seen) == 3
        state.seen.clear()
        state.script = [(HANG, None, {}), (201, LEASE, {})]
        async with AsyncClient(url, token="t", timeout=0.3, retry=FAST) as egressd:
            with pytest.raises(EgressdUnavailable, match="ReadTimeout"):
                await egressd.acquire()
        assert state.seen == ["POST /v1/leases"]
