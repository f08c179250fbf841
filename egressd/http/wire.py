"""The discovery API's wire types (docs/reference.md): request bodies and answers as frozen classes.

One codec (`egressd.codec`, the house's converter factory) reads the bodies
and writes the answers, and `openapi.py` generates the document from these same
classes, so the two cannot drift. Parsing is strict so a typo never silently
means something else: unknown fields, wrong JSON types, duplicate keys,
NaN/Infinity and non-objects are all `ApiError`s with the `{"error",
"message"}` shape, the message naming each bad field. `null` for an optional
field means "left out" (the document says so). Nothing here touches state.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import attrs

from egressd.codec import (
    VALUE_WORDS,
    Codec,
    Doc,
    SchemaOnly,
    WireError,
    at_least,
    max_length,
    not_one_of,
    one_of,
)
from egressd.leases import GLOBAL, Cooldown, Result, Usage
from egressd.model.constants import GLOBAL_COOLDOWN_KEY, Phase
from egressd.model.helpers import effective_host, effective_port, is_healthy, max_leases
from egressd.model.proxy import Proxy
from egressd.timestamps import format_wall

T = TypeVar("T")

MAX_TARGET = 253
"""Longest target accepted (a DNS name is at most 253 characters)."""

ERROR_CODES = (
    "invalid_body", "invalid_ttl", "invalid_result", "invalid_selector", "invalid_query",
    "no_proxy_available", "unknown_lease", "unauthorized", "body_too_large", "body_timeout",
    "not_found", "invalid_header",
    "method_not_allowed", "internal_error",
)
"""Every `error` code the API answers with."""

codec = Codec(words=VALUE_WORDS, forbid_extra_keys=True, omit_none=False)
"""Bodies: unknown keys refused, `null` is "left out". Answers: None written as null."""


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


# --- requests ---------------------------------------------------------------------------

Target = Annotated[
    str, max_length(MAX_TARGET),
    not_one_of({GLOBAL_COOLDOWN_KEY}, "reserved for global cooldowns"),
    Doc('the site the proxy is for; "" or null means none ("*" is reserved)')]


@attrs.frozen(kw_only=True)
class LeaseRequest:
    """A `POST /v1/leases` body; an empty body asks for any proxy."""

    selector: Annotated[Mapping[str, str], Doc("attributes the proxy must have")] | None = None
    target: Target | None = None
    # The bounds are the daemon's flags: checked by `parse_lease_request` (invalid_ttl)
    # and written into the document by `openapi.document`.
    ttl_seconds: Annotated[float, SchemaOnly({"exclusiveMinimum": 0})] | None = None


@attrs.frozen(kw_only=True)
class Report:
    """A `POST /v1/leases/{id}/report` body: what the client saw through the proxy."""

    result: Annotated[Result, Doc(
        "proxy_error: the proxy itself failed (refused, timed out, 407); no cooldown, "
        "counts as a failed probe")]
    target: Target | None = None
    retry_after_seconds: Annotated[
        float, at_least(0), Doc("the site's Retry-After; bounded to 1 s..max")] | None = None


@attrs.frozen(kw_only=True)
class Acquire:
    """A lease request with the defaults applied."""

    selector: Mapping[str, str]
    target: str
    ttl: float


@attrs.frozen(kw_only=True)
class ReportRequest:
    """A report as the store takes it."""

    result: Result
    target: str | None
    retry_after: float | None


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


def _read(raw: dict[str, Any], cls: type[T], *, code_of: Mapping[str, str]) -> T:
    """`raw` as a `cls`; an ApiError naming every problem. A problem at a field named in
    `code_of` gets that error code, unless the body also has unknown fields."""
    try:
        return codec.structure(raw, cls)
    except WireError as exc:
        message = "; ".join(str(p) for p in exc.problems)
        unknown = any(p.message == codec.words.unknown for p in exc.problems)
        codes = [code_of[p.path] for p in exc.problems if p.path in code_of]
        raise ApiError("invalid_body" if unknown or not codes else codes[0], message) from None


def parse_lease_request(data: bytes, *, default_ttl: float, max_ttl: float) -> Acquire:
    """Parse a lease request. An empty body asks for any proxy (`curl -X POST` works).

    ttlSeconds is never clamped (docs/reference.md): 0, negative or above `max_ttl` is
    `invalid_ttl`, so a client asking for too much finds out.
    """
    body = _read(json_object(data, empty={}), LeaseRequest, code_of={})
    ttl = default_ttl if body.ttl_seconds is None else body.ttl_seconds
    if ttl <= 0 or ttl > max_ttl:
        raise ApiError(
            "invalid_ttl", f"ttlSeconds must be above 0 and at most {max_ttl:g}, got {ttl:g}")
    return Acquire(selector=body.selector or {}, target=body.target or GLOBAL, ttl=float(ttl))


def parse_report_request(data: bytes) -> ReportRequest:
    """Parse a report. retryAfterSeconds is bounded later by the store (docs/reference.md)."""
    body = _read(json_object(data), Report, code_of={"result": "invalid_result"})
    return ReportRequest(
        result=body.result, target=body.target or None, retry_after=body.retry_after_seconds)


_WS = " \t\n\r\f\v"
_TERM = rf"[^,=]*[^,={_WS}][^,=]*=[^,]*"
SELECTOR_PATTERN = rf"^([{_WS}]*|{_TERM}(,{_TERM})*)$"
"""`k=v,k2=v2`: a non-blank key, `=`, any value. Python and JSON Schema (ECMA) read it
alike: only ASCII white space is blank (`str.strip()` would take Unicode's too)."""
_SELECTOR = re.compile(SELECTOR_PATTERN)


def parse_selector(text: str) -> dict[str, str]:
    """`k=v,k2=v2` as a dict; empty text selects everything; a key given twice with two
    values is refused (it could never match)."""
    if not _SELECTOR.match(text):
        raise ApiError("invalid_selector", f"selector {text!r} is not k=v,k2=v2")
    selector: dict[str, str] = {}
    if not text.strip(_WS):
        return selector
    for part in text.split(","):
        key, _, value = part.partition("=")
        key, value = key.strip(_WS), value.strip(_WS)
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


# --- answers ----------------------------------------------------------------------------

@attrs.frozen(kw_only=True)
class CooldownView:
    """A cooldown in force."""

    until: dt.datetime
    reason: Annotated[str, one_of(("rate_limited", "banned"))]


@attrs.frozen(kw_only=True)
class ProxyView:
    """A proxy as the API shows it."""

    namespace: str
    name: str
    host: Annotated[str, Doc("null until the proxy has an address")] | None
    port: int
    attributes: Mapping[str, str]
    healthy: Annotated[bool, Doc("the health engine's verdict is healthy")]
    latency_ms: int | None
    active_leases: int
    max_leases: int
    phase: Phase | None
    cooldowns: Annotated[
        Mapping[str, CooldownView], Doc('cooldowns in force, by target; "*" is global')]


@attrs.frozen
class ProxyList:
    """The proxies that match, in key order."""

    items: tuple[ProxyView, ...]


@attrs.frozen(kw_only=True)
class LeaseGrant:
    """A lease granted."""

    lease_id: str
    proxy: ProxyView
    proxy_url: Annotated[str, Doc("http://host:port")]
    expires_at: dt.datetime
    active_leases: int


@attrs.frozen(kw_only=True)
class LeaseShown:
    """An active lease (`GET /v1/leases/{leaseId}`)."""

    lease_id: str
    proxy: Annotated[ProxyView, Doc("the leased proxy as the cache has it now")]
    proxy_url: Annotated[str, Doc("http://host:port")] | None
    target: Annotated[str, Doc("the site named at acquire; null when none")] | None
    expires_at: dt.datetime


@attrs.frozen(kw_only=True)
class Error:
    """Every refusal: a code and a message for people."""

    error: Annotated[str, one_of(ERROR_CODES)]
    message: str


@attrs.frozen(kw_only=True)
class NoProxyAvailable:
    """No matching proxy is free: how many matched and why each was refused."""

    error: Annotated[str, one_of(("no_proxy_available",))]
    message: str
    considered: Annotated[int, Doc("proxies matching the selector")]
    unhealthy: Annotated[int, Doc(
        "matches not leasable: no healthy verdict, no host, deleting")]
    at_capacity: int
    in_cooldown: int


@attrs.frozen
class Health:
    """The process answers."""

    status: str


# --- selection helpers -------------------------------------------------------------------

def matches(proxy: Proxy, selector: Mapping[str, str]) -> bool:
    attributes = proxy.spec.attributes
    return all(attributes.get(k) == v for k, v in selector.items())


def leasable(proxy: Proxy) -> bool:
    """docs/reference.md: phase Ready, a host, a healthy verdict and no deletionTimestamp.

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


def _wall(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


def rfc3339(wall: float) -> str:
    """A wall-clock time (`time.time()`) as the API writes it."""
    return format_wall(wall)


def cooldowns_view(cooldowns: Mapping[str, Cooldown]) -> dict[str, CooldownView]:
    """Keyed like `status.cooldowns`: the target, or "*" for global."""
    return {
        (target or GLOBAL_COOLDOWN_KEY): CooldownView(until=_wall(cd.until),
                                                      reason=cd.reason.value)
        for target, cd in cooldowns.items()
    }


def proxy_view(proxy: Proxy, usage: Usage | None, *,
               active_leases: int | None = None) -> ProxyView:
    """`proxy` as the API shows it; `active_leases` overrides the usage's count."""
    usage = usage or Usage()
    return ProxyView(
        namespace=proxy.metadata.namespace,
        name=proxy.metadata.name,
        host=effective_host(proxy),
        port=effective_port(proxy),
        attributes=dict(proxy.spec.attributes),
        healthy=is_healthy(proxy) is True,
        latency_ms=proxy.status.latency_ms,
        active_leases=usage.active_leases if active_leases is None else active_leases,
        max_leases=max_leases(proxy.spec),
        phase=proxy.status.phase,
        cooldowns=cooldowns_view(usage.cooldowns),
    )


def grant_view(proxy: Proxy, usage: Usage | None, *, lease_id: str, expires_at: float,
               active_leases: int) -> LeaseGrant:
    """The answer to an acquire (the proxy is leasable: it has a host)."""
    host = effective_host(proxy)
    assert host is not None  # leasable() checked it
    return LeaseGrant(
        lease_id=lease_id,
        proxy=proxy_view(proxy, usage, active_leases=active_leases),
        proxy_url=proxy_url(host, effective_port(proxy)),
        expires_at=_wall(expires_at),
        active_leases=active_leases,
    )


def lease_view(proxy: Proxy, usage: Usage | None, *, lease_id: str, target: str,
               expires_at: float) -> LeaseShown:
    """An active lease and its proxy (whose address may have gone since the grant)."""
    host = effective_host(proxy)
    return LeaseShown(
        lease_id=lease_id, proxy=proxy_view(proxy, usage),
        proxy_url=None if host is None else proxy_url(host, effective_port(proxy)),
        target=target or None, expires_at=_wall(expires_at))


def proxy_url(host: str, port: int) -> str:
    if ":" in host:  # an IPv6 literal needs brackets in a URL
        host = f"[{host}]"
    return f"http://{host}:{port}"
