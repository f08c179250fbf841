"""The one backoff value: doubling to a cap, jitter within its range, a per-loop count."""

from __future__ import annotations

import random

import pytest

from egressd.backoff import Backoff, Retries


def test_doubles_to_the_cap_without_jitter() -> None:
    backoff = Backoff(1.0, 300.0)
    assert [backoff.delay(n) for n in range(1, 11)] == [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0]
    assert backoff.delay(10_000) == 300.0  # no overflow however long it fails
    assert backoff.delay(0) == 1.0


def test_jitter_stays_in_its_range_and_spreads() -> None:
    backoff = Backoff(0.2, 10.0, jitter=(0.8, 1.2))
    rng = random.Random(7)
    for failures in range(1, 12):
        base = backoff.base(failures)
        delays = {backoff.delay(failures, rng=rng) for _ in range(20)}
        assert all(0.8 * base <= d <= 1.2 * base for d in delays)
        assert len(delays) == 20  # spread, not one fixed value


def test_retries_count_one_loop() -> None:
    retries = Retries(Backoff(0.5, 2.0))
    assert [retries.next() for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]
    retries.reset()
    assert retries.next() == pytest.approx(0.5)
