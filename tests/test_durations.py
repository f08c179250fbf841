"""Durations as flags read them: `30s`, `5m`, `1h`, combinations and bare seconds."""

import pytest

from egressd.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("45", 45.0),
        ("0", 0.0),
        (" 2m ", 120.0),
        ("1d", 86400.0),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "5x", "m5", "-5", "-5s", "5m junk", "1h-30m", "nan", "inf", "s"]
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"), [(90, "1m30s"), (3600, "1h"), (0, "0s"), (0.5, "0.5s")]
)
def test_format_round_trips(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
