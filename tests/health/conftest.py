"""Fixtures for the health tests: a trustme CA, TLS targets, Squid and tinyproxy."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio
import trustme

from egressd.health.probe import Prober
from tests.health.fixtures import ca, need, server_ssl, squid, tinyproxy
from tests.health.peers import (
    ProxyProcess,
    Target,
    run_squid,
    run_tinyproxy,
    serve_target,
)


@pytest.fixture(scope="session")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture(scope="session")
def prober(ca_file: Path) -> Prober:
    return Prober(ca_file=str(ca_file))


__all__ = ["ca", "server_ssl", "squid", "tinyproxy"]

StartTarget = Callable[..., Awaitable[Target]]


@pytest.fixture
def start_target(nursery: trio.Nursery, server_ssl: ssl.SSLContext) -> StartTarget:
    """`await start_target(status=204, tls=True)` serves a target for this test."""

    async def start(status: int = 204, *, tls: bool = True) -> Target:
        target: Target = await nursery.start(serve_target, status, server_ssl if tls else None)
        return target

    return start


@pytest.fixture(scope="session")
def squid_deny_all() -> Iterator[ProxyProcess]:
    need("squid")
    with run_squid(access="deny all") as proc:
        yield proc


@pytest.fixture(scope="session")
def tinyproxy_443_only() -> Iterator[ProxyProcess]:
    need("tinyproxy")
    with run_tinyproxy(connect_ports=(443,)) as proc:
        yield proc
