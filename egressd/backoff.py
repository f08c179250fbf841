"""One backoff value for every retry loop: exponential, capped, optionally jittered.

`Backoff(initial, maximum, jitter=(low, high))` says how long to wait after
the n-th consecutive failure: `initial` doubling up to `maximum`, times a
uniform factor in `[low, high]`. It is a value (frozen, no state): the API
client's retries count their own attempts, the work queue keeps a count per
key, and `Retries` counts for a single loop (the informer's relists).
"""

from __future__ import annotations

import random

import attrs

_RNG = random.Random()  # noqa: S311 - jitter, not crypto


@attrs.frozen
class Backoff:
    """How long to wait after a run of failures (see the module docstring)."""

    initial: float
    """The delay after the first failure."""
    maximum: float
    """The delay never grows past this (before jitter)."""
    jitter: tuple[float, float] = (1.0, 1.0)
    """The delay is multiplied by a uniform factor in [low, high]; (1, 1) is none.
    Jitter spreads replicas or keys that failed together, so they retry apart."""
    multiplier: float = 2.0

    def base(self, failures: int) -> float:
        """The delay after `failures` consecutive failures (1: the first), without jitter."""
        exponent = min(max(failures - 1, 0), 62)  # 2**62 s is past any maximum
        return float(min(self.initial * self.multiplier ** exponent, self.maximum))

    def delay(self, failures: int, *, rng: random.Random | None = None) -> float:
        """`base(failures)` with the jitter applied."""
        low, high = self.jitter
        base = self.base(failures)
        if low == high:
            return base * low
        return base * (rng or _RNG).uniform(low, high)


@attrs.define
class Retries:
    """A count of consecutive failures for one loop, against one `Backoff`."""

    backoff: Backoff
    failures: int = 0

    def next(self) -> float:
        """Count a failure; the delay to wait before the next try."""
        self.failures += 1
        return self.backoff.delay(self.failures)

    def reset(self) -> None:
        """A success: the next failure waits `initial` again."""
        self.failures = 0
