"""Fixtures of the HTTP tests."""

from __future__ import annotations

import pytest
import trio.testing


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """A trio clock that runs at wall speed and can be jumped forward.

    Real sockets and Hypercorn's timers behave as usual, and `clock.jump(n)`
    moves the lease store's wall clock (derived from trio's) by exactly n.
    """
    return trio.testing.MockClock(rate=1.0)
