"""Label and field selectors, parsed from query strings and matched against objects.

Labels: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`,
`k>n`, `k<n` (apimachinery's labels.Parse). Fields: `path=v`, `path==v`,
`path!=v` over the field labels each kind supports; any other field is a
400 like kube-apiserver's "field label not supported".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from egressd.sandbox.apiserver.errors import ApiError, bad_request

_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@attrs.frozen
class Requirement:
    """One term of a label selector."""

    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present:
            return False
        try:
            number = int(str(value))
        except ValueError:
            return False
        limit = int(self.values[0])
        return number > limit if self.op == "gt" else number < limit


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [t.strip() for t in terms]


def _check_key(key: str, term: str) -> str:
    if not _KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise bad_request(f"unable to parse requirement: invalid label key {key!r} in {term!r}")
    return key


def _check_value(value: str, term: str) -> str:
    if not _VALUE.match(value) or len(value) > 63:
        raise bad_request(f"unable to parse requirement: invalid label value {value!r} in {term!r}")
    return value


_SET = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)$")


def _parse_label_term(term: str) -> Requirement:
    if not term:
        raise bad_request("unable to parse requirement: found '', expected: identifier")
    found = _SET.match(term)
    if found:
        key, op, inner = found.groups()
        values = tuple(_check_value(v.strip(), term) for v in inner.split(","))
        return Requirement(_check_key(key, term), op, values)
    if term.startswith("!"):
        return Requirement(_check_key(term[1:].strip(), term), "!")
    for token, op in (("==", "="), ("!=", "!="), ("=", "="), (">", "gt"), ("<", "lt")):
        if token in term:
            key, _, value = term.partition(token)
            key, value = key.strip(), value.strip()
            if op in ("gt", "lt") and not re.fullmatch(r"-?\d+", value):
                raise bad_request(f"unable to parse requirement: {value!r} is not an integer")
            if op not in ("gt", "lt"):
                _check_value(value, term)
            return Requirement(_check_key(key, term), op, (value,))
    return Requirement(_check_key(term, term), "exists")


@attrs.frozen
class LabelSelector:
    """A parsed `labelSelector` (empty matches everything)."""

    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text or not text.strip():
            return cls()
        return cls(tuple(_parse_label_term(t) for t in _split_terms(text)))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in self.requirements)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string a field selector compares (`""` when absent, like the API server)."""
    if path == "source":  # Events: source.component
        path = "source.component"
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


@attrs.frozen
class FieldSelector:
    """A parsed `fieldSelector` over the fields a kind supports."""

    terms: tuple[tuple[str, bool, str], ...] = ()  # (path, equal, value)

    @classmethod
    def parse(cls, text: str | None, *, supported: frozenset[str]) -> FieldSelector:
        if not text or not text.strip():
            return cls()
        terms = []
        for term in _split_terms(text):
            for token, equal in (("!=", False), ("==", True), ("=", True)):
                if token in term:
                    path, _, value = term.partition(token)
                    path = path.strip()
                    equal_op = equal
                    break
            else:
                raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
            if path not in supported:
                raise ApiError(400, "BadRequest", f'field label not supported: {path}')
            terms.append((path, equal_op, value.strip()))
        return cls(tuple(terms))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, path) == value) == equal for path, equal, value in self.terms)

    def name(self) -> str | None:
        """The name an equality on metadata.name pins (lets a lookup skip a scan)."""
        for path, equal, value in self.terms:
            if path == "metadata.name" and equal:
                return value
        return None

