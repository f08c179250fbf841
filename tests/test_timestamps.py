"""The one RFC 3339 formatter: UTC with Z, at the precision each API field wants."""

from __future__ import annotations

import datetime as dt

import pytest

from egressd.timestamps import format_time, format_wall, now, parse_time

WHEN = dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)


@pytest.mark.parametrize(("precision", "text"), [
    ("auto", "2024-05-01T10:00:00.123456Z"),
    ("seconds", "2024-05-01T10:00:00Z"),
    ("milli", "2024-05-01T10:00:00.123Z"),
    ("micro", "2024-05-01T10:00:00.123456Z"),
])
def test_precisions(precision: str, text: str) -> None:
    assert format_time(WHEN, precision=precision) == text  # type: ignore[arg-type]
    assert parse_time(text) == WHEN.replace(microsecond=parse_time(text).microsecond)


def test_whole_seconds_and_walls() -> None:
    whole = WHEN.replace(microsecond=0)
    assert format_time(whole) == "2024-05-01T10:00:00Z"
    assert format_time(whole, precision="micro") == "2024-05-01T10:00:00.000000Z"
    assert format_wall(whole.timestamp()) == "2024-05-01T10:00:00Z"
    assert parse_time(now(precision="micro")).tzinfo is dt.UTC
