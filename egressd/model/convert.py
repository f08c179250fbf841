"""The model's codec: Proxy values to and from their JSON wire form.

Built by the one converter factory (`egressd.codec`), so the rules are the
house's: camelCase wire names (Kubernetes spells initialisms in capitals:
`probeURL`, `providerID`), RFC 3339 timestamps (always UTC, written with "Z"),
strict scalar types (a string where an int belongs is an error, never coerced).

Reading is forward compatible: wire fields the model does not know are
ignored, so an older egressd reads objects written by a newer CRD. Writing
omits `None` (absent) fields; `unstructure_status` is the exception, see there.

`parse_proxy` reports every bad field at once, each with its wire path
(`spec.endpoint.port: expected int, got 'x'`), so one fix-and-retry cycle
fixes them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import cattrs

from egressd.codec import VALUE_WORDS, Codec, WireError
from egressd.errors import EgressdError
from egressd.model.pool import ProxyPool, ProxyPoolStatus
from egressd.model.proxy import Proxy, ProxyStatus
from egressd.timestamps import format_time, parse_time

__all__ = [
    "ModelError", "codec", "converter", "format_time", "parse_pool", "parse_proxy",
    "parse_time", "structure", "unstructure", "unstructure_pool_status", "unstructure_status",
    "wire_name", "wire_names",
]

T = TypeVar("T")


class ModelError(EgressdError):
    """A raw object does not fit the model; `problems` lists every bad field with its path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


codec = Codec(words=VALUE_WORDS, renames={"probe_url": "probeURL", "provider_id": "providerID"})
converter: cattrs.Converter = codec.converter


def wire_name(python_name: str) -> str:
    """The wire (camelCase) name of a model field."""
    return codec.wire_name(python_name)


def wire_names(cls: type) -> dict[str, str]:
    """Python name → wire name for every field of an attrs class."""
    return codec.wire_names(cls)


def structure(raw: object, cls: type[T], *, path: str = "") -> T:
    """Structure any model value from its wire form, raising `ModelError` with every problem."""
    try:
        return codec.structure(raw, cls, path=path)
    except WireError as exc:
        raise ModelError([str(p) for p in exc.problems]) from exc


def parse_proxy(raw: Mapping[str, Any]) -> Proxy:
    """A whole Proxy object (as the API server returns it) as a `Proxy` value.

    Raises `ModelError` listing every bad field. `apiVersion` and `kind` are
    not checked: the caller asked for Proxies. A missing `status` is the empty
    status, as on a freshly created object.
    """
    return structure(raw, Proxy)


def unstructure(value: object) -> Any:
    """The wire form of any model value (absent fields omitted)."""
    return codec.unstructure(value)


def unstructure_status(status: ProxyStatus) -> dict[str, Any]:
    """The wire form of a status for a merge patch of the status subresource.

    Unlike `unstructure`, unset top-level fields are written as null, so a
    merge patch of a freshly computed status clears what became unset (the
    latency of a replaced instance, say). Kubernetes drops nulls on
    non-nullable fields, so the same dict is also fine for a full update.
    `cooldowns` is always written in full: a merge patch merges maps key by
    key, so callers that remove a cooldown set its key to null themselves.
    """
    wire: dict[str, Any] = codec.unstructure(status)
    for name in wire_names(ProxyStatus).values():
        wire.setdefault(name, None)
    return wire


def parse_pool(raw: Mapping[str, Any]) -> ProxyPool:
    """A whole ProxyPool object as a `ProxyPool` value; `ModelError` lists every bad field."""
    return structure(raw, ProxyPool)


def unstructure_pool_status(status: ProxyPoolStatus) -> dict[str, Any]:
    """A pool status for a merge patch: unset top-level fields written as null (see
    `unstructure_status`)."""
    wire: dict[str, Any] = codec.unstructure(status)
    for name in wire_names(ProxyPoolStatus).values():
        wire.setdefault(name, None)
    return wire
