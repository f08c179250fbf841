"""The one cattrs converter between Proxy values and their JSON wire form.

It owns the camelCase wire names (`machineType`, `probeURL`, `providerID`...),
RFC 3339 timestamps (always UTC, written with "Z"), and strict scalar types:
a string where an int belongs is an error, never silently coerced.

Reading is forward compatible: wire fields the model does not know are
ignored, so an older egressd reads objects written by a newer CRD. Writing
omits `None` (absent) fields; `unstructure_status` is the exception, see there.

`parse_proxy` reports every bad field at once, each with its wire path
(`spec.endpoint.port: expected int, got 'x'`), so one fix-and-retry cycle
fixes them all.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.cols import homogenous_tuple_structure_factory, is_mapping, mapping_structure_factory
from cattrs.errors import (
    AttributeValidationNote,
    BaseValidationError,
    ClassValidationError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from egressd.errors import EgressdError
from egressd.model.constants import CONDITION_STATUSES, Mode, Phase
from egressd.model.proxy import Condition, Proxy, ProxyStatus

T = TypeVar("T")

# Wire names that are not the plain camelCase of the Python name (Kubernetes
# spells initialisms in capitals).
_WIRE_NAME_EXCEPTIONS = {"probe_url": "probeURL", "provider_id": "providerID"}


class ModelError(EgressdError):
    """A raw object does not fit the model; `problems` lists every bad field with its path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class _WireError(ValueError):
    """A value of the wrong shape; its message is shown as-is after the field path."""


def wire_name(python_name: str) -> str:
    """The wire (camelCase) name of a model field."""
    if python_name in _WIRE_NAME_EXCEPTIONS:
        return _WIRE_NAME_EXCEPTIONS[python_name]
    head, *rest = python_name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def wire_names(cls: type) -> dict[str, str]:
    """Python name → wire name for every field of an attrs class."""
    return {a.name: wire_name(a.name) for a in attrs.fields(cls)}


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _structure_int(value: object, _: type) -> int:
    # bool is an int in Python but not in JSON.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _WireError(f"expected int, got {_describe(value)}")


def _structure_str(value: object, _: type) -> str:
    if isinstance(value, str):
        return value
    raise _WireError(f"expected string, got {_describe(value)}")


def _structure_bool(value: object, _: type) -> bool:
    if isinstance(value, bool):
        return value
    raise _WireError(f"expected boolean, got {_describe(value)}")


def _structure_enum(value: object, cls: type[enum.Enum]) -> enum.Enum:
    for member in cls:
        if member.value == value:
            return member
    allowed = ", ".join(repr(m.value) for m in cls)
    raise _WireError(f"expected one of {allowed}, got {_describe(value)}")


_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


def parse_time(value: object) -> dt.datetime:
    """An RFC 3339 timestamp as an aware UTC datetime (raises ValueError if malformed)."""
    if isinstance(value, str) and _RFC3339.match(value):
        text = value.replace("z", "Z").replace("t", "T")
        # fromisoformat accepts at most 6 fraction digits; Go may write 9.
        text = re.sub(r"(\.\d{6})\d+", r"\1", text)
        try:
            return dt.datetime.fromisoformat(text).astimezone(dt.UTC)
        except ValueError:
            pass
    raise _WireError(f"expected an RFC 3339 timestamp, got {_describe(value)}")


def format_time(value: dt.datetime) -> str:
    """RFC 3339 in UTC with "Z"; fractional seconds only when there are any."""
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: model timestamps must be timezone-aware")
    utc = value.astimezone(dt.UTC)
    if utc.microsecond:
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def _structure_condition_status(value: object, _: type) -> str:
    if value in CONDITION_STATUSES:
        return str(value)
    allowed = ", ".join(repr(s) for s in CONDITION_STATUSES)
    raise _WireError(f"expected one of {allowed}, got {_describe(value)}")


def _is_tuple(tp: Any) -> bool:
    origin: object = typing.get_origin(tp)
    return origin is tuple


def _make_converter() -> cattrs.Converter:  # noqa: C901 -- its owner splits it (issue 10)
    conv = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    conv.register_structure_hook(int, _structure_int)
    conv.register_structure_hook(str, _structure_str)
    conv.register_structure_hook(bool, _structure_bool)
    conv.register_structure_hook(dt.datetime, lambda v, _: parse_time(v))
    conv.register_unstructure_hook(dt.datetime, format_time)
    for enum_cls in (Mode, Phase):
        conv.register_structure_hook(enum_cls, _structure_enum)
        conv.register_unstructure_hook(enum_cls, lambda m: m.value)

    def structure_factory(cls: type[T]) -> Callable[[Any, type], T]:
        overrides: dict[str, Any] = {
            name: override(rename=wire) for name, wire in wire_names(cls).items()
        }
        if cls is Condition:
            overrides["status"] = override(
                rename="status", struct_hook=_structure_condition_status
            )
        fn = make_dict_structure_fn(cls, conv, **overrides)

        def structure(value: Any, cl: type) -> T:
            if not isinstance(value, Mapping):
                raise _WireError(f"expected an object, got {_describe(value)}")
            return fn(value, cl)

        return structure

    def unstructure_factory(cls: type[T]) -> Callable[[T], dict[str, Any]]:
        overrides: dict[str, Any] = {
            name: override(rename=wire) for name, wire in wire_names(cls).items()
        }
        fn = make_dict_unstructure_fn(cls, conv, **overrides)

        def unstructure(value: T) -> dict[str, Any]:
            return {k: v for k, v in fn(value).items() if v is not None}

        return unstructure

    # cattrs would iterate any iterable: a string as a list of characters, an
    # object as a list of its keys. The wire types are JSON's, so check them first.
    def list_factory(cls: Any) -> Callable[[Any, type], Any]:
        fn = homogenous_tuple_structure_factory(cls, conv)

        def structure(value: Any, cl: type) -> Any:
            if not isinstance(value, list | tuple):
                raise _WireError(f"expected a list, got {_describe(value)}")
            return fn(value, cl)

        return structure

    def mapping_factory(cls: Any) -> Callable[[Any, type], Any]:
        fn = mapping_structure_factory(cls, conv)

        def structure(value: Any, cl: type) -> Any:
            if not isinstance(value, Mapping):
                raise _WireError(f"expected an object, got {_describe(value)}")
            return fn(value, cl)

        return structure

    conv.register_structure_hook_factory(attrs.has, structure_factory)
    conv.register_structure_hook_factory(_is_tuple, list_factory)
    conv.register_structure_hook_factory(is_mapping, mapping_factory)
    conv.register_unstructure_hook_factory(attrs.has, unstructure_factory)
    return conv


converter = _make_converter()


def _format(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, _WireError):
        return str(exc)
    return f"invalid value ({exc})"


def _problems(exc: BaseException, path: str) -> list[str]:
    """Flatten a cattrs error tree into "wire.path: what is wrong" lines."""
    out: list[str] = []
    if isinstance(exc, ClassValidationError | IterableValidationError):
        names = wire_names(exc.cl) if isinstance(exc, ClassValidationError) else {}
        for sub in exc.exceptions:
            note = next(
                (
                    n
                    for n in getattr(sub, "__notes__", ())
                    if isinstance(n, AttributeValidationNote | IterableValidationNote)
                ),
                None,
            )
            if isinstance(note, AttributeValidationNote):
                name = names.get(note.name, note.name)
                sub_path = f"{path}.{name}" if path else name
            elif isinstance(note, IterableValidationNote):
                sub_path = f"{path}[{note.index}]"
            else:
                sub_path = path
            out.extend(_problems(sub, sub_path))
    else:
        out.append(f"{path or '<root>'}: {_format(exc)}")
    return out


def structure(raw: object, cls: type[T], *, path: str = "") -> T:
    """Structure any model value from its wire form, raising `ModelError` with every problem."""
    try:
        return converter.structure(raw, cls)
    except (BaseValidationError, _WireError, KeyError) as exc:
        raise ModelError(_problems(exc, path)) from exc


def parse_proxy(raw: Mapping[str, Any]) -> Proxy:
    """A whole Proxy object (as the API server returns it) as a `Proxy` value.

    Raises `ModelError` listing every bad field. `apiVersion` and `kind` are
    not checked: the caller asked for Proxies. A missing `status` is the empty
    status, as on a freshly created object.
    """
    return structure(raw, Proxy)


def unstructure(value: object) -> Any:
    """The wire form of any model value (absent fields omitted)."""
    return converter.unstructure(value)


def unstructure_status(status: ProxyStatus) -> dict[str, Any]:
    """The wire form of a status for a merge patch of the status subresource.

    Unlike `unstructure`, unset top-level fields are written as null, so a
    merge patch of a freshly computed status clears what became unset (the
    latency of a replaced instance, say). Kubernetes drops nulls on
    non-nullable fields, so the same dict is also fine for a full update.
    `cooldowns` is always written in full: a merge patch merges maps key by
    key, so callers that remove a cooldown set its key to null themselves.
    """
    wire: dict[str, Any] = converter.unstructure(status)
    for name in wire_names(ProxyStatus).values():
        wire.setdefault(name, None)
    return wire
