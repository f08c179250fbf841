"""Typed Kubernetes API errors: one class per way a caller handles an answer.

`error_from_response` maps an HTTP status and body to one of these, once, at
the client boundary; the rest of egressd tests by class (`except NotFound`),
never by status code or message text.
"""

from __future__ import annotations

import json
from typing import Any

from egressd.errors import EgressdError

# How much of a body that is not JSON an error keeps (enough to recognise an
# HTML error page or a proxy's answer, never a whole response).
BODY_PREVIEW_BYTES = 200


class ApiError(EgressdError):
    """The API server answered with an error status.

    `status` is the HTTP status, `reason` the Status object's `reason`
    (`NotFound`, `AlreadyExists`, ...) and `message` its human message.
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    """404: the object (or its namespace) does not exist."""


class Conflict(ApiError):
    """409: a stale resourceVersion on update (or, as `AlreadyExists`, a create clash)."""


class AlreadyExists(Conflict):
    """409 with reason AlreadyExists: create of a name that already exists."""


class Gone(ApiError):
    """410: the requested resourceVersion is older than the server's history (relist)."""


class Forbidden(ApiError):
    """403: RBAC denies the call; retrying cannot help."""


class Unauthorized(ApiError):
    """401 even after re-reading credentials once."""


class Invalid(ApiError):
    """422: the object fails validation (or a JSON patch `test` op failed)."""


class BadRequest(ApiError):
    """400: the request itself is malformed (a bad patch or selector)."""


class TooManyRequests(ApiError):
    """429 after the client's retries ran out; `retry_after` is the server's hint in seconds."""

    def __init__(
        self, status: int, reason: str, message: str, *, retry_after: float | None = None
    ) -> None:
        super().__init__(status, reason, message)
        self.retry_after = retry_after


class ServerError(ApiError):
    """5xx after the client's retries ran out."""


class BadResponse(ApiError):
    """The server answered something that is not the JSON the API promises.

    `body` holds the first bytes of what came back, for the log.
    """

    def __init__(self, status: int, message: str, *, body: bytes) -> None:
        super().__init__(status, "BadResponse", message)
        self.body = body


class ApiUnavailable(EgressdError):
    """The API server could not be reached (connection refused, reset, timed out)."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header given as a number (dates are not used by Kubernetes)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_status(
    status: int, body: dict[str, Any], *, retry_after: float | None = None
) -> ApiError:
    """The typed error for an HTTP status and a decoded `Status` body."""
    reason = str(body.get("reason") or "")
    message = str(body.get("message") or "")
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExists(status, reason, message)
    if status == 429:
        return TooManyRequests(status, reason or "TooManyRequests", message,
                               retry_after=retry_after)
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ApiError
    return cls(status, reason or cls.__name__, message)


def error_from_response(
    status: int, content: bytes, *, retry_after: float | None = None
) -> ApiError:
    """The typed error for an error answer; a body that is not JSON is kept as a preview."""
    try:
        body = json.loads(content) if content else {}
    except ValueError:
        body = None
    if not isinstance(body, dict):
        if status >= 500 or status == 429:
            # A proxy or load balancer in front of the API answered: still retryable.
            err = error_from_status(status, {"message": _preview_text(content)},
                                    retry_after=retry_after)
            return err
        return BadResponse(status, f"HTTP {status} with a body that is not JSON",
                           body=content[:BODY_PREVIEW_BYTES])
    return error_from_status(status, body, retry_after=retry_after)


def bad_json(status: int, content: bytes) -> BadResponse:
    """The error for a success answer whose body is not a JSON object."""
    return BadResponse(status, f"HTTP {status} with a body that is not a JSON object",
                       body=content[:BODY_PREVIEW_BYTES])


def _preview_text(content: bytes) -> str:
    return content[:BODY_PREVIEW_BYTES].decode("utf-8", "replace")
