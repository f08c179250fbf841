"""Fixtures for the health tests: a trustme CA, TLS targets, Squid and tinyproxy."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio
import trustme

from egressd.health.probe import Prober
from tests.health.peers import (
    ProxyProcess,
    Target,
    find_binary,
    run_squid,
    run_tinyproxy,
    serve_target,
)


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture(scope="session")
def server_ssl(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    return ctx


@pytest.fixture(scope="session")
def prober(ca_file: Path) -> Prober:
    return Prober(ca_file=str(ca_file))


StartTarget = Callable[..., Awaitable[Target]]


@pytest.fixture
def start_target(nursery: trio.Nursery, server_ssl: ssl.SSLContext) -> StartTarget:
    """`await start_target(status=204, tls=True)` serves a target for this test."""

    async def start(status: int = 204, *, tls: bool = True) -> Target:
        target: Target = await nursery.start(serve_target, status, server_ssl if tls else None)
        return target

    return start


def _need(name: str) -> None:
    if find_binary(name) is None:
        pytest.skip(f"{name} is not installed (apt-get install {name})")


@pytest.fixture(scope="session")
def squid() -> Iterator[ProxyProcess]:
    _need("squid")
    with run_squid() as proc:
        yield proc


@pytest.fixture(scope="session")
def squid_deny_all() -> Iterator[ProxyProcess]:
    _need("squid")
    with run_squid(access="deny all") as proc:
        yield proc


@pytest.fixture(scope="session")
def tinyproxy() -> Iterator[ProxyProcess]:
    _need("tinyproxy")
    with run_tinyproxy() as proc:
        yield proc


@pytest.fixture(scope="session")
def tinyproxy_443_only() -> Iterator[ProxyProcess]:
    _need("tinyproxy")
    with run_tinyproxy(connect_ports=(443,)) as proc:
        yield proc
