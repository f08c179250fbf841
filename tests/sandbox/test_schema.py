"""CRDSchema on small inline CRDs: pruning, defaulting, structural checks, CEL rules."""

from __future__ import annotations

from typing import Any

import pytest

from egressd.sandbox.schema import (
    RULES_NOT_CHECKED,
    CRDSchema,
    FieldError,
    SchemaError,
    invalid_message,
)


def crd(schema: dict[str, Any], **version: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": schema}, **version}],
        },
    }


def obj_schema(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {"type": "object", "properties": props, **extra},
    }}


def schema_for(props: dict[str, Any], **extra: Any) -> CRDSchema:
    return CRDSchema.from_crd(crd(obj_schema(props, **extra)), "v1")


def errors(schema: CRDSchema, spec: Any, old_spec: Any = None) -> list[str]:
    old = None if old_spec is None else {"spec": old_spec}
    return [str(e) for e in schema.validate({"spec": spec}, old)]


# -- construction ---------------------------------------------------------------------


def test_unknown_version_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="no version 'v2'"):
        CRDSchema.from_crd(crd(obj_schema({})), "v2")


def test_rule_that_does_not_compile_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match=r"spec: CEL rule 'self.a ==' does not compile"):
        schema_for({}, **{"x-kubernetes-validations": [{"rule": "self.a =="}]})


@pytest.mark.parametrize(("props", "message"), [
    ({"n": {"type": "integer", "minimum": "1"}}, r"spec\.n: minimum must be a number"),
    ({"n": {"type": "string", "maxLength": -1}}, r"maxLength must be a non-negative integer"),
    ({"n": {"type": "string", "pattern": "("}}, r"pattern '\(' does not compile"),
    ({"n": {"type": "dict"}}, r"unsupported type 'dict'"),
    ({"n": "integer"}, r"spec\.n: a schema must be an object"),
    ({"n": {"type": "object", "required": "a"}}, r"required must be a list of strings"),
    ({"n": {"type": "array", "items": []}}, r"items must be a schema"),
    ({"n": {"type": "object", "properties": ["a"]}}, r"properties must be an object"),
    ({"n": {"type": "string", "enum": "a"}}, r"enum must be a list"),
    ({"n": {"type": "string", "x-kubernetes-validations": [{"message": "m"}]}},
     r"needs a string rule"),
])
def test_malformed_keywords_are_schema_errors(props: dict[str, Any], message: str) -> None:
    # A CRD like this must be refused up front, not crash while an object is validated.
    with pytest.raises(SchemaError, match=message):
        schema_for(props)


_DEFAULT_AT = r"spec\.versions\[0\]\.schema\.openAPIV3Schema\.properties\[spec\]"


@pytest.mark.parametrize(("props", "message"), [
    # The default is checked as written: its children's defaults do not fill it first.
    ({"hc": {"type": "object", "default": {},
             "x-kubernetes-validations": [{"rule": "self.t < self.i"}],
             "properties": {"t": {"type": "integer", "default": 1},
                            "i": {"type": "integer", "default": 2}}}},
     _DEFAULT_AT + r'\.properties\[hc\]\.default: Invalid value: "object": no such key: t '
     r"evaluating rule: self\.t < self\.i"),
    ({"n": {"type": "integer", "minimum": 1, "default": 0}},
     _DEFAULT_AT + r"\.properties\[n\]\.default: Invalid value: 0: .* should be greater "
     r"than or equal to 1"),
    ({"o": {"type": "object", "properties": {"a": {"type": "string"}},
            "default": {"a": "x", "b": "y"}}},
     _DEFAULT_AT + r"\.properties\[o\]\.default: .*must not have unknown fields"),
    ({"l": {"type": "array", "items": {"type": "string", "enum": ["a"], "default": "b"}}},
     _DEFAULT_AT + r'\.properties\[l\]\.items\.default: Unsupported value: "b"'),
    ({"m": {"type": "string", "default": "x",
            "x-kubernetes-validations": [{"rule": "self == oldSelf && self != 'x'",
                                          "message": "not x"}]}},
     r"default: Invalid value: \"string\": not x"),
], ids=["rule-reads-a-child", "out-of-bounds", "unknown-field", "list-item", "transition-rule"])
def test_defaults_a_real_server_refuses_are_schema_errors(props: dict[str, Any],
                                                          message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        schema_for(props)


def test_defaults_that_pass_their_schema_and_rules_are_accepted() -> None:
    schema = schema_for({
        "hc": {"type": "object", "default": {},
               "x-kubernetes-validations": [
                   {"rule": "!has(self.t) || !has(self.i) || self.t < self.i"}],
               "properties": {"t": {"type": "integer", "default": 1},
                              "i": {"type": "integer", "default": 2}}},
        # Defaults under additionalProperties are not checked, as in kube-apiserver.
        "m": {"type": "object", "additionalProperties": {"type": "integer", "default": "x"}},
    })
    assert schema.apply_defaults({"spec": {}})["spec"]["hc"] == {"t": 1, "i": 2}


def test_printer_columns_and_status_subresource() -> None:
    columns = [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}]
    schema = CRDSchema.from_crd(
        crd(obj_schema({}), additionalPrinterColumns=columns, subresources={"status": {}}),
        "v1")
    assert schema.printer_columns == columns
    schema.printer_columns.clear()  # a copy: the schema keeps its own
    assert schema.printer_columns == columns
    assert schema.status_subresource
    assert not schema_for({}).status_subresource


# -- pruning ----------------------------------------------------------------------------


def test_prune_drops_unknown_fields_and_reports_paths() -> None:
    schema = schema_for({
        "known": {"type": "object", "properties": {"a": {"type": "string"}}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                 "properties": {"inner": {"type": "object", "properties": {}}}},
        "items": {"type": "array", "items": {"type": "object",
                                             "properties": {"n": {"type": "integer"}}}},
    })
    obj = {
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "anything": 1},
        "spec": {
            "known": {"a": "x", "b": 1},
            "labels": {"x": "1", "y": "2"},
            "free": {"whatever": {"deep": True}, "inner": {"gone": 1}},
            "items": [{"n": 1, "m": 2}, {"n": 2}],
            "extra": [1],
        },
        "status": {"s": 1},
    }
    pruned, dropped = schema.prune(obj)
    assert dropped == ["spec.known.b", "spec.free.inner.gone", "spec.items[0].m",
                       "spec.extra", "status"]
    assert pruned == {
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "anything": 1},
        "spec": {"known": {"a": "x"}, "labels": {"x": "1", "y": "2"},
                 "free": {"whatever": {"deep": True}, "inner": {}}, "items": [{"n": 1}, {"n": 2}]},
    }
    assert obj["spec"]["known"] == {"a": "x", "b": 1}  # the input is not touched


def test_prune_keeps_embedded_resource_metadata() -> None:
    schema = schema_for({"template": {
        "type": "object", "x-kubernetes-embedded-resource": True,
        "properties": {"spec": {"type": "object", "properties": {}}}}})
    pruned, dropped = schema.prune({"spec": {"template": {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": 1}}}})
    assert dropped == ["spec.template.spec.x"]
    assert pruned["spec"]["template"]["metadata"] == {"name": "p"}


def test_schemaless_version_preserves_everything() -> None:
    raw = crd(obj_schema({}))
    del raw["spec"]["versions"][0]["schema"]
    schema = CRDSchema.from_crd(raw, "v1")
    assert schema.prune({"spec": {"a": 1}, "other": 2}) == ({"spec": {"a": 1}, "other": 2}, [])


# -- defaulting -------------------------------------------------------------------------


def test_defaults_fill_nested_objects_after_an_empty_default() -> None:
    schema = schema_for({
        "size": {"type": "integer", "default": 3},
        "probe": {"type": "object", "default": {}, "properties": {
            "every": {"type": "integer", "default": 30},
            "deep": {"type": "object", "default": {}, "properties": {
                "x": {"type": "string", "default": "y"}}},
            "none": {"type": "string"},
        }},
        "list": {"type": "array", "items": {"type": "object", "properties": {
            "k": {"type": "string", "default": "v"}}}},
        "map": {"type": "object", "additionalProperties": {"type": "object", "properties": {
            "n": {"type": "integer", "default": 1}}}},
    })
    out = schema.apply_defaults({"metadata": {"name": "w"},
                                 "spec": {"list": [{}, {"k": "set"}], "map": {"a": {}}}})
    assert out["spec"] == {
        "size": 3,
        "probe": {"every": 30, "deep": {"x": "y"}},
        "list": [{"k": "v"}, {"k": "set"}],
        "map": {"a": {"n": 1}},
    }
    kept = schema.apply_defaults({"spec": {"size": 5, "probe": {"every": 60}}})
    assert kept["spec"]["size"] == 5
    assert kept["spec"]["probe"] == {"every": 60, "deep": {"x": "y"}}


def test_nulls_are_defaulted_or_dropped_unless_nullable() -> None:
    schema = schema_for({
        "size": {"type": "integer", "default": 3},
        "name": {"type": "string"},
        "note": {"type": "string", "nullable": True},
    })
    out = schema.apply_defaults({"spec": {"size": None, "name": None, "note": None}})
    assert out["spec"] == {"size": 3, "note": None}
    assert schema.validate(out) == []


def test_status_is_defaulted_too() -> None:
    raw = obj_schema({})
    raw["properties"]["status"] = {"type": "object", "properties": {
        "phase": {"type": "string", "default": "Pending"}}}
    schema = CRDSchema.from_crd(crd(raw), "v1")
    assert schema.apply_defaults({"status": {}})["status"] == {"phase": "Pending"}


# -- structural validation --------------------------------------------------------------

BOUNDS_PROPS: dict[str, Any] = {
    "mode": {"type": "string", "enum": ["Managed", "External"]},
    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
    "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1,
              "exclusiveMaximum": True},
    "step": {"type": "integer", "multipleOf": 5},
    "name": {"type": "string", "minLength": 1, "maxLength": 5, "pattern": "^[a-z]*$"},
    "when": {"type": "string", "format": "date-time"},
    "day": {"type": "string", "format": "date"},
    "flag": {"type": "boolean"},
    "tags": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}},
    "attrs": {"type": "object", "maxProperties": 2, "minProperties": 1,
              "additionalProperties": {"type": "string"}},
    "either": {"x-kubernetes-int-or-string": True},
    "set": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
    "conds": {"type": "array", "x-kubernetes-list-type": "map",
              "x-kubernetes-list-map-keys": ["type"],
              "items": {"type": "object", "required": ["type"],
                        "properties": {"type": {"type": "string"}, "v": {"type": "integer"}}}},
    "req": {"type": "object", "required": ["a", "b"],
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}}},
}
BOUNDS = schema_for(BOUNDS_PROPS)
# kube-apiserver adds the "rules were not checked" cause only for a schema with rules.
BOUNDS_WITH_A_RULE = schema_for(BOUNDS_PROPS, **{"x-kubernetes-validations": [
    {"rule": "true"}]})


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"mode": "Sideways"},
         FieldError("spec.mode", reason="FieldValueNotSupported",
                    message='Unsupported value: "Sideways": supported values: "Managed", '
                            '"External"')),
        ({"port": 0},
         FieldError("spec.port", reason="FieldValueInvalid",
                    message="Invalid value: 0: spec.port in body should be greater than or "
                            "equal to 1")),
        ({"port": 70000},
         FieldError("spec.port", reason="FieldValueInvalid",
                    message="Invalid value: 70000: spec.port in body should be less than or "
                            "equal to 65535")),
        ({"port": "80"},
         FieldError("spec.port", reason="FieldValueTypeInvalid",
                    message='Invalid value: "string": spec.port in body must be of type '
                            'integer: "string"')),
        ({"port": 1.5},
         FieldError("spec.port", reason="FieldValueTypeInvalid",
                    message='Invalid value: "number": spec.port in body must be of type '
                            'integer: "number"')),
        ({"port": True},
         FieldError("spec.port", reason="FieldValueTypeInvalid",
                    message='Invalid value: "boolean": spec.port in body must be of type '
                            'integer: "boolean"')),
        ({"port": None},
         FieldError("spec.port", reason="FieldValueTypeInvalid",
                    message='Invalid value: "null": spec.port in body must be of type '
                            'integer: "null"')),
        ({"ratio": 0},
         FieldError("spec.ratio", reason="FieldValueInvalid",
                    message="Invalid value: 0: spec.ratio in body should be greater than 0")),
        ({"ratio": 1.0},
         FieldError("spec.ratio", reason="FieldValueInvalid",
                    message="Invalid value: 1: spec.ratio in body should be less than 1")),
        ({"step": 7},
         FieldError("spec.step", reason="FieldValueInvalid",
                    message="Invalid value: 7: spec.step in body should be a multiple of 5")),
        ({"name": ""},
         FieldError("spec.name", reason="FieldValueInvalid",
                    message='Invalid value: "": spec.name in body should be at least 1 chars '
                            "long")),
        ({"name": "abcdef"},
         FieldError("spec.name", reason="FieldValueTooLong",
                    message="Too long: may not be more than 5 bytes")),
        ({"name": "AB"},
         FieldError("spec.name", reason="FieldValueInvalid",
                    message="Invalid value: \"AB\": spec.name in body should match "
                            "'^[a-z]*$'")),
        ({"when": "yesterday"},
         FieldError("spec.when", reason="FieldValueTypeInvalid",
                    message='Invalid value: "yesterday": spec.when in body must be of type '
                            'date-time: "yesterday"')),
        ({"day": "2024-02-30"},
         FieldError("spec.day", reason="FieldValueTypeInvalid",
                    message='Invalid value: "2024-02-30": spec.day in body must be of type '
                            'date: "2024-02-30"')),
        ({"flag": "true"},
         FieldError("spec.flag", reason="FieldValueTypeInvalid",
                    message='Invalid value: "string": spec.flag in body must be of type '
                            'boolean: "string"')),
        ({"tags": []},
         FieldError("spec.tags", reason="FieldValueInvalid",
                    message="Invalid value: 0: spec.tags in body should have at least 1 "
                            "items")),
        ({"tags": ["a", "b", "c"]},
         FieldError("spec.tags", reason="FieldValueTooMany",
                    message="Too many: 3: must have at most 2 items")),
        ({"tags": ["a", 1]},
         FieldError("spec.tags[1]", reason="FieldValueTypeInvalid",
                    message='Invalid value: "integer": spec.tags[1] in body must be of type '
                            'string: "integer"')),
        ({"attrs": {"a": "1", "b": "2", "c": "3"}},
         FieldError("spec.attrs", reason="FieldValueTooMany",
                    message="Too many: 3: must have at most 2 items")),
        ({"attrs": {}},
         FieldError("spec.attrs", reason="FieldValueInvalid",
                    message="Invalid value: 0: spec.attrs in body should have at least 1 "
                            "properties")),
        ({"attrs": {"a": 1}},
         FieldError("spec.attrs[a]", reason="FieldValueTypeInvalid",
                    message='Invalid value: "integer": spec.attrs[a] in body must be of type '
                            'string: "integer"')),
        ({"either": [1]},
         FieldError("spec.either", reason="FieldValueTypeInvalid",
                    message='Invalid value: "array": spec.either in body must be of type '
                            'integer,string: "array"')),
        ({"set": ["a", "b", "a"]},
         FieldError("spec.set[2]", reason="FieldValueDuplicate",
                    message='Duplicate value: "a"')),
        # One error per duplicated value, at its first repeat.
        ({"set": ["a", "a", "a"]},
         FieldError("spec.set[1]", reason="FieldValueDuplicate",
                    message='Duplicate value: "a"')),
        ({"conds": [{"type": "A", "v": 1}, {"type": "A", "v": 2}]},
         FieldError("spec.conds[1]", reason="FieldValueDuplicate",
                    message='Duplicate value: map[string]interface {}{"type":"A"}')),
        ({"req": {"b": "x"}},
         FieldError("spec.req.a", reason="FieldValueRequired", message="Required value")),
    ],
    ids=lambda v: v.reason if isinstance(v, FieldError) else None,
)
def test_structural_errors(spec: dict[str, Any], expected: FieldError) -> None:
    assert BOUNDS.validate({"spec": spec}) == [expected]
    found = BOUNDS_WITH_A_RULE.validate({"spec": spec})
    assert found[0] == expected
    blocking = expected.reason in {"FieldValueNotSupported", "FieldValueRequired",
                                   "FieldValueTooLong", "FieldValueTooMany",
                                   "FieldValueTypeInvalid"}
    assert found[1:] == ([RULES_NOT_CHECKED] if blocking else [])


def test_valid_values_pass() -> None:
    assert BOUNDS.validate({"spec": {
        "mode": "External", "port": 3128, "ratio": 0.5, "step": 10, "name": "abc",
        "when": "2024-05-01T10:00:00.5+02:00", "day": "2024-02-29", "flag": False,
        "tags": ["a"], "attrs": {"a": "1"}, "either": "50%", "set": ["a", "b"],
        "conds": [{"type": "A"}, {"type": "B"}], "req": {"a": "", "b": ""},
    }}) == []
    assert BOUNDS.validate({"spec": {"port": 80.0, "either": 3}}) == []


def test_every_error_is_reported_and_metadata_is_left_to_the_server() -> None:
    found = BOUNDS.validate({"metadata": {"name": 5}, "spec": {"port": 0, "name": ""}})
    assert [e.field for e in found] == ["spec.port", "spec.name"]


def test_field_error_wire_forms() -> None:
    err = FieldError("spec.port", reason="FieldValueInvalid", message="Invalid value: 0: x")
    assert err.to_cause() == {"reason": "FieldValueInvalid", "message": "Invalid value: 0: x",
                              "field": "spec.port"}
    assert str(err) == "spec.port: Invalid value: 0: x"
    assert invalid_message("Proxy.crawl.example.com", "a", [err]) == (
        'Proxy.crawl.example.com "a" is invalid: spec.port: Invalid value: 0: x')
    assert invalid_message("Proxy.crawl.example.com", "a", [err, err]) == (
        'Proxy.crawl.example.com "a" is invalid: [spec.port: Invalid value: 0: x, '
        "spec.port: Invalid value: 0: x]")


# -- CEL rules ---------------------------------------------------------------------------

RULES = schema_for(
    {
        "mode": {"type": "string", "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "mode is immutable"}]},
        "low": {"type": "integer"},
        "high": {"type": "integer"},
        "since": {"type": "string", "format": "date-time", "x-kubernetes-validations": [
            {"rule": "self > timestamp('2020-01-01T00:00:00Z')", "message": "too old"}]},
        "items": {"type": "array", "x-kubernetes-list-type": "map",
                  "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "required": ["name"], "properties": {
                      "name": {"type": "string"},
                      "size": {"type": "integer", "x-kubernetes-validations": [
                          {"rule": "self >= oldSelf", "message": "size may only grow"}]}}}},
        "named": {"type": "object", "additionalProperties": {
            "type": "string", "x-kubernetes-validations": [
                {"rule": "self.size() <= 3", "messageExpression": "'too long: ' + self"}]}},
        "bare": {"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0"}]},
        "forbid": {"type": "string", "x-kubernetes-validations": [
            {"rule": "self != 'x'", "message": "no x", "reason": "FieldValueForbidden"}]},
    },
    **{"x-kubernetes-validations": [
        {"rule": "!has(self.low) || !has(self.high) || self.low < self.high",
         "message": "low must be below high", "fieldPath": ".low"},
        {"rule": "self.low >= 0 || !has(self.high)", "message": "low must not be negative"},
    ]},
)


@pytest.mark.parametrize(
    ("spec", "old", "expected"),
    [
        ({"low": 1, "high": 2}, None, []),
        ({"low": 3, "high": 2}, None,
         ['spec.low: Invalid value: "object": low must be below high']),
        # Reading a missing field without has() is an evaluation error: a rejection.
        ({"high": 2}, None,
         ['spec: Invalid value: "object": no such key: low evaluating rule: '
          "self.low >= 0 || !has(self.high)"]),
        ({"mode": "A", "low": 0}, None, []),
        ({"mode": "B", "low": 0}, {"mode": "A", "low": 0},
         ['spec.mode: Invalid value: "string": mode is immutable']),
        ({"mode": "A", "low": 0}, {"mode": "A", "low": 0}, []),
        # A transition rule runs only where the old object has the field.
        ({"mode": "B", "low": 0}, {"low": 0}, []),
        ({"since": "2019-06-01T00:00:00Z", "low": 0}, None,
         ['spec.since: Invalid value: "string": too old']),
        ({"low": 0, "items": [{"name": "a", "size": 1}, {"name": "b", "size": 5}]},
         {"items": [{"name": "b", "size": 9}, {"name": "a", "size": 1}]},
         ['spec.items[1].size: Invalid value: "integer": size may only grow']),
        ({"low": 0, "named": {"k": "abcd"}}, None,
         ['spec.named[k]: Invalid value: "string": too long: abcd']),
        ({"low": 0, "bare": 0}, None,
         ['spec.bare: Invalid value: "integer": failed rule: self > 0']),
        ({"low": 0, "forbid": "x"}, None, ["spec.forbid: Forbidden: no x"]),
    ],
    ids=["valid", "field-path", "missing-field", "create-skips-transition", "immutable",
         "unchanged", "old-lacks-field", "timestamp", "list-map-correlates-by-key",
         "message-expression", "default-message", "reason-forbidden"],
)
def test_cel_rules(spec: dict[str, Any], old: dict[str, Any] | None,
                   expected: list[str]) -> None:
    assert errors(RULES, spec, old) == expected


def test_rule_errors_carry_the_cause_type() -> None:
    (found,) = RULES.validate({"spec": {"low": 0, "forbid": "x"}})
    assert found.reason == "FieldValueForbidden"
    (found,) = RULES.validate({"spec": {"low": 5, "high": 1}})
    assert found.reason == "FieldValueInvalid"


def test_root_rules_see_only_name_of_metadata() -> None:
    raw = obj_schema({})
    raw["x-kubernetes-validations"] = [
        {"rule": "self.metadata.name.startsWith('w-')", "message": "name must start w-"},
        {"rule": "!has(self.metadata.labels)", "message": "labels are hidden from rules"},
    ]
    schema = CRDSchema.from_crd(crd(raw), "v1")
    assert schema.validate({"metadata": {"name": "w-1", "labels": {"a": "b"}}, "spec": {}}) == []
    assert [str(e) for e in schema.validate({"metadata": {"name": "x"}, "spec": {}})] == [
        '<nil>: Invalid value: "object": name must start w-']
