"""The discovery API's wire forms (SPEC §7): strict request parsing and response views.

Parsing is strict so a typo never silently means something else: unknown
fields, wrong JSON types, duplicate keys, NaN/Infinity and non-objects are all
`ApiError`s with the `{"error", "message"}` shape. Nothing here touches state.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from typing import Any

import attrs

from egressd.leases import GLOBAL, Cooldown, Result, Usage
from egressd.model.constants import GLOBAL_COOLDOWN_KEY, Phase
from egressd.model.convert import format_time
from egressd.model.helpers import effective_host, effective_port, is_healthy, max_leases
from egressd.model.proxy import Proxy

MAX_TARGET = 253
"""Longest target accepted (a DNS name is at most 253 characters)."""


class ApiError(Exception):
    """A request the API refuses; the handler answers `status` with `{"error": code, ...}`."""

    def __init__(
        self, code: str, message: str, *, status: int = 400, extra: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.extra}


@attrs.frozen(kw_only=True)
class LeaseRequest:
    """A parsed `POST /v1/leases` body."""

    selector: Mapping[str, str]
    target: str
    ttl: float


@attrs.frozen(kw_only=True)
class ReportRequest:
    """A parsed `POST /v1/leases/{id}/report` body."""

    result: Result
    target: str | None
    retry_after: float | None


# --- requests ---------------------------------------------------------------------------

def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def json_object(data: bytes, *, empty: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body as a JSON object; an empty body is `empty` if given, else an error."""
    if not data.strip() and empty is not None:
        return dict(empty)
    try:
        value = json.loads(data, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ApiError("invalid_body", "body nests too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError("invalid_body", f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError("invalid_body", "body must be a JSON object")
    return value


def _check_fields(body: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ApiError(
            "invalid_body",
            f"unknown field(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})")


def _number(value: Any, field: str) -> float:
    # bool is an int in Python, but `true` is not a number in JSON.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError("invalid_body", f"{field} must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError("invalid_body", f"{field} must be finite")
    return value


def _target(value: Any, field: str = "target") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError("invalid_body", f"{field} must be a string")
    if len(value) > MAX_TARGET:
        raise ApiError("invalid_body", f"{field} longer than {MAX_TARGET} characters")
    if value == GLOBAL_COOLDOWN_KEY:
        raise ApiError("invalid_body", f"{field} {value!r} is reserved for global cooldowns")
    return value or None


def parse_lease_request(data: bytes, *, default_ttl: float, max_ttl: float) -> LeaseRequest:
    """Parse a lease request. An empty body asks for any proxy (`curl -X POST` works).

    ttlSeconds is never clamped (SPEC §7): 0, negative or above `max_ttl` is
    `invalid_ttl`, so a client asking for too much finds out.
    """
    body = json_object(data, empty={})
    _check_fields(body, ("selector", "target", "ttlSeconds"))
    raw_selector = body.get("selector", {})
    if raw_selector is None:
        raw_selector = {}
    if not isinstance(raw_selector, dict) or not all(
        isinstance(v, str) for v in raw_selector.values()
    ):
        raise ApiError("invalid_body", "selector must be an object of string values")
    ttl: float = default_ttl
    if body.get("ttlSeconds") is not None:
        ttl = _number(body["ttlSeconds"], "ttlSeconds")
        if ttl <= 0 or ttl > max_ttl:
            raise ApiError(
                "invalid_ttl", f"ttlSeconds must be above 0 and at most {max_ttl:g}, got {ttl}")
    return LeaseRequest(
        selector=raw_selector, target=_target(body.get("target")) or GLOBAL, ttl=float(ttl))


def parse_report_request(data: bytes) -> ReportRequest:
    """Parse a report. retryAfterSeconds is bounded later by the store (SPEC §7)."""
    body = json_object(data)
    _check_fields(body, ("result", "target", "retryAfterSeconds"))
    raw = body.get("result")
    try:
        result = Result(raw) if isinstance(raw, str) else None
    except ValueError:
        result = None
    if result is None:
        choices = ", ".join(r.value for r in Result)
        raise ApiError("invalid_result", f"result must be one of {choices}")
    retry_after = None
    if body.get("retryAfterSeconds") is not None:
        retry_after = _number(body["retryAfterSeconds"], "retryAfterSeconds")
        if retry_after < 0:
            raise ApiError("invalid_body", "retryAfterSeconds must not be negative")
    return ReportRequest(
        result=result, target=_target(body.get("target")), retry_after=retry_after)


def parse_selector(text: str) -> dict[str, str]:
    """`k=v,k2=v2` as a dict; empty text selects everything."""
    selector: dict[str, str] = {}
    if not text.strip():
        return selector
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ApiError("invalid_selector", f"selector term {part!r} is not key=value")
        if key in selector and selector[key] != value:
            raise ApiError("invalid_selector", f"selector names {key!r} twice")
        selector[key] = value
    return selector


def parse_bool(text: str, field: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1"):
        return True
    if low in ("false", "0"):
        return False
    raise ApiError("invalid_query", f"{field} must be true or false, got {text!r}")


# --- selection helpers -------------------------------------------------------------------

def matches(proxy: Proxy, selector: Mapping[str, str]) -> bool:
    attributes = proxy.spec.attributes
    return all(attributes.get(k) == v for k, v in selector.items())


def leasable(proxy: Proxy) -> bool:
    """SPEC §7: phase Ready, a host, a healthy verdict and no deletionTimestamp.

    The phase is checked as well as the condition: a Healthy condition left
    from before a proxy went Failed, Deleting or Provisioning is stale, and
    any phase but Ready (a future Draining included) is never leased.
    """
    return (
        proxy.status.phase is Phase.READY
        and proxy.metadata.deletion_timestamp is None
        and is_healthy(proxy) is True
        and effective_host(proxy) is not None
    )


# --- responses ---------------------------------------------------------------------------

def rfc3339(wall: float) -> str:
    return format_time(dt.datetime.fromtimestamp(wall, tz=dt.UTC))


def cooldowns_view(cooldowns: Mapping[str, Cooldown]) -> dict[str, dict[str, str]]:
    """Keyed like `status.cooldowns`: the target, or "*" for global."""
    return {
        (target or GLOBAL_COOLDOWN_KEY): {"until": rfc3339(cd.until), "reason": cd.reason.value}
        for target, cd in cooldowns.items()
    }


def proxy_view(proxy: Proxy, usage: Usage | None) -> dict[str, Any]:
    usage = usage or Usage()
    phase = proxy.status.phase
    return {
        "namespace": proxy.metadata.namespace,
        "name": proxy.metadata.name,
        "host": effective_host(proxy),
        "port": effective_port(proxy),
        "attributes": dict(proxy.spec.attributes),
        "healthy": is_healthy(proxy) is True,
        "latencyMs": proxy.status.latency_ms,
        "activeLeases": usage.active_leases,
        "maxLeases": max_leases(proxy.spec),
        "phase": None if phase is None else str(phase),
        "cooldowns": cooldowns_view(usage.cooldowns),
    }


def proxy_url(host: str, port: int) -> str:
    if ":" in host:  # an IPv6 literal needs brackets in a URL
        host = f"[{host}]"
    return f"http://{host}:{port}"
