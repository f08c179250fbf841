"""The gateway's refusals, as values: each becomes one HTTP answer, one log line, one metric.

`Refusal` is raised anywhere in a tunnel's setup and caught once by the
connection handler (`server.py`), which writes `answer`, logs `message` and
counts `reason` in `egressd_gateway_tunnels_refused_total`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from egressd.gateway import wire

REALM = 'Basic realm="egressd"'
"""The challenge of every 407 (a token is the password)."""

RETRY_AFTER_NO_PROXY = 5
"""Seconds a client is told to wait when no proxy is free (leases free at tunnel close)."""

RETRY_AFTER_FULL = 1
"""Seconds a client is told to wait when the gateway has no room for another tunnel."""


class Refusal(Exception):
    """A request the gateway answers itself instead of tunnelling it."""

    def __init__(self, status: int, reason: str, message: str, *,
                 headers: tuple[tuple[str, str], ...] = (),
                 extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.headers = headers
        self.extra = dict(extra or {})

    def answer(self) -> bytes:
        return wire.error(self.status, self.reason, self.message, headers=self.headers,
                          extra=self.extra)


def bad_request(message: str) -> Refusal:
    return Refusal(400, "bad_request", message)


def unauthenticated(message: str) -> Refusal:
    return Refusal(407, "unauthenticated", message, headers=(("Proxy-Authenticate", REALM),))


def bad_username(message: str) -> Refusal:
    return Refusal(407, "invalid_username", message, headers=(("Proxy-Authenticate", REALM),))


def head_too_large(message: str) -> Refusal:
    return Refusal(431, "header_too_large", message)


def handshake_timeout(seconds: float) -> Refusal:
    return Refusal(408, "handshake_timeout", f"request head not received within {seconds:g}s")


def too_many_tunnels(limit: int) -> Refusal:
    return Refusal(503, "too_many_tunnels", f"the gateway runs {limit} tunnels already",
                   headers=(("Retry-After", str(RETRY_AFTER_FULL)),))


def no_proxy(*, considered: int, unhealthy: int, at_capacity: int, in_cooldown: int
             ) -> Refusal:
    return Refusal(
        503, "no_proxy_available", "no proxy matching the selector is free for this target",
        headers=(("Retry-After", str(RETRY_AFTER_NO_PROXY)),),
        extra={"considered": considered, "unhealthy": unhealthy, "atCapacity": at_capacity,
               "inCooldown": in_cooldown})


def upstream_failed(message: str, *, attempts: int) -> Refusal:
    return Refusal(502, "upstream_failed", message, extra={"attempts": attempts})
