"""Parsing and printing durations such as `30s`, `5m`, `1h30m`."""

import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Return seconds for `30s`, `5m`, `1h`, `1h30m`, `250ms` or a bare number of seconds.

    Raises ValueError with a message fit for a user on anything else,
    including negative values.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    try:
        value = float(s)
    except ValueError:
        pos, total = 0, 0.0
        for m in _PART.finditer(s):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _UNIT[m.group(2)]
            pos = m.end()
        if pos != len(s) or pos == 0:
            raise ValueError(f"invalid duration {text!r} (use e.g. 30s, 5m, 1h)") from None
        return total
    if value < 0 or value != value or value == float("inf"):
        raise ValueError(f"invalid duration {text!r} (must be a finite number of seconds >= 0)")
    return value


def format_duration(seconds: float) -> str:
    """Print seconds the way `parse_duration` reads them back (`90` → `1m30s`)."""
    if seconds != int(seconds):
        return f"{seconds:g}s"
    rest = int(seconds)
    out = ""
    for unit, size in (("h", 3600), ("m", 60)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    if rest or not out:
        out += f"{rest}s"
    return out
