"""Kubernetes Events about objects, aggregated like client-go's recorder (docs/architecture.md).

The first occurrence of an event (same object, type, reason and message)
creates an Event with count 1; repeats patch that Event's `count` and
`lastTimestamp` instead of creating new ones. Recording is best effort: an
API failure is logged and dropped, never raised into the reconciler.
Recordings of one event are serialised (a lock per key, dropped when idle):
racing repeats would otherwise patch the same count, and racing first
occurrences would create one Event each.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

import attrs
import trio

from egressd import timestamps
from egressd.kube.client import KubeClient
from egressd.kube.errors import ApiError, ApiUnavailable, NotFound
from egressd.kube.resources import EVENTS, resource_version

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


@attrs.frozen
class _Key:
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    type: str
    reason: str
    message: str


@attrs.define
class _Seen:
    name: str
    namespace: str
    count: int


class EventRecorder:
    """Writes Events about objects on behalf of one component."""

    def __init__(
        self, client: KubeClient, *, component: str = "egressd", host: str = "",
        cache_size: int = 4096,
    ) -> None:
        self._client = client
        self._component = component
        self._host = host
        self._cache_size = cache_size
        self._seen: OrderedDict[_Key, _Seen] = OrderedDict()
        self._locks: dict[_Key, trio.Lock] = {}

    async def record(
        self, obj: dict[str, Any], *, type: str = NORMAL, reason: str, message: str
    ) -> dict[str, Any] | None:
        """Record an event about `obj`; returns the Event written, or None if it failed."""
        meta = obj.get("metadata") or {}
        key = _Key(
            api_version=str(obj.get("apiVersion") or ""), kind=str(obj.get("kind") or ""),
            namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""), type=type, reason=reason, message=message)
        lock = self._locks.setdefault(key, trio.Lock())
        try:
            async with lock:
                return await self._record(obj, key)
        finally:
            # Unlocked means no one is waiting: trio hands a released lock
            # straight to the next waiter.
            if not lock.locked() and self._locks.get(key) is lock:
                del self._locks[key]

    async def _record(self, obj: dict[str, Any], key: _Key) -> dict[str, Any] | None:
        namespace = key.namespace or "default"
        try:
            seen = self._seen.get(key)
            if seen is not None:
                try:
                    event = await self._client.merge_patch(
                        EVENTS, seen.name,
                        {"count": seen.count + 1,
                         "lastTimestamp": timestamps.now(precision="seconds")},
                        namespace=seen.namespace)
                except NotFound:
                    pass  # expired on the server: start a new one
                else:
                    seen.count = int(event.get("count") or seen.count + 1)
                    self._seen.move_to_end(key)
                    return event
            event = await self._client.create(EVENTS, self._event(obj, key, namespace),
                                              namespace=namespace)
        except (ApiError, ApiUnavailable) as exc:
            log.warning("recording an event failed",
                        extra={"reason": key.reason, "object": f"{namespace}/{key.name}",
                               "error": str(exc)})
            return None
        self._seen[key] = _Seen(name=event["metadata"]["name"], namespace=namespace, count=1)
        self._seen.move_to_end(key)
        while len(self._seen) > self._cache_size:
            self._seen.popitem(last=False)
        return event

    def _event(self, obj: dict[str, Any], key: _Key, namespace: str) -> dict[str, Any]:
        now = timestamps.now(precision="seconds")
        involved: dict[str, Any] = {
            "apiVersion": key.api_version, "kind": key.kind, "name": key.name,
            "namespace": key.namespace, "uid": key.uid,
        }
        if resource_version(obj):
            involved["resourceVersion"] = resource_version(obj)
        return {
            # client-go names events <object>.<unix nanos in hex>: unique, and
            # sorted by time in `kubectl get events`.
            "metadata": {"name": f"{key.name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": involved,
            "type": key.type,
            "reason": key.reason,
            "message": key.message,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": self._component, "host": self._host},
            "reportingComponent": self._component,
            "reportingInstance": self._host,
        }
