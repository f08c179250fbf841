"""The discovery API's wire forms as typed values, and the answers mapped to errors.

Sans-IO: the sync and async clients build the same `Call`s and read the same
responses here; only sending and sleeping differ between them.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from egressd_client._errors import (
    ApiError,
    EgressdError,
    NoProxyAvailable,
    Unauthorized,
    UnknownLease,
)


class Result(enum.StrEnum):
    """What a client saw through a leased proxy (`POST /v1/leases/{id}/report`)."""

    OK = "ok"
    RATE_LIMITED = "rate_limited"
    BANNED = "banned"
    PROXY_ERROR = "proxy_error"


@dataclass(frozen=True, kw_only=True)
class ProxyInfo:
    """One proxy as egressd shows it (its `proxyView`)."""

    namespace: str
    name: str
    host: str | None
    port: int | None
    attributes: Mapping[str, str]
    healthy: bool
    latency_ms: float | None
    active_leases: int
    max_leases: int
    phase: str | None
    cooldowns: Mapping[str, Mapping[str, str]]

    @property
    def key(self) -> str:
        """`namespace/name`: a proxy's identity (never host:port, which vendors share)."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A granted lease. `id` and `proxy_url` stay out of repr and logs: whoever holds
    the id can release the lease, and the URL may carry the proxy's credentials."""

    id: str = field(repr=False)
    proxy_url: str = field(repr=False)
    proxy: ProxyInfo
    expires_at: dt.datetime
    target: str | None

    @property
    def proxies(self) -> dict[str, str]:
        """The `proxies=` mapping requests wants."""
        return {"http": self.proxy_url, "https": self.proxy_url}

    def seconds_left(self, now: dt.datetime | None = None) -> float:
        return (self.expires_at - (now or dt.datetime.now(dt.UTC))).total_seconds()


@dataclass(frozen=True)
class Call:
    """One request to egressd. `retry_unsent_only`: retry only failures that show the
    request never reached egressd (a lost answer to an acquire may hold a lease)."""

    method: str
    path: str
    json: Any = None
    params: Mapping[str, str] | None = None
    retry_unsent_only: bool = False


def safe_url(url: str) -> str:
    """`url` without userinfo, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def parse_retry_after(value: str | bytes | None, *, now: dt.datetime | None = None
                      ) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date); None if absent or bad."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        seconds = (when - (now or dt.datetime.now(dt.UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def acquire_call(selector: Mapping[str, str] | None, target: str | None,
                 ttl: float | None) -> Call:
    body: dict[str, Any] = {}
    if selector:
        body["selector"] = dict(selector)
    if target:
        body["target"] = target
    if ttl is not None:
        body["ttlSeconds"] = ttl
    return Call("POST", "/v1/leases", json=body, retry_unsent_only=True)


def release_call(lease_id: str) -> Call:
    return Call("DELETE", f"/v1/leases/{quote(lease_id, safe='')}")


def report_call(lease_id: str, result: Result | str, *, target: str | None,
                retry_after: float | None) -> Call:
    body: dict[str, Any] = {"result": Result(result).value}
    if target:
        body["target"] = target
    if retry_after is not None:
        body["retryAfterSeconds"] = max(0.0, float(retry_after))
    return Call("POST", f"/v1/leases/{quote(lease_id, safe='')}/report", json=body)


def proxies_call(selector: Mapping[str, str] | None, healthy: bool | None) -> Call:
    params: dict[str, str] = {}
    if selector:
        params["selector"] = ",".join(f"{k}={v}" for k, v in selector.items())
    if healthy is not None:
        params["healthy"] = "true" if healthy else "false"
    return Call("GET", "/v1/proxies", params=params)


def _body(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _int(body: Mapping[str, Any], name: str) -> int:
    value = body.get(name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def check(response: httpx.Response, *, base_url: str) -> None:
    """Raise the typed error for a refusal; return for a 2xx."""
    if response.is_success:
        return
    body = _body(response)
    code = str(body.get("error") or f"http_{response.status_code}")
    message = str(body.get("message") or response.reason_phrase)
    where = f"egressd at {safe_url(base_url)}"
    status = response.status_code
    if status in (401, 403):
        raise Unauthorized(
            f"{where} refused the token ({status} {code}): set EGRESSD_TOKEN (or pass "
            "token=) to the discovery token", status=status, code=code)
    if status == 409 and code == "no_proxy_available":
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        counts = {k: _int(body, k) for k in ("considered", "unhealthy", "atCapacity",
                                               "inCooldown")}
        raise NoProxyAvailable(
            f"{where}: no proxy available ({message}; considered {counts['considered']}, "
            f"unhealthy {counts['unhealthy']}, at capacity {counts['atCapacity']}, "
            f"in cooldown {counts['inCooldown']})",
            considered=counts["considered"], unhealthy=counts["unhealthy"],
            at_capacity=counts["atCapacity"], in_cooldown=counts["inCooldown"],
            retry_after=retry_after)
    if status == 404 and code == "unknown_lease":
        raise UnknownLease(f"{where}: {message}", status=status, code=code)
    raise ApiError(f"{where} answered {status} {code}: {message}", status=status, code=code)


def proxy_info(raw: Mapping[str, Any]) -> ProxyInfo:
    try:
        return ProxyInfo(
            namespace=str(raw["namespace"]), name=str(raw["name"]),
            host=raw.get("host"), port=raw.get("port"),
            attributes=dict(raw.get("attributes") or {}),
            healthy=bool(raw.get("healthy")), latency_ms=raw.get("latencyMs"),
            active_leases=int(raw.get("activeLeases") or 0),
            max_leases=int(raw.get("maxLeases") or 0), phase=raw.get("phase"),
            cooldowns=dict(raw.get("cooldowns") or {}))
    except (KeyError, TypeError, ValueError) as exc:
        raise EgressdError(f"egressd sent a malformed proxy view: {exc!r}") from None


def parse_lease(response: httpx.Response, *, target: str | None) -> Lease:
    body = _body(response)
    try:
        expires = dt.datetime.fromisoformat(str(body["expiresAt"]).replace("Z", "+00:00"))
        return Lease(id=str(body["leaseId"]), proxy_url=str(body["proxyUrl"]),
                     proxy=proxy_info(body["proxy"]), expires_at=expires, target=target)
    except (KeyError, TypeError, ValueError) as exc:
        raise EgressdError(f"egressd sent a malformed lease: missing or bad {exc}") from None


def parse_proxies(response: httpx.Response) -> list[ProxyInfo]:
    items = _body(response).get("items")
    if not isinstance(items, list):
        raise EgressdError("egressd sent a proxy list without items")
    return [proxy_info(item) for item in items]
