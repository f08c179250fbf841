"""The attrs model and the CRD's schema agree field by field, both directions.

If either side gains a field (or a default, a required marker, an enum value)
the other lacks, a test here fails and names it.
"""

from __future__ import annotations

import copy
import datetime as dt
import enum
import pathlib
import types
import typing
from collections.abc import Mapping
from typing import Any

import attrs
import pytest

from egressd.model import constants
from egressd.model.constants import Mode, Phase
from egressd.model.convert import wire_name
from egressd.model.crd import load_crd
from egressd.model.proxy import Cooldown, HealthCheck, Proxy, ProxySpec, ProxyStatus

REPO = pathlib.Path(__file__).resolve().parents[2]


def version_schema() -> dict[str, Any]:
    crd = load_crd()
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        assert len(args) == 1, tp
        return args[0]
    return tp


def compare(cls: type, schema: Mapping[str, Any], path: str) -> list[str]:
    """Differences between an attrs class and its schema node, recursively."""
    problems: list[str] = []
    fields = {wire_name(f.name): f for f in attrs.fields(cls)}
    hints = typing.get_type_hints(cls)
    props: Mapping[str, Any] = schema.get("properties", {})
    for missing in sorted(set(fields) - set(props)):
        problems.append(f"{path}.{missing}: in the model, not in the CRD")
    for missing in sorted(set(props) - set(fields)):
        problems.append(f"{path}.{missing}: in the CRD, not in the model")
    required_model = {
        name for name, f in fields.items()
        if f.default is attrs.NOTHING and name in props
    }
    required_crd = set(schema.get("required", ())) & set(fields)
    if required_model != required_crd:
        problems.append(f"{path}: required in model {sorted(required_model)} "
                        f"but in CRD {sorted(required_crd)}")
    for name in sorted(set(fields) & set(props)):
        problems.extend(compare_field(fields[name], hints[fields[name].name], props[name],
                                      f"{path}.{name}"))
    return problems


def compare_type(tp: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    tp = unwrap_optional(tp)
    origin = typing.get_origin(tp)
    kind = schema.get("type")
    if attrs.has(tp):
        if kind != "object":
            return [f"{path}: model has an object, CRD type {kind!r}"]
        return compare(tp, schema, path)
    if origin in (Mapping, dict):
        value_type = typing.get_args(tp)[1]
        ap = schema.get("additionalProperties")
        if kind != "object" or not isinstance(ap, Mapping):
            return [f"{path}: model has a map, CRD has no additionalProperties"]
        return compare_type(value_type, ap, f"{path}[*]")
    if origin is tuple:
        if kind != "array":
            return [f"{path}: model has a list, CRD type {kind!r}"]
        return compare_type(typing.get_args(tp)[0], schema["items"], f"{path}[*]")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if schema.get("enum") != [m.value for m in tp]:
            return [f"{path}: enum {[m.value for m in tp]} vs CRD {schema.get('enum')}"]
        return []
    expected = {int: ("integer", None), str: ("string", None),
                dt.datetime: ("string", "date-time")}[tp]
    if (kind, schema.get("format") if tp is dt.datetime else None) != expected:
        return [f"{path}: model {tp.__name__} vs CRD {kind!r} {schema.get('format')!r}"]
    return []


def compare_field(field: attrs.Attribute[Any], tp: Any, schema: Mapping[str, Any],
                  path: str) -> list[str]:
    problems = compare_type(tp, schema, path)
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()
    if default in (None, attrs.NOTHING) or unwrap_optional(tp) in (
        typing.Mapping[str, str],
    ) or isinstance(default, tuple | Mapping):
        # No default on either side for absent values, maps and lists.
        if "default" in schema and default is None:
            problems.append(f"{path}: CRD default {schema['default']!r}, model has none")
        return problems
    if attrs.has(type(default)):
        # A nested object default: the CRD must default it to {} so its children fill in.
        if schema.get("default") != {}:
            problems.append(f"{path}: model defaults the object, CRD default "
                            f"{schema.get('default')!r}")
    elif schema.get("default") != default:
        problems.append(f"{path}: model default {default!r}, CRD {schema.get('default')!r}")
    return problems


def test_spec_agrees_with_the_crd() -> None:
    assert compare(ProxySpec, version_schema()["properties"]["spec"], "spec") == []


def test_status_agrees_with_the_crd() -> None:
    assert compare(ProxyStatus, version_schema()["properties"]["status"], "status") == []


def test_root_fields() -> None:
    props = set(version_schema()["properties"])
    assert props - {"apiVersion", "kind"} == {wire_name(f.name) for f in attrs.fields(Proxy)}


def test_the_comparison_notices_a_new_field() -> None:
    @attrs.frozen
    class Grown:
        mode: Mode
        shiny: int = 0

    problems = compare(Grown, version_schema()["properties"]["spec"], "spec")
    assert "spec.shiny: in the model, not in the CRD" in problems
    assert "spec.provider: in the CRD, not in the model" in problems


def _object_nodes(node: dict[str, Any], path: str) -> Any:
    """(wire path, schema) of every object node with properties, as `compare` names them."""
    if node.get("properties"):
        yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from _object_nodes(child, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _object_nodes(node["additionalProperties"], f"{path}[*]")
    if isinstance(node.get("items"), dict):
        yield from _object_nodes(node["items"], f"{path}[*]")


@pytest.mark.parametrize("part", ["spec", "status"])
def test_the_comparison_notices_a_crd_field_at_every_depth(part: str) -> None:
    cls = {"spec": ProxySpec, "status": ProxyStatus}[part]
    schema = version_schema()["properties"][part]
    paths = [path for path, _ in _object_nodes(schema, part)]
    # spec, placement, cloudInit, secretRef, endpoint, healthCheck / status, cooldowns, conditions
    assert len(paths) == {"spec": 6, "status": 3}[part]
    for path in paths:
        grown = copy.deepcopy(schema)
        node = dict(_object_nodes(grown, part))[path]
        node["properties"]["shiny"] = {"type": "integer"}
        assert compare(cls, grown, part) == [f"{path}.shiny: in the CRD, not in the model"]


# A model that grew a field two levels down (module level, so type hints resolve).
@attrs.frozen
class _GrownHealthCheck(HealthCheck):
    jitter_seconds: int = attrs.field(default=0, kw_only=True)


@attrs.frozen
class _GrownSpec(ProxySpec):
    health_check: _GrownHealthCheck = attrs.field(factory=_GrownHealthCheck, kw_only=True)


@attrs.frozen
class _GrownCooldown(Cooldown):
    count: int = attrs.field(default=0, kw_only=True)


@attrs.frozen
class _GrownStatus(ProxyStatus):
    cooldowns: Mapping[str, _GrownCooldown] = attrs.field(factory=dict, kw_only=True)


def test_the_comparison_notices_a_model_field_at_depth() -> None:
    schema = version_schema()["properties"]
    assert compare(_GrownSpec, schema["spec"], "spec") == [
        "spec.healthCheck.jitterSeconds: in the model, not in the CRD"]
    assert compare(_GrownStatus, schema["status"], "status") == [
        "status.cooldowns[*].count: in the model, not in the CRD"]


def test_the_comparison_notices_a_changed_default() -> None:
    @attrs.frozen
    class Spec:
        mode: Mode
        port: int = 8080

    schema = {"type": "object", "required": ["mode"], "properties": {
        "mode": {"type": "string", "enum": ["Managed", "External"]},
        "port": {"type": "integer", "default": 3128},
    }}
    assert compare(Spec, schema, "spec") == ["spec.port: model default 8080, CRD 3128"]


def test_names_and_enums_match_constants() -> None:
    crd = load_crd()
    assert crd["metadata"]["name"] == constants.CRD_NAME
    assert crd["spec"]["group"] == constants.GROUP
    assert crd["spec"]["names"]["kind"] == constants.KIND
    assert crd["spec"]["names"]["plural"] == constants.PLURAL
    assert crd["spec"]["names"]["shortNames"] == list(constants.SHORT_NAMES)
    (version,) = crd["spec"]["versions"]
    assert version["name"] == constants.VERSION
    assert constants.API_VERSION == "crawl.example.com/v1alpha1"
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["phase"]["enum"] == [p.value for p in Phase]
    cond_status = status["properties"]["conditions"]["items"]["properties"]["status"]
    assert cond_status["enum"] == list(constants.CONDITION_STATUSES)


def test_packaged_crd_is_a_symlink_to_the_manifest() -> None:
    link = REPO / "egressd" / "model" / "crd.yaml"
    assert link.is_symlink()
    assert link.resolve() == (REPO / "manifests" / "crd.yaml").resolve()


def test_load_crd_returns_a_fresh_copy() -> None:
    first = load_crd()
    first["spec"]["group"] = "mutated"
    assert load_crd()["spec"]["group"] == constants.GROUP


@pytest.mark.parametrize(
    ("name", "json_path", "type_"),
    [
        ("Mode", ".spec.mode", "string"),
        ("Phase", ".status.phase", "string"),
        ("Host", ".status.host", "string"),
        ("Port", ".status.port", "integer"),
        ("Healthy", '.status.conditions[?(@.type=="Healthy")].status', "string"),
        ("Latency", ".status.latencyMs", "integer"),
        ("Age", ".metadata.creationTimestamp", "date"),
        ("Provider-ID", ".status.providerID", "string"),
        ("IP", ".status.ip", "string"),
    ],
)
def test_printer_columns(name: str, json_path: str, type_: str) -> None:
    (version,) = load_crd()["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Mode", "Phase", "Host", "Port", "Healthy", "Latency", "Age",
                             "Provider-ID", "IP"]
    # The last two only with -o wide.
    assert [c.get("priority", 0) for c in columns.values()] == [0] * 7 + [1, 1]
    assert columns[name]["jsonPath"] == json_path
    assert columns[name]["type"] == type_


def test_status_subresource_and_scope() -> None:
    crd = load_crd()
    (version,) = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["scope"] == "Namespaced"
    assert version["served"] and version["storage"]
