"""The client's errors, named by what the caller does about them.

`EgressdUnavailable` (egressd could not be reached or kept failing: retry
later, or fall back), `Unauthorized` (the token is wrong: fix the
configuration), `NoProxyAvailable` (the 409: wait its `retry_after`, or widen
the selector), `UnknownLease` (the lease expired long ago: lease again), and
`ApiError` for any other refusal. None of them carries a lease id, a token or
a proxy URL (a proxy URL may hold credentials).
"""

from __future__ import annotations


class EgressdError(Exception):
    """Base class of everything this client raises on its own account."""


class EgressdUnavailable(EgressdError):
    """egressd did not answer (refused, timed out, 5xx) after the client's retries."""


class ApiError(EgressdError):
    """egressd refused the call with `{"error": code, "message": text}`."""

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class Unauthorized(ApiError):
    """401/403: the bearer token is missing or wrong (EGRESSD_TOKEN)."""


class UnknownLease(ApiError):
    """404 on a report: the lease was never issued or expired long ago."""


class NoProxyAvailable(ApiError):
    """409 `no_proxy_available`: no proxy matching the selector is free for the target.

    The counts say why (egressd's breakdown); `retry_after` is the server's
    Retry-After in seconds when it sent one.
    """

    def __init__(
        self, message: str, *, considered: int, unhealthy: int, at_capacity: int,
        in_cooldown: int, retry_after: float | None,
    ) -> None:
        super().__init__(message, status=409, code="no_proxy_available")
        self.considered = considered
        self.unhealthy = unhealthy
        self.at_capacity = at_capacity
        self.in_cooldown = in_cooldown
        self.retry_after = retry_after
