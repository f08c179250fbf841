"""The converter factory: frozen attrs values to and from their JSON (or YAML) wire form.

`Codec(...)` builds one cattrs converter with the house's wire rules, so the
model, the providers config and the HTTP wire types read and write alike:

* wire names are the camelCase of the Python names (`machine_type` →
  `machineType`), with per-codec exceptions (`probe_url` → `probeURL`);
* scalars are strict: a string where an int belongs, `true` as a number, a
  string as a list (cattrs would iterate it), NaN, or `null` where a value is
  required are all problems, never coerced;
* extra keys are problems when the codec forbids them (config files and API
  bodies, where a typo must not pass silently), ignored otherwise (objects
  read from an API server that may be newer);
* `Annotated[T, Check(...)]` adds a rule checked after the type (checks.py);
* every problem is collected, each with its wire path
  (`providers[1].gcp.zone: expected a string, got integer`), and raised as one
  `WireError`, so one fix-and-retry cycle fixes them all.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import typing
from collections.abc import Callable, Mapping
from types import NoneType, UnionType
from typing import Annotated, Any, TypeVar

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

from egressd.codec.checks import Check
from egressd.errors import EgressdError
from egressd.timestamps import format_time, parse_time

T = TypeVar("T")


@attrs.frozen
class Problem:
    """One thing wrong with the input: where (a wire path) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '<root>'}: {self.message}"


class WireError(EgressdError):
    """Raw input does not fit the wire type; `problems` lists every mistake with its path."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


class _Wrong(ValueError):
    """A value of the wrong shape; its message is shown as-is after the field path."""


class _Unknown(ValueError):
    """A key the type does not have (only where the codec forbids extra keys)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _value_words(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _type_words(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "list", dict: "mapping"}.get(type(value), type(value).__name__)


@attrs.frozen
class Words:
    """How problems are worded: the name of each expected kind, and of what came instead."""

    expected: Mapping[str, str]
    got: Callable[[object], str]
    missing: str
    unknown: str = "unknown field"

    def wrong(self, kind: str, value: object) -> _Wrong:
        return _Wrong(f"expected {self.expected.get(kind, kind)}, got {self.got(value)}")


VALUE_WORDS = Words(
    {"int": "int", "number": "number", "string": "string", "boolean": "boolean",
     "list": "a list", "object": "an object", "time": "an RFC 3339 timestamp"},
    _value_words, "required field missing")
"""`spec.port: expected int, got '3128'` (names the value: API objects and bodies)."""

TYPE_WORDS = Words(
    {"int": "an integer", "number": "a number", "string": "a string", "boolean": "a boolean",
     "list": "a list", "list[string]": "a list of strings", "object": "a mapping",
     "time": "an RFC 3339 timestamp"},
    _type_words, "required field is missing")
"""`gcp.zone: expected a string, got integer` (names the YAML type: config files)."""


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) in (typing.Union, UnionType):
        return typing.get_args(tp)
    return None


def _is_optional(tp: Any) -> bool:
    args = _union_args(tp)
    return args is not None and NoneType in args


def _is_tuple(tp: Any) -> bool:
    return typing.get_origin(tp) is tuple


def _is_annotated(tp: Any) -> bool:
    return typing.get_origin(tp) is Annotated


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def kind_of(tp: Any) -> str:
    """The word for a type in problems and schemas: int, number, string, list[string]..."""
    if _is_annotated(tp):
        return kind_of(typing.get_args(tp)[0])
    simple = {int: "int", float: "number", str: "string", bool: "boolean", dt.datetime: "time"}
    if tp in simple:
        return simple[tp]
    if _is_tuple(tp):
        return f"list[{kind_of(typing.get_args(tp)[0])}]"
    return "object"


class Codec:
    """One converter with the wire rules above; see the module docstring."""

    def __init__(
        self,
        *,
        words: Words = VALUE_WORDS,
        forbid_extra_keys: bool = False,
        null_is_absent: bool = True,
        omit_none: bool = True,
        renames: Mapping[str, str] | None = None,
    ) -> None:
        """`null_is_absent`: an optional field may be `null` (else only left out);
        `omit_none`: writing leaves out fields that are None (else writes null)."""
        self.words = words
        self.forbid_extra_keys = forbid_extra_keys
        self.null_is_absent = null_is_absent
        self.omit_none = omit_none
        self._renames = dict(renames or {})
        self.converter = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
        self._register()

    # -- names -------------------------------------------------------------

    def wire_name(self, python_name: str) -> str:
        """The wire (camelCase) name of a field."""
        if python_name in self._renames:
            return self._renames[python_name]
        head, *rest = python_name.split("_")
        return head + "".join(part.capitalize() for part in rest)

    def wire_names(self, cls: type) -> dict[str, str]:
        """Python name → wire name for every field of an attrs class."""
        return {a.name: self.wire_name(a.name) for a in attrs.fields(cls)}

    # -- the public conversions ----------------------------------------------

    def structure(self, raw: object, cls: type[T] | Any, *, path: str = "") -> T:
        """`raw` as a `cls`; raises `WireError` listing every problem under `path`."""
        try:
            value: T = self.converter.structure(raw, cls)
        except (BaseValidationError, ValueError, KeyError) as exc:
            raise WireError(self._problems(exc, path)) from exc
        return value

    def unstructure(self, value: object) -> Any:
        """The wire form of `value`."""
        return self.converter.unstructure(value)

    # -- hooks ---------------------------------------------------------------

    def _scalar(self, kind: str, ok: Callable[[Any], bool]) -> Callable[[Any, type], Any]:
        def structure(value: Any, _: type) -> Any:
            if ok(value):
                return value
            raise self.words.wrong(kind, value)

        return structure

    def _number(self, value: Any, _: type) -> float:
        # bool is an int in Python, but `true` is not a number in JSON.
        if isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
            raise _Wrong("must be finite")
        raise self.words.wrong("number", value)

    def _time(self, value: Any, _: type) -> dt.datetime:
        if isinstance(value, str):
            try:
                return parse_time(value)
            except ValueError:
                pass
        raise self.words.wrong("time", value)

    def _enum(self, value: Any, cls: type[enum.Enum]) -> enum.Enum:
        for member in cls:
            if member.value == value:
                return member
        allowed = ", ".join(repr(m.value) for m in cls)
        raise _Wrong(f"expected one of {allowed}, got {self.words.got(value)}")

    def _register(self) -> None:
        conv = self.converter
        conv.register_structure_hook(int, self._scalar(
            "int", lambda v: isinstance(v, int) and not isinstance(v, bool)))
        conv.register_structure_hook(str, self._scalar("string", lambda v: isinstance(v, str)))
        conv.register_structure_hook(bool, self._scalar("boolean", lambda v: isinstance(v, bool)))
        conv.register_structure_hook(float, self._number)
        conv.register_structure_hook(dt.datetime, self._time)
        conv.register_unstructure_hook(dt.datetime, format_time)
        conv.register_structure_hook_factory(attrs.has, self._class_factory)
        conv.register_structure_hook_factory(_is_optional, self._optional_factory)
        conv.register_structure_hook_factory(_is_annotated, self._annotated_factory)
        conv.register_structure_hook_factory(_is_tuple, self._list_factory)
        conv.register_structure_hook_factory(is_mapping, self._mapping_factory)
        conv.register_unstructure_hook_factory(attrs.has, self._class_unstructure_factory)

    def _register_enums(self, tp: Any) -> None:
        # Each enum class gets its own hook, found in the field types: a StrEnum is a
        # str, and a hook for a predicate would lose to the one registered for str.
        if _is_enum(tp):
            self.converter.register_structure_hook(tp, self._enum)
            self.converter.register_unstructure_hook(tp, lambda m: m.value)
        for arg in typing.get_args(tp):
            self._register_enums(arg)

    def _class_factory(self, cls: type[T]) -> Callable[[Any, type], T]:
        for hint in typing.get_type_hints(cls, include_extras=True).values():
            self._register_enums(hint)
        names = self.wire_names(cls)
        renamed: dict[str, Any] = {n: override(rename=w) for n, w in names.items()}
        fn = make_dict_structure_fn(cls, self.converter, **renamed)
        known = set(names.values())

        def structure(value: Any, cl: type) -> T:
            if not isinstance(value, Mapping):
                raise self.words.wrong("object", value)
            unknown = [k for k in value if k not in known] if self.forbid_extra_keys else []
            if not unknown:
                return fn(value, cl)
            errors: list[Exception] = [_Unknown(str(k)) for k in unknown]
            try:
                fn(value, cl)
            except ClassValidationError as exc:
                errors.extend(exc.exceptions)
            raise ClassValidationError(f"While structuring {cls.__name__}", errors, cls)

        return structure

    def _class_unstructure_factory(self, cls: type[T]) -> Callable[[T], dict[str, Any]]:
        renamed: dict[str, Any] = {
            n: override(rename=w) for n, w in self.wire_names(cls).items()}
        fn = make_dict_unstructure_fn(cls, self.converter, **renamed)
        if not self.omit_none:
            return fn

        def unstructure(value: T) -> dict[str, Any]:
            return {k: v for k, v in fn(value).items() if v is not None}

        return unstructure

    def _optional_factory(self, tp: Any) -> Callable[[Any, type], Any]:
        args = [a for a in typing.get_args(tp) if a is not NoneType]
        inner: Any = args[0] if len(args) == 1 else typing.Union[tuple(args)]  # noqa: UP007
        hook = self.converter.get_structure_hook(inner)

        def structure(value: Any, _: type) -> Any:
            if value is None:
                if self.null_is_absent:
                    return None
                raise self.words.wrong(kind_of(inner), value)
            return hook(value, inner)

        return structure

    def _annotated_factory(self, tp: Any) -> Callable[[Any, type], Any]:
        base, *extras = typing.get_args(tp)
        checks = [m for m in extras if isinstance(m, Check)]
        hook = self.converter.get_structure_hook(base)

        def structure(value: Any, _: type) -> Any:
            result = hook(value, base)
            for check in checks:
                problem = check.test(result)
                if problem:
                    raise _Wrong(problem)
            return result

        return structure

    # cattrs would iterate any iterable: a string as a list of characters, an
    # object as a list of its keys. The wire types are JSON's, so check them first.
    def _list_factory(self, tp: Any) -> Callable[[Any, type], Any]:
        fn = homogenous_tuple_structure_factory(tp, self.converter)
        kind = kind_of(tp)

        def structure(value: Any, cl: type) -> Any:
            if not isinstance(value, list | tuple):
                raise self.words.wrong(kind if kind in self.words.expected else "list", value)
            return fn(value, cl)

        return structure

    def _mapping_factory(self, tp: Any) -> Callable[[Any, type], Any]:
        fn = mapping_structure_factory(tp, self.converter)

        def structure(value: Any, cl: type) -> Any:
            if not isinstance(value, Mapping):
                raise self.words.wrong("object", value)
            return fn(value, cl)

        return structure

    # -- problems ------------------------------------------------------------

    def _message(self, exc: BaseException) -> str:
        if isinstance(exc, KeyError):
            return self.words.missing
        if isinstance(exc, _Unknown):
            return self.words.unknown
        if isinstance(exc, _Wrong):
            return str(exc)
        return f"invalid value ({exc})"

    def _problems(self, exc: BaseException, path: str) -> list[Problem]:
        """Flatten a cattrs error tree into problems with wire paths."""
        if not isinstance(exc, ClassValidationError | IterableValidationError):
            return [Problem(path, self._message(exc))]
        names = self.wire_names(exc.cl) if isinstance(exc, ClassValidationError) else {}
        out: list[Problem] = []
        for sub in exc.exceptions:
            out.extend(self._problems(sub, _sub_path(sub, path, names)))
        return out


def _sub_path(sub: BaseException, path: str, names: Mapping[str, str]) -> str:
    if isinstance(sub, _Unknown):
        return f"{path}.{sub.key}" if path else sub.key
    for note in getattr(sub, "__notes__", ()):
        if isinstance(note, AttributeValidationNote):
            name = names.get(note.name, note.name)
            return f"{path}.{name}" if path else name
        if isinstance(note, IterableValidationNote):
            return f"{path}[{note.index}]"
    return path
