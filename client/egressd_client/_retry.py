"""When a call to egressd is tried again, and how long to wait first.

A call is retried on a connection failure and on a 5xx, with capped
exponential backoff and full jitter (many crawler processes must not retry in
step). An acquire is retried only when the failure shows the request never
reached egressd: a lost answer to a granted lease would otherwise take a
second lease while the first holds capacity until its TTL.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

# Failures that prove the request was never sent (connect phase).
UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Failures after sending: the answer was lost.
LOST = (httpx.ReadError, httpx.WriteError, httpx.ReadTimeout, httpx.WriteTimeout,
        httpx.RemoteProtocolError)
RETRIED_STATUSES = frozenset({500, 502, 503, 504})


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How calls to egressd are retried."""

    attempts: int = 3
    """Tries in all, the first included (1 = never retry)."""
    base_delay: float = 0.2
    """Ceiling of the first backoff, seconds; it doubles each retry."""
    max_delay: float = 2.0
    """Longest wait between two tries, seconds (a server's Retry-After too)."""

    def delay(self, retry: int, *, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number `retry` (0-based)."""
        ceiling = min(self.max_delay, self.base_delay * (2 ** retry))
        wait = random.uniform(0, ceiling)  # noqa: S311 - jitter, not a secret
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_delay))
        return wait


def retriable_error(exc: httpx.HTTPError, *, unsent_only: bool) -> bool:
    if isinstance(exc, UNSENT):
        return True
    return not unsent_only and isinstance(exc, LOST)


def retriable_status(status: int) -> bool:
    return status in RETRIED_STATUSES
