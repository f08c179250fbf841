"""JSON Schema (the OpenAPI 3.1 dialect) generated from the classes a `Codec` converts.

The schema says what the codec does, from the same facts: wire names, which
fields may be left out (a default) or be `null` (`T | None`), the strict
scalar types, `Annotated` checks and docs, and `additionalProperties: false`
where the codec forbids extra keys. Classes become `#/components/schemas/<Name>`
references, so one class is described once however often it is used.
"""

from __future__ import annotations

import datetime as dt
import typing
from collections.abc import Mapping
from types import NoneType
from typing import Annotated, Any

import attrs

from egressd.codec.checks import Check, Doc, SchemaOnly
from egressd.codec.converter import Codec, _is_enum, _union_args

Schema = dict[str, Any]

_SCALARS: dict[Any, Schema] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    dt.datetime: {"type": "string", "format": "date-time"},
}


def schema_of(codec: Codec, tp: Any, components: dict[str, Schema], *, writing: bool) -> Schema:
    """The schema of `tp` as `codec` reads it (`writing=False`) or writes it.

    Classes met on the way are added to `components` (by class name).
    """
    if typing.get_origin(tp) is Annotated:
        base, *extras = typing.get_args(tp)
        schema = dict(schema_of(codec, base, components, writing=writing))
        for extra in extras:
            if isinstance(extra, Check | SchemaOnly):
                schema.update(extra.schema)
            elif isinstance(extra, Doc):
                schema["description"] = extra.text
        return schema
    args = _union_args(tp)
    if args is not None:
        return _union(codec, args, components, writing=writing)
    if tp in _SCALARS:
        return dict(_SCALARS[tp])
    if _is_enum(tp):
        return {"type": "string", "enum": [m.value for m in tp]}
    origin = typing.get_origin(tp)
    if origin is tuple:
        return {"type": "array",
                "items": schema_of(codec, typing.get_args(tp)[0], components, writing=writing)}
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        value = typing.get_args(tp)[1]
        return {"type": "object",
                "additionalProperties": schema_of(codec, value, components, writing=writing)}
    if attrs.has(tp):
        if tp.__name__ not in components:
            components[tp.__name__] = {}  # a placeholder, for a class that contains itself
            components[tp.__name__] = object_schema(codec, tp, components, writing=writing)
        return {"$ref": f"#/components/schemas/{tp.__name__}"}
    raise TypeError(f"no JSON Schema for {tp!r}")


def _union(codec: Codec, args: tuple[Any, ...], components: dict[str, Schema], *,
           writing: bool) -> Schema:
    others = [a for a in args if a is not NoneType]
    nullable = len(others) < len(args) and (writing or codec.null_is_absent)
    if len(others) == 1:
        schema = schema_of(codec, others[0], components, writing=writing)
        if nullable and isinstance(schema.get("type"), str):
            schema = {**schema, "type": [schema["type"], "null"]}
            if "enum" in schema:
                schema["enum"] = [*schema["enum"], None]
            return schema
        if nullable:
            return {"anyOf": [schema, {"type": "null"}]}
        return schema
    choices = [schema_of(codec, a, components, writing=writing) for a in others]
    return {"anyOf": [*choices, {"type": "null"}] if nullable else choices}


def object_schema(codec: Codec, cls: type, components: dict[str, Schema], *,
                  writing: bool) -> Schema:
    """The schema of an attrs class: its wire-named properties, which are required, extras."""
    hints = typing.get_type_hints(cls, include_extras=True)
    properties: Schema = {}
    required: list[str] = []
    for field in attrs.fields(cls):
        wire = codec.wire_name(field.name)
        properties[wire] = schema_of(codec, hints[field.name], components, writing=writing)
        if field.default is not attrs.NOTHING and not writing:
            default = field.default
            if isinstance(default, str | int | float):  # not a Factory
                properties[wire].setdefault("default", default)
        # What is written is always there (None as null) unless the codec omits None;
        # what is read may be left out when the field has a default.
        always = writing and not (codec.omit_none and _union_args(field.type) is not None)
        if field.default is attrs.NOTHING or always:
            required.append(wire)
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if writing or codec.forbid_extra_keys:
        schema["additionalProperties"] = False
    if cls.__doc__:
        schema["description"] = cls.__doc__.strip().splitlines()[0]
    return schema
