"""Pure derived values of a Proxy (docs/reference.md): effective host and port, defaults, health."""

from __future__ import annotations

from egressd.model.constants import COND_HEALTHY, DEFAULT_MAX_LEASES, STATUS_TRUE, Mode
from egressd.model.proxy import HealthCheck, Proxy, ProxySpec


def effective_host(proxy: Proxy) -> str | None:
    """Where clients reach the proxy: `endpoint.host` (External) or `status.ip` (Managed).

    None while a Managed proxy has no address yet (or an External one, wrongly, no endpoint).
    """
    if proxy.spec.mode is Mode.EXTERNAL:
        return proxy.spec.endpoint.host if proxy.spec.endpoint is not None else None
    return proxy.status.ip or None


def effective_port(proxy: Proxy) -> int:
    """The port clients use: `endpoint.port` if set, else `spec.port`."""
    endpoint = proxy.spec.endpoint
    if endpoint is not None and endpoint.port is not None:
        return endpoint.port
    return proxy.spec.port


def max_leases(spec: ProxySpec) -> int:
    """How many leases the proxy may have at once; unset means DEFAULT_MAX_LEASES, 0 never."""
    return DEFAULT_MAX_LEASES if spec.max_leases is None else spec.max_leases


def health_check(spec: ProxySpec) -> HealthCheck:
    """The proxy's health-check settings, defaults filled in (the model defaults them already)."""
    return spec.health_check


def is_healthy(proxy: Proxy) -> bool | None:
    """The health engine's last verdict from the Healthy condition; None if there is none yet.

    A condition status of "Unknown" counts as no verdict.
    """
    cond = proxy.status.condition(COND_HEALTHY)
    if cond is None or cond.status not in ("True", "False"):
        return None
    return cond.status == STATUS_TRUE
