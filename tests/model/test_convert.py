"""The converter: wire names, timestamps, strictness, every problem with its path."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egressd.errors import EgressdError
from egressd.model.constants import Mode, Phase
from egressd.model.convert import (
    ModelError,
    format_time,
    parse_proxy,
    parse_time,
    structure,
    unstructure,
    unstructure_status,
)
from egressd.model.frozen import FrozenDict
from egressd.model.proxy import (
    CloudInit,
    Condition,
    Cooldown,
    Endpoint,
    HealthCheck,
    ObjectMeta,
    Placement,
    Proxy,
    ProxySpec,
    ProxyStatus,
    SecretKeyRef,
)

FULL_WIRE: dict[str, Any] = {
    "apiVersion": "crawl.example.com/v1alpha1",
    "kind": "Proxy",
    "metadata": {
        "name": "eu-1",
        "namespace": "crawl",
        "uid": "0b5c",
        "resourceVersion": "42",
        "generation": 3,
        "creationTimestamp": "2024-05-01T10:00:00Z",
        "deletionTimestamp": "2024-05-02T10:00:00Z",
        "labels": {"team": "crawl"},
        "annotations": {"crawl.example.com/spec-hash": "ab12"},
        "finalizers": ["crawl.example.com/instance-cleanup"],
        "managedFields": [{"manager": "kubectl"}],
    },
    "spec": {
        "mode": "Managed",
        "provider": "gcp-eu",
        "placement": {"zone": "europe-west1-b", "region": "europe-west1",
                      "machineType": "e2-micro"},
        "cloudInit": {"secretRef": {"name": "ci", "key": "cfg"}},
        "port": 3128,
        "maxLeases": 0,
        "attributes": {"region": "eu", "tier": "dc"},
        "healthCheck": {"probeURL": "https://example.org/204", "intervalSeconds": 60,
                        "timeoutSeconds": 5, "successThreshold": 2, "failureThreshold": 4},
    },
    "status": {
        "phase": "Ready",
        "providerID": "proj/zone/px-abc",
        "ip": "203.0.113.7",
        "host": "203.0.113.7",
        "port": 3128,
        "observedGeneration": 3,
        "latencyMs": 120,
        "lastHealthCheckTime": "2024-05-01T10:05:00Z",
        "cooldowns": {"*": {"until": "2024-05-01T11:00:00Z", "reason": "banned"},
                      "example.org": {"until": "2024-05-01T10:15:00Z", "reason": "rate_limited"}},
        "conditions": [
            {"type": "Provisioned", "status": "True", "reason": "Running", "message": "",
             "lastTransitionTime": "2024-05-01T10:01:00Z", "observedGeneration": 3},
            {"type": "Healthy", "status": "True", "reason": "ProbeSucceeded", "message": "ok",
             "lastTransitionTime": "2024-05-01T10:02:00Z"},
        ],
    },
}


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def test_full_object_parses_to_the_expected_values() -> None:
    p = parse_proxy(FULL_WIRE)
    assert p.key == "crawl/eu-1"
    assert p.metadata == ObjectMeta(
        "eu-1", namespace="crawl", uid="0b5c", resource_version="42", generation=3,
        creation_timestamp=ts("2024-05-01T10:00:00"), deletion_timestamp=ts("2024-05-02T10:00:00"),
        labels={"team": "crawl"}, annotations={"crawl.example.com/spec-hash": "ab12"},
        finalizers=("crawl.example.com/instance-cleanup",),
    )
    assert p.spec == ProxySpec(
        Mode.MANAGED, provider="gcp-eu",
        placement=Placement("europe-west1-b", region="europe-west1", machine_type="e2-micro"),
        cloud_init=CloudInit(secret_ref=SecretKeyRef("ci", key="cfg")),
        port=3128, max_leases=0, attributes={"region": "eu", "tier": "dc"},
        health_check=HealthCheck("https://example.org/204", interval_seconds=60,
                                 timeout_seconds=5, success_threshold=2, failure_threshold=4),
    )
    assert p.status.phase is Phase.READY
    assert p.status.provider_id == "proj/zone/px-abc"
    assert p.status.latency_ms == 120
    assert p.status.cooldowns["*"] == Cooldown(ts("2024-05-01T11:00:00"), reason="banned")
    assert p.status.condition("Provisioned") == Condition(
        "Provisioned", status="True", reason="Running", message="",
        last_transition_time=ts("2024-05-01T10:01:00"), observed_generation=3)


def test_round_trip_keeps_every_known_field_and_drops_unknown_ones() -> None:
    wire = unstructure(parse_proxy(FULL_WIRE))
    expected = {k: v for k, v in FULL_WIRE.items() if k not in ("apiVersion", "kind")}
    expected["metadata"] = {k: v for k, v in FULL_WIRE["metadata"].items()
                            if k != "managedFields"}
    assert wire == expected


def test_unknown_fields_are_ignored_on_read() -> None:
    raw = {"metadata": {"name": "a", "future": {"x": 1}},
           "spec": {"mode": "External", "endpoint": {"host": "h", "tls": True}, "newKnob": 3},
           "status": {"shiny": "new"}}
    assert parse_proxy(raw).spec.endpoint == Endpoint("h")


def test_minimal_object_gets_model_defaults() -> None:
    p = parse_proxy({"metadata": {"name": "a"}, "spec": {"mode": "External",
                                                           "endpoint": {"host": "h"}}})
    assert p.spec.port == 3128
    assert p.spec.max_leases is None
    assert p.spec.health_check == HealthCheck()
    assert p.status == ProxyStatus()
    assert p.metadata.namespace == "default"


def test_every_bad_field_is_reported_with_its_wire_path() -> None:
    raw = {
        "metadata": {"name": 3, "labels": {"a": 1}},
        "spec": {"mode": "Sideways", "endpoint": {"port": "x"}, "port": True,
                 "placement": "z", "healthCheck": {"probeURL": 7, "intervalSeconds": 1.5},
                 "cloudInit": {"secretRef": {}}},
        "status": {"conditions": [{"type": "Healthy", "status": "yes"}, 5],
                   "cooldowns": {"*": {"until": "soon"}}, "lastHealthCheckTime": 3,
                   "providerID": ["x"]},
    }
    with pytest.raises(ModelError) as info:
        parse_proxy(raw)
    assert sorted(info.value.problems) == sorted([
        "metadata.name: expected string, got 3",
        "metadata.labels[a]: expected string, got 1",
        "spec.mode: expected one of 'Managed', 'External', got 'Sideways'",
        "spec.placement: expected an object, got 'z'",
        "spec.cloudInit.secretRef.name: required field missing",
        "spec.endpoint.host: required field missing",
        "spec.endpoint.port: expected int, got 'x'",
        "spec.port: expected int, got True",
        "spec.healthCheck.probeURL: expected string, got 7",
        "spec.healthCheck.intervalSeconds: expected int, got 1.5",
        "status.providerID: expected string, got a list",
        "status.lastHealthCheckTime: expected an RFC 3339 timestamp, got 3",
        "status.cooldowns[*].until: expected an RFC 3339 timestamp, got 'soon'",
        "status.cooldowns[*].reason: required field missing",
        "status.conditions[0].status: expected one of 'True', 'False', 'Unknown', got 'yes'",
        "status.conditions[0].lastTransitionTime: required field missing",
        "status.conditions[1]: expected an object, got 5",
    ])
    assert isinstance(info.value, EgressdError)
    assert "spec.endpoint.port: expected int, got 'x'" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"metadata": {"name": "a"}}, "spec: required field missing"),
        ({"spec": {"mode": "External"}}, "metadata: required field missing"),
        ([], "<root>: expected an object, got a list"),
        ({"metadata": {"name": "a"}, "spec": None}, "spec: expected an object, got null"),
        ({"metadata": {"name": "a"}, "spec": {"mode": "Managed", "attributes": ["a"]}},
         "spec.attributes: expected an object, got a list"),
        ({"metadata": {"name": "a"}, "spec": {"mode": "Managed", "port": "3128"}},
         "spec.port: expected int, got '3128'"),
        ({"metadata": {"name": "a", "creationTimestamp": "2024-05-01 10:00"},
          "spec": {"mode": "Managed"}},
         "metadata.creationTimestamp: expected an RFC 3339 timestamp, got '2024-05-01 10:00'"),
        # JSON shapes are checked before cattrs iterates: a string is not a list of
        # characters, an object is not a list of its keys.
        ({"metadata": {"name": "a", "finalizers": "crawl.example.com/instance-cleanup"},
          "spec": {"mode": "Managed"}},
         "metadata.finalizers: expected a list, got 'crawl.example.com/instance-cleanup'"),
        ({"metadata": {"name": "a"}, "spec": {"mode": "Managed"},
          "status": {"conditions": {"type": "Healthy"}}},
         "status.conditions: expected a list, got an object"),
        ({"metadata": {"name": "a"}, "spec": {"mode": "Managed"},
          "status": {"cooldowns": [{"until": "2024-05-01T10:00:00Z", "reason": "x"}]}},
         "status.cooldowns: expected an object, got a list"),
        ({"metadata": {"name": "a", "labels": "team=crawl"}, "spec": {"mode": "Managed"}},
         "metadata.labels: expected an object, got 'team=crawl'"),
    ],
    ids=["no-spec", "no-metadata", "not-an-object", "null-spec", "attributes-list",
         "string-port", "timestamp-without-zone", "string-finalizers", "object-conditions",
         "list-cooldowns", "string-labels"],
)
def test_single_problems(raw: Any, problem: str) -> None:
    with pytest.raises(ModelError) as info:
        parse_proxy(raw)
    assert info.value.problems == [problem]


def test_structure_prefixes_a_path() -> None:
    with pytest.raises(ModelError) as info:
        structure({"port": 0.5, "host": "h"}, Endpoint, path="spec.endpoint")
    assert info.value.problems == ["spec.endpoint.port: expected int, got 0.5"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T10:00:00Z", dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC)),
        ("2024-05-01t10:00:00z", dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC)),
        ("2024-05-01T12:00:00+02:00", dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC)),
        ("2024-05-01T10:00:00.123456789Z",
         dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)),
    ],
    ids=["zulu", "lower-case", "offset", "nanoseconds"],
)
def test_parse_time(text: str, expected: dt.datetime) -> None:
    parsed = parse_time(text)
    assert parsed == expected
    assert parsed.tzinfo is dt.UTC


@pytest.mark.parametrize("text", ["2024-05-01", "2024-05-01T10:00:00", "yesterday", "",
                                  "2024-13-01T00:00:00Z"])
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time(text)


def test_format_time_is_utc_with_z() -> None:
    tz = dt.timezone(dt.timedelta(hours=2))
    assert format_time(dt.datetime(2024, 5, 1, 12, tzinfo=tz)) == "2024-05-01T10:00:00Z"
    assert format_time(dt.datetime(2024, 5, 1, 10, 0, 0, 500000, tzinfo=dt.UTC)) == (
        "2024-05-01T10:00:00.500000Z")
    with pytest.raises(ValueError, match="naive"):
        format_time(dt.datetime(2024, 5, 1, 10))


def test_unstructure_status_writes_nulls_for_a_merge_patch() -> None:
    status = ProxyStatus(Phase.PROVISIONING, provider_id="p/z/n")
    assert unstructure_status(status) == {
        "phase": "Provisioning", "providerID": "p/z/n", "ip": None, "host": None,
        "port": None, "observedGeneration": None, "latencyMs": None,
        "lastHealthCheckTime": None, "cooldowns": {}, "conditions": [],
    }


def test_unstructure_omits_absent_fields() -> None:
    spec = ProxySpec(Mode.EXTERNAL, endpoint=Endpoint("h"))
    assert unstructure(spec) == {
        "mode": "External", "endpoint": {"host": "h"}, "port": 3128, "attributes": {},
        "healthCheck": {"probeURL": "https://www.gstatic.com/generate_204",
                        "intervalSeconds": 30, "timeoutSeconds": 10, "successThreshold": 1,
                        "failureThreshold": 3},
    }


def test_values_are_immutable_and_hashable() -> None:
    p = parse_proxy(FULL_WIRE)
    assert hash(p) == hash(parse_proxy(FULL_WIRE))
    assert isinstance(p.spec.attributes, FrozenDict)
    assert isinstance(p.status.cooldowns, FrozenDict)
    with pytest.raises(TypeError):
        p.spec.attributes["region"] = "us"  # type: ignore[index]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        p.spec.port = 1  # type: ignore[misc]
    # A caller's dict is copied, so mutating it later cannot reach the value.
    attributes = {"region": "eu"}
    spec = ProxySpec(Mode.MANAGED, provider="x", attributes=attributes)
    attributes["region"] = "us"
    assert spec.attributes == {"region": "eu"}
    assert FrozenDict({"a": "1"}) | {"b": "2"} == {"a": "1", "b": "2"}


# -- property: anything the model can hold survives the wire ------------------------------

_text = st.text(min_size=1, max_size=8)
_times = st.datetimes(
    min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2100, 1, 1),
    timezones=st.just(dt.UTC),
)
_ints = st.integers(min_value=0, max_value=2**31)
_opt = st.none

_spec = st.builds(
    ProxySpec,
    st.sampled_from(Mode),
    provider=_opt() | _text,
    placement=_opt() | st.builds(Placement, _opt() | _text, region=_opt() | _text,
                                 machine_type=_opt() | _text),
    cloud_init=_opt() | st.builds(CloudInit, _opt() | _text,
                                  secret_ref=_opt() | st.builds(SecretKeyRef, _text, key=_text)),
    endpoint=_opt() | st.builds(Endpoint, _text, port=_opt() | _ints),
    port=_ints,
    max_leases=_opt() | _ints,
    attributes=st.dictionaries(_text, st.text(max_size=8), max_size=4),
    health_check=st.builds(HealthCheck, _text, interval_seconds=_ints, timeout_seconds=_ints,
                           success_threshold=_ints, failure_threshold=_ints),
)
_status = st.builds(
    ProxyStatus,
    _opt() | st.sampled_from(Phase),
    provider_id=_opt() | _text,
    ip=_opt() | _text,
    host=_opt() | _text,
    port=_opt() | _ints,
    observed_generation=_opt() | _ints,
    latency_ms=_opt() | _ints,
    last_health_check_time=_opt() | _times,
    cooldowns=st.dictionaries(_text, st.builds(Cooldown, _times, reason=_text), max_size=3),
    conditions=st.lists(
        st.builds(Condition, _text, status=st.sampled_from(["True", "False", "Unknown"]),
                  last_transition_time=_times, reason=st.text(max_size=8),
                  message=st.text(max_size=8), observed_generation=_opt() | _ints),
        max_size=3,
    ),
)
_proxy = st.builds(
    Proxy,
    st.builds(ObjectMeta, _text, namespace=_text, uid=st.text(max_size=8),
              resource_version=st.text(max_size=8), generation=_ints,
              creation_timestamp=_opt() | _times, deletion_timestamp=_opt() | _times,
              labels=st.dictionaries(_text, st.text(max_size=8), max_size=3),
              annotations=st.dictionaries(_text, st.text(max_size=8), max_size=3),
              finalizers=st.lists(_text, max_size=2)),
    spec=_spec,
    status=_status,
)


@settings(max_examples=150, deadline=None)
@given(_proxy)
def test_round_trip_property(value: Proxy) -> None:
    assert parse_proxy(unstructure(value)) == value
    assert structure(unstructure_status(value.status), ProxyStatus) == value.status
