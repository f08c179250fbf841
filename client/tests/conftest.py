"""Fixtures for the client distribution's tests: `world`, one real egressd for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from client_world import World, running_world

from tests.health.peers import find_binary


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    missing = [name for name in ("squid", "tinyproxy") if find_binary(name) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install {' '.join(missing)})")
    with running_world(tmp_path_factory.mktemp("egressd-world")) as world:
        yield world
