"""Counts and times every provider call by provider, operation and result (docs/reference.md).

Applied once, by the registry, around each configured provider, so no
provider records its own metrics and none can forget to.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import trio

from egressd.metrics import PROVIDER_CALL_DURATION, PROVIDER_CALLS
from egressd.providers.contract import CreateRequest, Instance, Provider
from egressd.providers.errors import NotFound, Permanent, QuotaExceeded

T = TypeVar("T")

# The `result` label's values.
OK = "ok"
NOT_FOUND = "not_found"
PERMANENT = "permanent"
QUOTA = "quota_exceeded"
TRANSIENT = "transient"
CANCELLED = "cancelled"


def result_of(exc: BaseException | None) -> str:
    """The `result` label for a call that raised `exc` (None: it returned)."""
    if exc is None:
        return OK
    if isinstance(exc, trio.Cancelled):
        return CANCELLED
    if isinstance(exc, NotFound):
        return NOT_FOUND
    if isinstance(exc, Permanent):
        return PERMANENT
    if isinstance(exc, QuotaExceeded):
        return QUOTA
    return TRANSIENT


class MeteredProvider:
    """A `Provider` that records each call of the one it wraps, then passes it through."""

    def __init__(self, inner: Provider, *, name: str) -> None:
        self.inner = inner
        self.name = name

    async def _call(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        start = trio.current_time()
        try:
            value = await call()
        except BaseException as exc:
            self._record(op, result_of(exc), start)
            raise
        self._record(op, OK, start)
        return value

    def _record(self, op: str, result: str, start: float) -> None:
        PROVIDER_CALLS.labels(provider=self.name, op=op, result=result).inc()
        PROVIDER_CALL_DURATION.labels(provider=self.name, op=op).observe(
            trio.current_time() - start)

    async def create(self, request: CreateRequest, /) -> Instance:
        return await self._call("create", lambda: self.inner.create(request))

    async def get(self, provider_id: str, /) -> Instance:
        return await self._call("get", lambda: self.inner.get(provider_id))

    async def delete(self, provider_id: str, /) -> None:
        await self._call("delete", lambda: self.inner.delete(provider_id))

    async def list_by_labels(self, labels: Mapping[str, str], /) -> list[Instance]:
        return await self._call("list", lambda: self.inner.list_by_labels(labels))
