"""API errors as the real API server reports them: an HTTP code plus a `Status` body.

Handlers raise `ApiError`; the HTTP layer turns it into the response. The
constructors below copy the reasons and message shapes of kube-apiserver so a
client under test sees exactly what it would see against a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ApiError(Exception):
    """Raised anywhere in request handling to answer with a `Status` failure body."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = tuple(headers)

    def status(self) -> dict[str, Any]:
        """The `Status` object of this error (also used in watch ERROR events)."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def qualified(plural: str, group: str) -> str:
    """`proxies.crawl.example.com` for a group, `pods` for the core group."""
    return f"{plural}.{group}" if group else plural


def _details(name: str, group: str, kind: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return details


def not_found(plural: str, group: str, name: str) -> ApiError:
    """The object (or its namespace) does not exist."""
    return ApiError(404, "NotFound", f'{qualified(plural, group)} "{name}" not found',
                    details=_details(name, group, plural))


def not_found_path(path: str) -> ApiError:
    """No resource is served at this path."""
    return ApiError(404, "NotFound", "the server could not find the requested resource",
                    details={"causes": [{"reason": "UnexpectedServerResponse",
                                         "message": f"404 page not found: {path}"}]})


def already_exists(plural: str, group: str, name: str) -> ApiError:
    """Create of a name that is taken."""
    return ApiError(409, "AlreadyExists", f'{qualified(plural, group)} "{name}" already exists',
                    details=_details(name, group, plural))


def conflict(plural: str, group: str, name: str, why: str | None = None) -> ApiError:
    """A write carried a stale resourceVersion (or failed a precondition)."""
    why = why or ("the object has been modified; please apply your changes to the latest "
                  "version and try again")
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {qualified(plural, group)} "{name}": {why}',
                    details=_details(name, group, plural))


def invalid(kind: str, group: str, name: str, causes: Sequence[tuple[str, str, str]]) -> ApiError:
    """422: `causes` are (field, reason, message) triples; message is `field: message`."""
    parts = [f"{field}: {message}" if field else message for field, _, message in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details = _details(name, group, kind)
    details["causes"] = [{"reason": reason, "message": message, "field": field}
                         for field, reason, message in causes]
    return ApiError(422, "Invalid", f'{qualified(kind, group)} "{name}" is invalid: {joined}',
                    details=details)


def unprocessable(message: str) -> ApiError:
    """422 without a field (a JSON patch that cannot apply, a failed `test`)."""
    return ApiError(422, "Invalid", message)


def bad_request(message: str) -> ApiError:
    """A body or a query parameter that cannot be understood."""
    return ApiError(400, "BadRequest", message)


def unsupported_media_type(accepted: Sequence[str]) -> ApiError:
    """A patch content type this resource does not take."""
    return ApiError(415, "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types "
                    "include: " + ", ".join(accepted))


def method_not_allowed(method: str) -> ApiError:
    """A verb the resource does not support."""
    return ApiError(405, "MethodNotAllowed",
                    f"the server does not allow this method on the requested resource ({method})")


def expired(requested: int, oldest: int) -> ApiError:
    """A watch or list from a resourceVersion older than the kept history."""
    return ApiError(410, "Expired", f"too old resource version: {requested} ({oldest})")


def unauthorized() -> ApiError:
    """A missing or wrong bearer token."""
    return ApiError(401, "Unauthorized", "Unauthorized")


def too_large(limit: int) -> ApiError:
    """A request body above the server's limit."""
    return ApiError(413, "RequestEntityTooLarge",
                    f"the request is too large: limit is {limit} bytes")


def injected(code: int, *, retry_after: int | None = None, message: str | None = None) -> ApiError:
    """A fault injected by a test: the reason and message a real server would use."""
    reasons = {
        400: ("BadRequest", "injected bad request"),
        401: ("Unauthorized", "Unauthorized"),
        403: ("Forbidden", "injected forbidden"),
        404: ("NotFound", "the server could not find the requested resource"),
        409: ("Conflict", "Operation cannot be fulfilled: the object has been modified; "
                          "please apply your changes to the latest version and try again"),
        410: ("Expired", "too old resource version: injected"),
        422: ("Invalid", "injected invalid"),
        429: ("TooManyRequests", "Too many requests, please try again later."),
        500: ("InternalError", "Internal error occurred: injected"),
        503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
        504: ("Timeout", "the server was unable to return a response in the time allotted"),
    }
    reason, default = reasons.get(code, ("Unknown", f"injected status {code}"))
    headers: list[tuple[str, str]] = []
    details: dict[str, Any] | None = None
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after)))
        details = {"retryAfterSeconds": retry_after}
    return ApiError(code, reason, message or default, details=details, headers=headers)
