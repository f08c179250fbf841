"""manifests/crd.yaml through CRDSchema and cel-python: every default, bound and rule.

Good objects are accepted with the right defaults; each bad one is rejected
with the message a real API server would give (SPEC §3, issue 2 item 4).
"""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml

from egressd.model.constants import VERSION
from egressd.model.convert import parse_proxy
from egressd.model.crd import load_crd
from egressd.sandbox.schema import RULES_NOT_CHECKED, CRDSchema

MANIFEST = pathlib.Path(__file__).resolve().parents[2] / "manifests" / "crd.yaml"
SCHEMA = CRDSchema.from_crd(yaml.safe_load(MANIFEST.read_text()), VERSION)

HEALTH_DEFAULTS = {
    "probeURL": "https://www.gstatic.com/generate_204",
    "intervalSeconds": 30,
    "timeoutSeconds": 10,
    "successThreshold": 1,
    "failureThreshold": 3,
}


def proxy(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                           "metadata": {"name": "px-1", "namespace": "crawl"}, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


def admit(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """What the fake API server does on a write: prune, default, validate."""
    pruned, _ = SCHEMA.prune(obj)
    defaulted = SCHEMA.apply_defaults(pruned)
    return [str(e) for e in SCHEMA.validate(defaulted, old)]


MANAGED = {"mode": "Managed", "provider": "gcp-eu"}
EXTERNAL = {"mode": "External", "endpoint": {"host": "proxy.example", "port": 8080}}


def test_package_and_manifest_are_the_same_crd() -> None:
    assert load_crd() == yaml.safe_load(MANIFEST.read_text())


@pytest.mark.parametrize(
    ("spec", "expected_spec"),
    [
        (MANAGED, {**MANAGED, "port": 3128, "healthCheck": HEALTH_DEFAULTS}),
        (EXTERNAL, {**EXTERNAL, "port": 3128, "healthCheck": HEALTH_DEFAULTS}),
        ({**MANAGED, "cloudInit": {"secretRef": {"name": "ci"}}},
         {**MANAGED, "cloudInit": {"secretRef": {"name": "ci", "key": "user-data"}},
          "port": 3128, "healthCheck": HEALTH_DEFAULTS}),
        ({**MANAGED, "healthCheck": {"intervalSeconds": 60}},
         {**MANAGED, "port": 3128, "healthCheck": {**HEALTH_DEFAULTS, "intervalSeconds": 60}}),
        ({**MANAGED, "placement": {"zone": "europe-west1-b", "machineType": "e2-micro"},
          "cloudInit": {"inline": "#cloud-config\n"}, "port": 8888, "maxLeases": 0,
          "attributes": {f"k{i}": "v" for i in range(32)},
          "healthCheck": {"probeURL": "http://example.org/204", "intervalSeconds": 5,
                          "timeoutSeconds": 4, "successThreshold": 2, "failureThreshold": 5}},
         None),
        ({"mode": "External", "endpoint": {"host": "h"}, "maxLeases": 50,
          "healthCheck": {"intervalSeconds": 3600, "timeoutSeconds": 60}}, None),
    ],
    ids=["managed-minimal", "external-minimal", "secret-key-default", "partial-health-check",
         "managed-everything", "external-bounds"],
)
def test_good_objects_are_accepted_with_defaults(
    spec: dict[str, Any], expected_spec: dict[str, Any] | None
) -> None:
    obj = proxy(spec)
    assert admit(obj) == []
    defaulted = SCHEMA.apply_defaults(obj)
    if expected_spec is not None:
        assert defaulted["spec"] == expected_spec
    # What the API server stores is what the model reads.
    assert parse_proxy(defaulted).spec.mode.value == spec["mode"]


def test_good_status_is_accepted() -> None:
    status = {
        "phase": "Ready", "providerID": "p/z/px-abc", "ip": "203.0.113.7",
        "host": "203.0.113.7", "port": 3128, "observedGeneration": 2, "latencyMs": 40,
        "lastHealthCheckTime": "2024-05-01T10:00:00Z",
        "cooldowns": {"*": {"until": "2024-05-01T11:00:00Z", "reason": "banned"}},
        "conditions": [{"type": "Healthy", "status": "True",
                        "lastTransitionTime": "2024-05-01T10:00:00Z"}],
    }
    obj = proxy(MANAGED, status)
    assert admit(obj) == []
    assert SCHEMA.apply_defaults(obj)["status"]["conditions"][0] == {
        "type": "Healthy", "status": "True", "lastTransitionTime": "2024-05-01T10:00:00Z",
        "reason": "", "message": ""}


def test_unknown_fields_are_pruned() -> None:
    obj = proxy({**MANAGED, "colour": "red", "healthCheck": {"retries": 3}},
                {"cooldowns": {"*": {"until": "2024-05-01T11:00:00Z", "reason": "x", "n": 1}}})
    pruned, dropped = SCHEMA.prune(obj)
    assert dropped == ["spec.colour", "spec.healthCheck.retries", "status.cooldowns[*].n"]
    assert "colour" not in pruned["spec"]


def with_health(**fields: Any) -> dict[str, Any]:
    return {**MANAGED, "healthCheck": fields}


# (spec, the API server's messages) — one row per rule and bound of SPEC §3.
BAD_SPECS = [
    # required and enum
    ({"provider": "x"}, ["spec.mode: Required value", str(RULES_NOT_CHECKED)]),
    ({"mode": "Hybrid"},
     ['spec.mode: Unsupported value: "Hybrid": supported values: "Managed", "External"',
      str(RULES_NOT_CHECKED)]),
    # cross-field rules
    ({"mode": "Managed"},
     ['spec: Invalid value: "object": a Managed proxy needs spec.provider']),
    ({**MANAGED, "endpoint": {"host": "h"}},
     ['spec: Invalid value: "object": a Managed proxy must not set spec.endpoint '
      "(its address comes from the provider)"]),
    ({"mode": "External"},
     ['spec: Invalid value: "object": an External proxy needs spec.endpoint']),
    ({**EXTERNAL, "provider": "gcp"},
     ['spec: Invalid value: "object": an External proxy must not set spec.provider']),
    ({**EXTERNAL, "cloudInit": {"inline": "x"}},
     ['spec: Invalid value: "object": an External proxy must not set spec.cloudInit']),
    ({**EXTERNAL, "placement": {"zone": "z"}},
     ['spec: Invalid value: "object": an External proxy must not set spec.placement']),
    ({**MANAGED, "cloudInit": {}},
     ['spec.cloudInit: Invalid value: "object": spec.cloudInit needs exactly one of inline '
      "and secretRef"]),
    ({**MANAGED, "cloudInit": {"inline": "x", "secretRef": {"name": "s"}}},
     ['spec.cloudInit: Invalid value: "object": spec.cloudInit needs exactly one of inline '
      "and secretRef"]),
    (with_health(timeoutSeconds=30, intervalSeconds=30),
     ['spec.healthCheck: Invalid value: "object": spec.healthCheck.timeoutSeconds must be '
      "less than intervalSeconds"]),
    (with_health(timeoutSeconds=20),  # against the default interval of 30: fine...
     []),
    (with_health(intervalSeconds=10),  # ...but the default timeout of 10 is not below 10
     ['spec.healthCheck: Invalid value: "object": spec.healthCheck.timeoutSeconds must be '
      "less than intervalSeconds"]),
    # lengths
    ({"mode": "Managed", "provider": ""},
     ['spec.provider: Invalid value: "": spec.provider in body should be at least 1 chars long'
      ]),
    ({**MANAGED, "cloudInit": {"inline": ""}},
     ['spec.cloudInit.inline: Invalid value: "": spec.cloudInit.inline in body should be at '
      "least 1 chars long"]),
    ({**MANAGED, "cloudInit": {"secretRef": {"name": "s", "key": ""}}},
     ['spec.cloudInit.secretRef.key: Invalid value: "": spec.cloudInit.secretRef.key in body '
      "should be at least 1 chars long"]),
    ({**MANAGED, "cloudInit": {"secretRef": {}}},
     ["spec.cloudInit.secretRef.name: Required value", str(RULES_NOT_CHECKED)]),
    ({"mode": "External", "endpoint": {"host": ""}},
     ['spec.endpoint.host: Invalid value: "": spec.endpoint.host in body should be at least 1 '
      "chars long"]),
    ({"mode": "External", "endpoint": {"port": 80}},
     ["spec.endpoint.host: Required value", str(RULES_NOT_CHECKED)]),
    # numeric bounds
    ({**MANAGED, "port": 0},
     ["spec.port: Invalid value: 0: spec.port in body should be greater than or equal to 1"]),
    ({**MANAGED, "port": 65536},
     ["spec.port: Invalid value: 65536: spec.port in body should be less than or equal to "
      "65535"]),
    ({**MANAGED, "port": "3128"},
     ['spec.port: Invalid value: "string": spec.port in body must be of type integer: '
      '"string"', str(RULES_NOT_CHECKED)]),
    ({"mode": "External", "endpoint": {"host": "h", "port": 0}},
     ["spec.endpoint.port: Invalid value: 0: spec.endpoint.port in body should be greater "
      "than or equal to 1"]),
    ({"mode": "External", "endpoint": {"host": "h", "port": 70000}},
     ["spec.endpoint.port: Invalid value: 70000: spec.endpoint.port in body should be less "
      "than or equal to 65535"]),
    ({**MANAGED, "maxLeases": -1},
     ["spec.maxLeases: Invalid value: -1: spec.maxLeases in body should be greater than or "
      "equal to 0"]),
    ({**MANAGED, "attributes": {f"k{i}": "v" for i in range(33)}},
     ["spec.attributes: Too many: 33: must have at most 32 items", str(RULES_NOT_CHECKED)]),
    ({**MANAGED, "attributes": {"tier": 1}},
     ['spec.attributes[tier]: Invalid value: "integer": spec.attributes[tier] in body must '
      'be of type string: "integer"', str(RULES_NOT_CHECKED)]),
    (with_health(intervalSeconds=4, timeoutSeconds=1),
     ["spec.healthCheck.intervalSeconds: Invalid value: 4: spec.healthCheck.intervalSeconds "
      "in body should be greater than or equal to 5"]),
    (with_health(intervalSeconds=3601),
     ["spec.healthCheck.intervalSeconds: Invalid value: 3601: "
      "spec.healthCheck.intervalSeconds in body should be less than or equal to 3600"]),
    (with_health(timeoutSeconds=0),
     ["spec.healthCheck.timeoutSeconds: Invalid value: 0: spec.healthCheck.timeoutSeconds "
      "in body should be greater than or equal to 1"]),
    (with_health(timeoutSeconds=61, intervalSeconds=120),
     ["spec.healthCheck.timeoutSeconds: Invalid value: 61: spec.healthCheck.timeoutSeconds "
      "in body should be less than or equal to 60"]),
    (with_health(successThreshold=0),
     ["spec.healthCheck.successThreshold: Invalid value: 0: "
      "spec.healthCheck.successThreshold in body should be greater than or equal to 1"]),
    (with_health(failureThreshold=0),
     ["spec.healthCheck.failureThreshold: Invalid value: 0: "
      "spec.healthCheck.failureThreshold in body should be greater than or equal to 1"]),
    (with_health(probeURL="gopher://x"),
     ['spec.healthCheck.probeURL: Invalid value: "gopher://x": spec.healthCheck.probeURL in '
      "body should match '^https?://[^/?#]+'"]),
]


@pytest.mark.parametrize(("spec", "expected"), BAD_SPECS,
                         ids=[f"{i:02d}" for i in range(len(BAD_SPECS))])
def test_bad_specs_are_rejected_with_the_right_message(
    spec: dict[str, Any], expected: list[str]
) -> None:
    assert admit(proxy(spec)) == expected


def test_verdicts_do_not_depend_on_what_was_admitted_before() -> None:
    """One compiled schema serves every object (the fake server caches it across tests).

    Whatever a caller does with what the schema handed out earlier (defaulted
    objects, printer columns), later verdicts stay the same, in any order, and
    admission never changes the caller's object.
    """
    first = [admit(proxy(copy.deepcopy(spec))) for spec, _ in BAD_SPECS]
    for spec, _ in BAD_SPECS:
        obj = proxy(copy.deepcopy(spec))
        before = copy.deepcopy(obj)
        SCHEMA.validate(obj, obj)
        SCHEMA.prune(obj)
        defaulted = SCHEMA.apply_defaults(obj)
        assert obj == before
        # Scribble over every default the schema handed out.
        health = defaulted["spec"]["healthCheck"]
        health.update(intervalSeconds="x", timeoutSeconds=None, probeURL=7)
        SCHEMA.printer_columns.clear()
    again = [admit(proxy(copy.deepcopy(spec))) for spec, _ in reversed(BAD_SPECS)]
    assert list(reversed(again)) == first == [expected for _, expected in BAD_SPECS]
    assert SCHEMA.apply_defaults(proxy(MANAGED))["spec"]["healthCheck"] == HEALTH_DEFAULTS


def test_a_missing_spec_is_required() -> None:
    obj = proxy(MANAGED)
    del obj["spec"]
    assert admit(obj) == ["spec: Required value", str(RULES_NOT_CHECKED)]


def test_several_problems_are_reported_together() -> None:
    assert admit(proxy({"mode": "External", "endpoint": {"host": "h"}, "provider": "g",
                        "placement": {}, "port": 0})) == [
        "spec.port: Invalid value: 0: spec.port in body should be greater than or equal to 1",
        'spec: Invalid value: "object": an External proxy must not set spec.provider',
        'spec: Invalid value: "object": an External proxy must not set spec.placement',
    ]


@pytest.mark.parametrize(
    ("old_mode", "new_spec", "expected"),
    [
        ("Managed", EXTERNAL, ['spec.mode: Invalid value: "string": spec.mode is immutable']),
        ("External", MANAGED, ['spec.mode: Invalid value: "string": spec.mode is immutable']),
        ("Managed", {**MANAGED, "port": 8080}, []),
    ],
    ids=["managed-to-external", "external-to-managed", "other-changes-allowed"],
)
def test_mode_is_immutable(old_mode: str, new_spec: dict[str, Any],
                           expected: list[str]) -> None:
    old = SCHEMA.apply_defaults(proxy(MANAGED if old_mode == "Managed" else EXTERNAL))
    assert admit(proxy(new_spec), old) == expected


BAD_STATUSES = [
    ({"phase": "Sleeping"},
     ['status.phase: Unsupported value: "Sleeping": supported values: "Pending", '
      '"Provisioning", "Ready", "Unhealthy", "Failed", "Deleting"', str(RULES_NOT_CHECKED)]),
    ({"lastHealthCheckTime": "five past ten"},
     ['status.lastHealthCheckTime: Invalid value: "five past ten": status.lastHealthCheckTime '
      'in body must be of type date-time: "five past ten"', str(RULES_NOT_CHECKED)]),
    ({"latencyMs": -1},
     ["status.latencyMs: Invalid value: -1: status.latencyMs in body should be greater than "
      "or equal to 0"]),
    ({"cooldowns": {"example.org": {"until": "2024-05-01T11:00:00Z"}}},
     ["status.cooldowns[example.org].reason: Required value", str(RULES_NOT_CHECKED)]),
    ({"cooldowns": {"*": {"until": "later", "reason": "banned"}}},
     ['status.cooldowns[*].until: Invalid value: "later": status.cooldowns[*].until in body '
      'must be of type date-time: "later"', str(RULES_NOT_CHECKED)]),
    ({"conditions": [{"type": "Healthy", "status": "Maybe",
                      "lastTransitionTime": "2024-05-01T10:00:00Z"}]},
     ['status.conditions[0].status: Unsupported value: "Maybe": supported values: "True", '
      '"False", "Unknown"', str(RULES_NOT_CHECKED)]),
    ({"conditions": [{"type": "Healthy", "status": "True"}]},
     ["status.conditions[0].lastTransitionTime: Required value", str(RULES_NOT_CHECKED)]),
    ({"conditions": [
        {"type": "Healthy", "status": "True", "lastTransitionTime": "2024-05-01T10:00:00Z"},
        {"type": "Healthy", "status": "False", "lastTransitionTime": "2024-05-01T10:00:00Z"}]},
     ['status.conditions[1]: Duplicate value: map[string]interface {}{"type":"Healthy"}']),
]


@pytest.mark.parametrize(("status", "expected"), BAD_STATUSES,
                         ids=[f"{i:02d}" for i in range(len(BAD_STATUSES))])
def test_bad_statuses_are_rejected(status: dict[str, Any], expected: list[str]) -> None:
    assert admit(proxy(MANAGED, status)) == expected


def test_defaults_do_not_overwrite_given_values() -> None:
    spec = {**MANAGED, "port": 9000, "healthCheck": {"probeURL": "https://a.example/",
                                                     "failureThreshold": 9}}
    defaulted = SCHEMA.apply_defaults(proxy(copy.deepcopy(spec)))["spec"]
    assert defaulted["port"] == 9000
    assert defaulted["healthCheck"] == {**HEALTH_DEFAULTS, "probeURL": "https://a.example/",
                                        "failureThreshold": 9}


def _defaulted_nodes(node: Any, path: str) -> Any:
    """(path, schema) of every schema node with a `default`, as kube-apiserver walks them."""
    if "default" in node:
        yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from _defaulted_nodes(child, f"{path}.properties[{key}]")
    if isinstance(node.get("items"), dict):
        yield from _defaulted_nodes(node["items"], f"{path}.items")


def test_every_default_passes_its_own_schema_and_rules() -> None:
    """kube-apiserver refuses a CRD whose `default` fails its node's schema or CEL rules.

    It checks the default as written, before the children's defaults fill it in:
    `healthCheck: default: {}` meets `timeoutSeconds < intervalSeconds` only through
    the rule's `has()` guards.
    """
    (version,) = load_crd()["spec"]["versions"]
    nodes = list(_defaulted_nodes(version["schema"]["openAPIV3Schema"], "openAPIV3Schema"))
    assert len(nodes) == 10
    for path, node in nodes:
        single = {"type": "object", "properties": {"value": node}}
        crd = {"metadata": {"name": "defaults.example.com"}, "spec": {"versions": [
            {"name": "v1", "schema": {"openAPIV3Schema": single}}]}}
        schema = CRDSchema.from_crd(crd, "v1")
        value = {"value": copy.deepcopy(node["default"])}
        assert schema.validate(value, value) == [], path


def test_rules_use_core_cel_only() -> None:
    """NOTES.md: no `?.` and no Kubernetes CEL libraries, so cel-python can run them."""
    rules = list(_rules(load_crd()))
    assert len(rules) == 9
    for rule in rules:
        for banned in ("?.", "isURL", "url(", "lowerAscii", "quantity(", "isCIDR", "optMap"):
            assert banned not in rule


def _rules(node: Any) -> Any:
    if isinstance(node, dict):
        for entry in node.get("x-kubernetes-validations", ()):
            yield entry["rule"]
        for value in node.values():
            yield from _rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from _rules(value)
