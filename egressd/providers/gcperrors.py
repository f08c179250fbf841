"""The GCP provider's error mapping: Compute Engine answers to provider error kinds.

An `HttpError` (its status and the reasons in `error`) or a finished zone
operation's errors become one of egressd's provider errors (docs/providers.md),
here once; a cloud-init (the insert's `user-data`) is redacted from every
message, because Compute Engine echoes an invalid value back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from googleapiclient.errors import HttpError

from egressd.providers.errors import (
    QUOTA_RETRY_AFTER,
    NotConfigured,
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)

# Error reasons (HTTP errors' `errors[].reason` and `details[].reason`,
# operations' `errors[].code`) meaning "out of quota or capacity": retry in
# 5 min, not in a second (docs/providers.md). A resource quota answers 403 quotaExceeded
# ("Quota 'CPUS' exceeded") or an insert operation fails with QUOTA_EXCEEDED;
# a stock-out fails the operation with ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]
# (httpErrorStatusCode 503).
_QUOTA_REASONS = frozenset({
    "quotaExceeded", "QUOTA_EXCEEDED", "dailyLimitExceeded", "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
})
# The API's per-minute request limits: 403 rateLimitExceeded ("Quota exceeded
# for quota group 'ReadGroup' and limit 'Read requests per 100 seconds'") or
# 429 RESOURCE_EXHAUSTED with reason rateLimitExceeded. The window is a minute
# or so, so these are transient (docs/providers.md: 429 → transient), not a 5-min quota.
_RATE_REASONS = frozenset({
    "rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED",
    "RESOURCE_OPERATION_RATE_EXCEEDED",
})
# The gRPC-style `error.status` for either of the above; alone (no reason we
# know) it is taken as a quota unless the answer was a 429.
_RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
# 400 resourceNotReady: the VM is mid-operation (a delete while its insert
# still runs). It clears by itself, so it is transient, not a bad request.
_NOT_READY_REASONS = frozenset({"resourceNotReady", "RESOURCE_NOT_READY"})
_ALREADY_EXISTS = frozenset({"alreadyExists", "RESOURCE_ALREADY_EXISTS"})

# Lines of a cloud-init shorter than this are not redacted from error
# messages: they are too common ("runcmd:") to be worth mangling a message for.
_MIN_REDACTED_LINE = 6
REDACTED = "<cloud-init redacted>"


class AlreadyExists(ProviderError):
    """Insert of a name that exists: create adopts it (never leaves the gcp modules)."""


def classify(status: int, reasons: set[str], message: str, *,
             retry_after: float | None = None) -> ProviderError:
    """The provider error for an HTTP status and the error reasons Google sent."""
    if reasons & _QUOTA_REASONS:
        return QuotaExceeded(message, retry_after=max(retry_after or 0.0, QUOTA_RETRY_AFTER))
    if status == 429 or reasons & _RATE_REASONS:
        return Transient(message, retry_after=retry_after)
    if _RESOURCE_EXHAUSTED in reasons:
        return QuotaExceeded(message, retry_after=max(retry_after or 0.0, QUOTA_RETRY_AFTER))
    if status == 404:
        return NotFound(message)
    if status == 409 and reasons & _ALREADY_EXISTS:
        return AlreadyExists(message)
    if reasons & _NOT_READY_REASONS:
        return Transient(message, retry_after=retry_after)
    # 401: google-auth refreshes tokens itself, so one that still fails is a
    # metadata-server or clock hiccup more often than a revoked key.
    if status in (401, 408, 409, 412, 429) or status >= 500:
        return Transient(message, retry_after=retry_after)
    if status == 403:
        # Permission denied or the API not enabled: the daemon's credentials or
        # project are at fault, not the request.
        return NotConfigured(message)
    if 400 <= status < 500:
        return Permanent(message)
    return Transient(message)


def _retry_after(resp: Any) -> float | None:
    try:
        value = resp.get("retry-after")
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


# "Invalid value for field 'resource.metadata': '<the value>'. <why>"
_METADATA_VALUE = re.compile(r"(field '[^']*metadata[^']*'): '.*'", re.DOTALL)


def redact(text: str, secret: str) -> str:
    """`text` with every trace of `secret` (a cloud-init) replaced (docs/reference.md).

    Compute Engine echoes an invalid field's value in its message ("Invalid
    value for field 'resource.metadata': '...'"), raw or JSON-escaped and
    perhaps cut short, so the whole text, its escaped forms and each of its
    lines are replaced, and a quoted metadata value is dropped whatever it holds.
    """
    if not secret:
        return text
    text = _METADATA_VALUE.sub(rf"\1: '{REDACTED}'", text)
    pieces = {secret, *(line.strip() for line in secret.splitlines())}
    forms: set[str] = set()
    for piece in pieces:
        if len(piece) < _MIN_REDACTED_LINE:
            continue
        forms.update({piece, json.dumps(piece)[1:-1],
                      json.dumps(piece, ensure_ascii=False)[1:-1]})
        forms.add(json.dumps(piece, ensure_ascii=False)[1:-1].replace("'", "\\'"))
    for form in sorted(forms, key=len, reverse=True):  # longest first: whole before lines
        text = text.replace(form, REDACTED)
    return text


def error_from_http(exc: HttpError, what: str, *, secret: str = "") -> ProviderError:
    """Map a client library `HttpError`: status plus the reasons in `error`.

    `secret` (the cloud-init of an insert) is redacted from the message and,
    if it was there, from `exc` itself, which stays attached as the cause.
    """
    status = int(getattr(exc.resp, "status", 0) or 0)
    reasons: set[str] = set()
    message = ""
    try:
        error = json.loads(exc.content.decode("utf-8")).get("error", {})
        message = str(error.get("message", ""))
        entries = [*(error.get("errors") or ()), *(error.get("details") or ())]
        reasons = {str(e.get("reason", "")) for e in entries if isinstance(e, dict)}
        if error.get("status"):
            reasons.add(str(error["status"]))
    except (ValueError, AttributeError, TypeError):
        pass
    reasons.discard("")
    clean = redact(message, secret)
    body = exc.content.decode("utf-8", "replace")
    if secret and redact(body, secret) != body:
        # The HttpError's str() (printed with any traceback) holds the body.
        exc.content = json.dumps({"error": {"code": status, "message": clean, "errors": [
            {"reason": r} for r in sorted(reasons)]}}).encode()
        exc.reason = clean
        exc.error_details = ""
    text = f"{what}: HTTP {status}" + (f": {clean}" if clean else "")
    return classify(status, reasons, text, retry_after=_retry_after(exc.resp))


def error_from_operation(op: Mapping[str, Any], what: str, *,
                         secret: str = "") -> ProviderError | None:
    """The error a finished zone operation carries, or None if it succeeded."""
    errors = (op.get("error") or {}).get("errors") or ()
    if not errors:
        return None
    codes = {str(e.get("code", "")) for e in errors}
    messages = "; ".join(str(e.get("message", e.get("code", ""))) for e in errors)
    status = int(op.get("httpErrorStatusCode") or 400)
    err = classify(status, codes, f"{what}: {redact(messages, secret)}")
    if isinstance(err, NotFound):
        # The operation's subject exists; a 404 here is a missing image,
        # network or machine type the request refers to.
        return Permanent(err.message)
    return err
