"""`FrozenDict`: the immutable, hashable mapping that model values hold.

Frozen attrs classes are hashable, so every field must be too: a plain dict
(or a `MappingProxyType`) in `ProxySpec.attributes` would make the whole spec
unhashable and would let a caller mutate a value another task is reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FrozenDict(Mapping[K, V]):
    """A read-only copy of a mapping; equal to any mapping with the same items."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[K, V] | Iterable[tuple[K, V]] = (), /) -> None:
        self._data: dict[K, V] = dict(data)
        self._hash: int | None = None

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._data.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def __or__(self, other: Mapping[K, V]) -> FrozenDict[K, V]:
        return FrozenDict({**self._data, **other})


def freeze_str_map(
    data: Mapping[str, str] | Iterable[tuple[str, str]] = (),
) -> FrozenDict[str, str]:
    """attrs converter: an immutable copy of a string map (labels, attributes...)."""
    return data if isinstance(data, FrozenDict) else FrozenDict(data)


def freeze_map(data: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> FrozenDict[str, Any]:
    """attrs converter: an immutable copy of a map whose values are frozen already."""
    return data if isinstance(data, FrozenDict) else FrozenDict(data)
