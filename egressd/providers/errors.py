"""The error kinds every provider raises, so callers handle them by kind (docs/providers.md).

A provider maps its library's errors to these once, at its boundary. Callers
branch with `isinstance` (or the predicates below), never on a message:

* `NotFound` — the instance does not exist;
* `Permanent` — the request can never succeed as made (bad input, forbidden);
  `NotConfigured`, one kind of it, when the fault is this daemon's
  configuration (no such provider, no credentials or permission), not the request;
* `QuotaExceeded` — out of quota or capacity: retry after `retry_after` (5 min);
* `Transient` — anything else: retry with exponential backoff.

Errors compose: the library error that caused one is its `__cause__` (raise
`Transient(...) from exc`), so a transient error still carries what went
wrong underneath, and an error a provider did not map is treated as
transient too (`is_transient`).
"""

from __future__ import annotations

from egressd.errors import EgressdError

# docs/providers.md: "QuotaExceeded (retry after 5 min)".
QUOTA_RETRY_AFTER = 300.0


class ProviderError(EgressdError):
    """Base of every error a provider raises on purpose.

    `retry_after` is a hint in seconds for when a retry may succeed, or None.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    @property
    def cause(self) -> BaseException | None:
        """The library error this one was mapped from, if any."""
        return self.__cause__


class NotFound(ProviderError):
    """The instance named by a provider ID does not exist (or the ID cannot name one)."""


class Permanent(ProviderError):
    """Retrying cannot help: the request is invalid, forbidden, or cannot be honoured.

    The message names the field at fault when there is one
    (`placement.zone: 'europe' is not a zone`).
    """


class NotConfigured(Permanent):
    """The daemon's configuration cannot serve the request: the provider is unknown, or
    lacks credentials or permission. A daemon configured otherwise may succeed with the
    very same request, so callers must not hold it against the request itself.
    """


class QuotaExceeded(ProviderError):
    """The provider is out of quota or capacity (GCP quota, a zone's exhausted pool).

    Retry after `retry_after` seconds (5 min unless the provider knows better).
    """

    def __init__(self, message: str, *, retry_after: float | None = QUOTA_RETRY_AFTER) -> None:
        super().__init__(message, retry_after=retry_after)


class Transient(ProviderError):
    """A failure that may pass (timeout, 429, 5xx, connection refused): back off and retry.

    `retry_after` carries the server's Retry-After hint when it sent one.
    """


class UnknownProvider(NotConfigured):
    """A Proxy names a provider that the providers config does not list."""


def is_not_found(exc: BaseException) -> bool:
    """True if `exc` says the instance does not exist."""
    return isinstance(exc, NotFound)


def is_permanent(exc: BaseException) -> bool:
    """True if retrying the same request cannot help."""
    return isinstance(exc, Permanent)


def is_not_configured(exc: BaseException) -> bool:
    """True if the daemon's configuration, not the request, is at fault."""
    return isinstance(exc, NotConfigured)


def is_quota(exc: BaseException) -> bool:
    """True if the provider is out of quota or capacity (retry after `retry_after`)."""
    return isinstance(exc, QuotaExceeded)


def is_transient(exc: BaseException) -> bool:
    """True for every error that is not NotFound, Permanent or QuotaExceeded (docs/providers.md).

    An unmapped exception counts as transient: backing off is the safe default.
    """
    return isinstance(exc, Exception) and not isinstance(exc, NotFound | Permanent | QuotaExceeded)
