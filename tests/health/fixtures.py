"""Session fixtures shared by the tests that need real proxies and TLS targets.

The health and gateway conftests import these, so both suites start their Squid,
tinyproxy and trustme CA the same way (each conftest gets its own instances).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest
import trustme

from tests.health.peers import ProxyProcess, find_binary, run_squid, run_tinyproxy


def need(name: str) -> None:
    """Skip the test when a peer binary is missing (CI=true turns this skip into a failure)."""
    if find_binary(name) is None:
        pytest.skip(f"{name} is not installed (apt-get install {name})")


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def server_ssl(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    return ctx


@pytest.fixture(scope="session")
def client_ssl(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


@pytest.fixture(scope="session")
def squid() -> Iterator[ProxyProcess]:
    need("squid")
    with run_squid() as proc:
        yield proc


@pytest.fixture(scope="session")
def tinyproxy() -> Iterator[ProxyProcess]:
    need("tinyproxy")
    with run_tinyproxy() as proc:
        yield proc
