"""What a response or an exception seen through a proxy means for egressd.

`classify(response)` turns a site's answer into the report to send: 429 (with
its Retry-After) is `rate_limited`, the configured ban statuses and body
markers are `banned`, anything else is `ok`. `is_proxy_failure(exc)` says an
exception means the proxy itself failed (`proxy_error`). Both accept httpx,
requests and Scrapy objects without importing requests or Scrapy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from egressd_client._wire import Result, parse_retry_after

MARKER_SCAN_BYTES = 256 * 1024
"""Body markers are looked for in the first 256 KiB (a ban page is small)."""


@dataclass(frozen=True)
class Verdict:
    """The report a response calls for."""

    result: Result
    retry_after: float | None = None
    reason: str = ""

    @property
    def is_ban(self) -> bool:
        """True for rate_limited and banned: move this target to another proxy."""
        return self.result in (Result.RATE_LIMITED, Result.BANNED)


def _status(response: Any) -> int:
    status = getattr(response, "status_code", None)
    if status is None:
        status = getattr(response, "status", None)
    if not isinstance(status, int):
        raise TypeError(f"{type(response).__name__} has no status_code or status")
    return status


def _header(response: Any, name: str) -> str | bytes | None:
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    value = headers.get(name)
    return value if isinstance(value, str | bytes) else None


def _body(response: Any) -> bytes:
    try:
        body = getattr(response, "content", None)
    except httpx.ResponseNotRead:
        return b""  # a streamed httpx response that was not read: no markers to see
    if body is None:
        body = getattr(response, "body", None)  # Scrapy
    return body[:MARKER_SCAN_BYTES] if isinstance(body, bytes) else b""


@dataclass(frozen=True, init=False)
class Classifier:
    """Maps responses to reports; configure it for the sites you crawl.

    `Classifier(ban_statuses={403, 503}, ban_markers=["captcha"])`
    """

    ban_statuses: frozenset[int] = frozenset({403})
    rate_limit_statuses: frozenset[int] = frozenset({429})
    ban_markers: tuple[str, ...] = ()
    """Case-insensitive text that marks a ban page served with any status."""

    def __init__(self, *, ban_statuses: Iterable[int] = (403,),
                 rate_limit_statuses: Iterable[int] = (429,),
                 ban_markers: Iterable[str] = ()) -> None:
        object.__setattr__(self, "ban_statuses", frozenset(ban_statuses))
        object.__setattr__(self, "rate_limit_statuses", frozenset(rate_limit_statuses))
        object.__setattr__(self, "ban_markers", tuple(ban_markers))

    def __call__(self, response: Any) -> Verdict:
        status = _status(response)
        if status in self.rate_limit_statuses:
            return Verdict(Result.RATE_LIMITED, parse_retry_after(_header(response, "Retry-After")),
                           f"status {status}")
        if status in self.ban_statuses:
            return Verdict(Result.BANNED, None, f"status {status}")
        if self.ban_markers:
            body = _body(response).lower()
            for marker in self.ban_markers:
                if marker.lower().encode() in body:
                    return Verdict(Result.BANNED, None, f"body marker {marker!r}")
        return Verdict(Result.OK)


classify = Classifier()
"""The default classifier: 429 → rate_limited (with Retry-After), 403 → banned."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


# requests/urllib3 are not imported: their classes are recognised by module and name.
_FOREIGN = {
    "requests.exceptions": {"ConnectionError", "Timeout", "ProxyError"},
    "urllib3.exceptions": {"ProxyError", "NewConnectionError", "ConnectTimeoutError",
                           "ReadTimeoutError", "ProtocolError"},
}
_FOREIGN_EXCLUDED = {"SSLError", "InvalidURL", "InvalidSchema", "MissingSchema"}


def _foreign_failure(exc: BaseException) -> bool:
    names = {(c.__module__, c.__name__) for c in type(exc).__mro__}
    if any(name in _FOREIGN_EXCLUDED for _, name in names):
        return False
    return any(name in _FOREIGN.get(module, ()) for module, name in names)


def is_proxy_failure(exc: BaseException) -> bool:
    """True when `exc` (or its cause) is a connection failure through the proxy: the
    proxy refused or dropped the connection, refused the tunnel (407 included), or
    nothing answered in time. A TLS or URL error is the caller's, not the proxy's."""
    for e in _chain(exc):
        if isinstance(e, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
            return False
        if isinstance(e, httpx.TransportError):
            return True
        if _foreign_failure(e):
            return True
        if isinstance(e, ConnectionError | TimeoutError):
            return True
    return False
