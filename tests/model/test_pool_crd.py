"""manifests/proxypool-crd.yaml through CRDSchema and cel-python: defaults, bounds, and
every CEL rule with its message (issue 13 item 1); the template stays in step with
the Proxy CRD's spec."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml

from egressd.model import constants
from egressd.model.convert import parse_pool
from egressd.model.crd import load_crd, load_pool_crd
from egressd.sandbox.schema import CRDSchema

REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = REPO / "manifests" / "proxypool-crd.yaml"
SCHEMA = CRDSchema.from_crd(yaml.safe_load(MANIFEST.read_text()), constants.VERSION)

MANAGED = {"template": {"spec": {"mode": "Managed", "provider": "gcp-eu"}}, "replicas": 3}
EXTERNAL = {"template": {"spec": {"mode": "External"}},
            "endpoints": [{"host": "203.0.113.1"}, {"host": "203.0.113.2", "port": 8080}]}


def pool(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": constants.API_VERSION, "kind": constants.POOL_KIND,
            "metadata": {"name": "eu", "namespace": "crawl"}, "spec": copy.deepcopy(spec)}


def admit(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    pruned, _ = SCHEMA.prune(obj)
    return [str(e) for e in SCHEMA.validate(SCHEMA.apply_defaults(pruned), old)]


def defaulted(obj: dict[str, Any]) -> dict[str, Any]:
    pruned, _ = SCHEMA.prune(obj)
    result: dict[str, Any] = SCHEMA.apply_defaults(pruned)
    return result


def test_package_and_manifest_are_the_same_crd() -> None:
    assert load_pool_crd() == yaml.safe_load(MANIFEST.read_text())
    link = REPO / "egressd" / "model" / "proxypool-crd.yaml"
    assert link.is_symlink() and link.resolve() == MANIFEST.resolve()


def test_names_subresources_and_columns() -> None:
    crd = load_pool_crd()
    assert crd["metadata"]["name"] == constants.POOL_CRD_NAME
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "ProxyPool", "proxypools", ["pxp"])
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.labelSelector"}
    assert "status" in version["subresources"]
    default_columns = [c["name"] for c in version["additionalPrinterColumns"]
                       if not c.get("priority")]
    assert default_columns == ["Desired", "Current", "Ready", "Leased", "Age"]


def test_good_pools_are_accepted_with_defaults() -> None:
    assert admit(pool(MANAGED)) == []
    assert admit(pool(EXTERNAL)) == []
    spec = defaulted(pool(MANAGED))["spec"]
    assert (spec["maxUnavailable"], spec["maxSurge"], spec["drainTimeoutSeconds"],
            spec["failureThreshold"]) == (1, 1, 600, 3)
    assert spec["template"]["spec"]["port"] == 3128  # the Proxy spec's own defaults apply
    auto = {**MANAGED, "minReplicas": 0, "maxReplicas": 10, "autoscale": {},
            "recycle": {"maxAgeSeconds": 86400, "maxBans": 3, "banWindowSeconds": 3600}}
    assert admit(pool(auto)) == []
    parsed = parse_pool(defaulted(pool(auto)))
    assert parsed.spec.autoscale is not None
    assert parsed.spec.autoscale.scale_down_stabilization_seconds == 300
    assert parsed.spec.recycle is not None and parsed.spec.recycle.max_replacements_per_minute == 1


BAD = [
    ({**EXTERNAL, "endpoints": []}, "an External pool needs spec.endpoints"),
    ({"template": EXTERNAL["template"]}, "an External pool needs spec.endpoints"),
    ({**MANAGED, "endpoints": [{"host": "a"}]}, "a Managed pool must not set spec.endpoints"),
    ({**EXTERNAL, "replicas": 2}, "edit spec.endpoints, not spec.replicas"),
    ({**EXTERNAL, "autoscale": {}, "maxReplicas": 3}, "an External pool cannot autoscale"),
    ({**EXTERNAL, "recycle": {"maxAgeSeconds": 600}}, "an External pool cannot recycle"),
    ({**MANAGED, "autoscale": {}}, "spec.autoscale and spec.maxReplicas go together"),
    ({**MANAGED, "maxReplicas": 4}, "spec.autoscale and spec.maxReplicas go together"),
    ({**MANAGED, "minReplicas": 1}, "spec.minReplicas applies only with spec.autoscale"),
    ({**MANAGED, "autoscale": {}, "minReplicas": 5, "maxReplicas": 4},
     "spec.minReplicas must not exceed spec.maxReplicas"),
    ({**MANAGED, "maxUnavailable": 0, "maxSurge": 0},
     "spec.maxUnavailable and spec.maxSurge cannot both be 0"),
    ({**MANAGED, "recycle": {"maxBans": 2}},
     "spec.recycle.maxBans needs spec.recycle.banWindowSeconds"),
    ({"template": {"spec": {"mode": "Managed"}}},
     "a Managed template needs spec.template.spec.provider"),
    ({**EXTERNAL, "template": {"spec": {"mode": "External", "provider": "x"}}},
     "an External template must not set provider"),
    ({**EXTERNAL, "template": {"spec": {"mode": "External", "placement": {"zone": "z"}}}},
     "an External template must not set placement"),
    ({**MANAGED, "replicas": -1}, "spec.replicas"),
    ({**MANAGED, "template": {"spec": {"mode": "Managed", "provider": "p",
                                       "healthCheck": {"intervalSeconds": 5,
                                                       "timeoutSeconds": 9}}}},
     "timeoutSeconds must be less than intervalSeconds"),
]


@pytest.mark.parametrize(("spec", "message"), BAD)
def test_bad_pools_are_rejected_with_a_clear_message(spec: dict[str, Any], message: str) -> None:
    problems = admit(pool(spec))
    assert problems, f"accepted: {spec}"
    assert any(message in p for p in problems), problems


def test_template_mode_is_immutable() -> None:
    old = defaulted(pool(MANAGED))
    new = pool({**EXTERNAL})
    assert any("spec.template.spec.mode is immutable" in p for p in admit(new, old))
    changed = pool({**MANAGED, "replicas": 5})
    assert admit(changed, old) == []


def _strip(schema: Any) -> Any:
    """A schema without descriptions and rules (those differ on purpose)."""
    if isinstance(schema, dict):
        return {k: _strip(v) for k, v in schema.items()
                if k not in ("description", "x-kubernetes-validations")}
    if isinstance(schema, list):
        return [_strip(v) for v in schema]
    return schema


def test_the_template_is_the_proxy_spec_without_endpoint() -> None:
    proxy_spec = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]
    (version,) = load_pool_crd()["spec"]["versions"]
    template = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "template"]["properties"]["spec"]
    expected = _strip(proxy_spec)
    del expected["properties"]["endpoint"]
    assert _strip(template) == expected


def _walk(schema: dict[str, Any], path: str) -> list[str]:
    missing = [] if schema.get("description") or path.endswith(".metadata") else [path]
    for name, child in (schema.get("properties") or {}).items():
        missing += _walk(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            missing += _walk(schema[key], f"{path}[]")
    return missing


def test_every_field_has_a_description() -> None:
    (version,) = load_pool_crd()["spec"]["versions"]
    assert _walk(version["schema"]["openAPIV3Schema"], "") == []
