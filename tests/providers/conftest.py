"""Fixtures for the provider tests: the fake Compute Engine server and a GCP provider on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
from google.auth.credentials import AnonymousCredentials

from egressd.providers.config import GcpConfig
from egressd.providers.gcp import GcpProvider
from tests.providers.fake_compute import FakeCompute

PROJECT = "test-project"
ZONE = "europe-west1-b"


@pytest.fixture
def gcp_config() -> GcpConfig:
    return GcpConfig(
        project=PROJECT, zone=ZONE, machine_type="e2-micro",
        image="projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64",
        network="default", network_tags=("egressd-proxy",))


@pytest.fixture
async def fake_compute(nursery: trio.Nursery) -> FakeCompute:
    fake = FakeCompute()
    await nursery.start(fake.serve)
    return fake


@pytest.fixture
def gcp_factory(fake_compute: FakeCompute,
                gcp_config: GcpConfig) -> Iterator[Callable[..., GcpProvider]]:
    """Build GCP providers on the fake server; their connections are closed after the test."""
    made: list[GcpProvider] = []

    def make(**kwargs: Any) -> GcpProvider:
        kwargs = {"api_endpoint": fake_compute.endpoint, "operation_poll_interval": 0.01,
                  "config": gcp_config, **kwargs}
        provider = GcpProvider(kwargs.pop("config"), credentials=AnonymousCredentials(),
                               **kwargs)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.close()


@pytest.fixture
def gcp(gcp_factory: Callable[..., GcpProvider]) -> GcpProvider:
    return gcp_factory(limiter=trio.CapacityLimiter(4))
