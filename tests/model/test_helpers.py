"""Table-driven tests of the pure helpers in egressd.model.helpers."""

from __future__ import annotations

import datetime as dt

import pytest

from egressd.model.constants import COND_HEALTHY, COND_PROVISIONED, DEFAULT_MAX_LEASES, Mode
from egressd.model.helpers import (
    effective_host,
    effective_port,
    health_check,
    is_healthy,
    max_leases,
)
from egressd.model.proxy import (
    Condition,
    Endpoint,
    HealthCheck,
    ObjectMeta,
    Proxy,
    ProxySpec,
    ProxyStatus,
)

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def proxy(spec: ProxySpec, status: ProxyStatus | None = None) -> Proxy:
    return Proxy(ObjectMeta("p", namespace="ns"), spec=spec, status=status or ProxyStatus())


def cond(type_: str, status: str) -> Condition:
    return Condition(type_, status=status, last_transition_time=T0)


MANAGED = ProxySpec(Mode.MANAGED, provider="gcp", port=8080)
EXTERNAL = ProxySpec(Mode.EXTERNAL, endpoint=Endpoint("proxy.example", port=3129))
EXTERNAL_NO_PORT = ProxySpec(Mode.EXTERNAL, endpoint=Endpoint("proxy.example"), port=8888)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (proxy(MANAGED), None),
        (proxy(MANAGED, ProxyStatus(ip="")), None),
        (proxy(MANAGED, ProxyStatus(ip="10.0.0.7", host="ignored")), "10.0.0.7"),
        (proxy(EXTERNAL), "proxy.example"),
        # External ignores status.ip: the endpoint is the truth.
        (proxy(EXTERNAL, ProxyStatus(ip="10.0.0.7")), "proxy.example"),
        (proxy(ProxySpec(Mode.EXTERNAL)), None),
    ],
    ids=["managed-no-ip", "managed-empty-ip", "managed-ip", "external", "external-ignores-ip",
         "external-without-endpoint"],
)
def test_effective_host(value: Proxy, expected: str | None) -> None:
    assert effective_host(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (proxy(ProxySpec(Mode.MANAGED, provider="x")), 3128),
        (proxy(MANAGED), 8080),
        (proxy(EXTERNAL), 3129),
        (proxy(EXTERNAL_NO_PORT), 8888),
    ],
    ids=["default", "spec-port", "endpoint-port-wins", "endpoint-without-port"],
)
def test_effective_port(value: Proxy, expected: int) -> None:
    assert effective_port(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, DEFAULT_MAX_LEASES), (0, 0), (1, 1), (250, 250)],
    ids=["unset-means-10", "zero-means-never", "one", "many"],
)
def test_max_leases(value: int | None, expected: int) -> None:
    assert max_leases(ProxySpec(Mode.MANAGED, provider="x", max_leases=value)) == expected


def test_max_leases_default_is_ten() -> None:
    assert DEFAULT_MAX_LEASES == 10


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (HealthCheck(), HealthCheck("https://www.gstatic.com/generate_204", interval_seconds=30,
                                    timeout_seconds=10, success_threshold=1,
                                    failure_threshold=3)),
        (HealthCheck("http://a.example/", timeout_seconds=2),
         HealthCheck("http://a.example/", interval_seconds=30, timeout_seconds=2,
                     success_threshold=1, failure_threshold=3)),
    ],
    ids=["all-defaults", "partial"],
)
def test_health_check_defaults(value: HealthCheck, expected: HealthCheck) -> None:
    assert health_check(ProxySpec(Mode.MANAGED, provider="x", health_check=value)) == expected


def test_health_check_default_when_spec_omits_it() -> None:
    assert health_check(MANAGED) == HealthCheck()


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ((), None),
        ((cond(COND_PROVISIONED, "True"),), None),
        ((cond(COND_PROVISIONED, "True"), cond(COND_HEALTHY, "True")), True),
        ((cond(COND_HEALTHY, "False"),), False),
        ((cond(COND_HEALTHY, "Unknown"),), None),
    ],
    ids=["no-conditions", "only-provisioned", "healthy", "unhealthy", "unknown-is-no-verdict"],
)
def test_is_healthy(conditions: tuple[Condition, ...], expected: bool | None) -> None:
    assert is_healthy(proxy(MANAGED, ProxyStatus(conditions=conditions))) is expected


def test_condition_lookup_and_key() -> None:
    healthy = cond(COND_HEALTHY, "True")
    value = proxy(MANAGED, ProxyStatus(conditions=[cond(COND_PROVISIONED, "True"), healthy]))
    assert value.status.condition(COND_HEALTHY) is healthy
    assert value.status.condition("Missing") is None
    assert value.key == "ns/p"


def test_condition_status_is_checked() -> None:
    with pytest.raises(ValueError, match="status"):
        Condition("Healthy", status="yes", last_transition_time=T0)
