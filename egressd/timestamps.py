"""RFC 3339 timestamps, read and written once for every layer.

Written always in UTC with "Z". `format_time` writes fractional seconds only
when there are any (metav1.Time); `precision="seconds"` drops them (Event
times) and `precision="micro"` always writes six digits (metav1.MicroTime, the
Lease's renewTime); `"milli"` three (log lines). Reading accepts any offset
and Go's nine fraction digits.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Literal

Precision = Literal["auto", "seconds", "milli", "micro"]

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


def parse_time(value: str) -> dt.datetime:
    """An RFC 3339 timestamp as an aware UTC datetime; ValueError if it is not one."""
    if _RFC3339.match(value):
        text = value.replace("z", "Z").replace("t", "T")
        # fromisoformat accepts at most 6 fraction digits; Go may write 9.
        text = re.sub(r"(\.\d{6})\d+", r"\1", text)
        try:
            return dt.datetime.fromisoformat(text).astimezone(dt.UTC)
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not an RFC 3339 timestamp")


def format_time(value: dt.datetime, *, precision: Precision = "auto") -> str:
    """`value` as RFC 3339 in UTC with "Z" (see the module docstring for `precision`)."""
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: timestamps must be timezone-aware")
    utc = value.astimezone(dt.UTC)
    if precision == "milli":
        return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
    if precision == "micro" or (precision == "auto" and utc.microsecond):
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def format_wall(seconds: float, *, precision: Precision = "auto") -> str:
    """A `time.time()` value as RFC 3339 (see `format_time`)."""
    return format_time(dt.datetime.fromtimestamp(seconds, tz=dt.UTC), precision=precision)


def now(*, precision: Precision = "auto") -> str:
    """The current wall-clock time as RFC 3339 (see `format_time`)."""
    return format_time(dt.datetime.now(dt.UTC), precision=precision)
