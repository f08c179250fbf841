"""Objects, the global resourceVersion counter, the event history and watch fan-out.

Everything here is synchronous: trio runs one task at a time, so a write,
its history entry and its delivery to every watcher happen atomically, and a
watch registered between two writes sees exactly the writes after it.
"""

from __future__ import annotations

import bisect
import copy
from collections import deque
from collections.abc import Iterator
from typing import Any

import attrs
import trio

Obj = dict[str, Any]

# A slow watcher whose queue grows past this is dropped (its stream ends), as
# kube-apiserver's watch cache drops watchers that cannot keep up.
WATCH_QUEUE_LIMIT = 10_000


@attrs.frozen
class Event:
    """One change: ADDED, MODIFIED or DELETED, with the object before it."""

    rv: int
    store_key: str
    type: str
    obj: Obj
    old: Obj | None


@attrs.define(eq=False)
class Watcher:
    """One open watch: events for a store key arrive on `receive`."""

    store_key: str
    namespace: str | None
    send: trio.MemorySendChannel[Event]
    receive: trio.MemoryReceiveChannel[Event]
    resource: str
    # Set by a fault to end the stream without the closing chunk.
    abrupt: bool = False


class Store:
    """All objects of the server, keyed by store key, then (namespace, name)."""

    def __init__(self, *, history_limit: int = 1000) -> None:
        self._rv = 0
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {}
        self._history: deque[Event] = deque()
        self._history_limit = history_limit
        # Highest resourceVersion no longer in the history: a watch from an
        # older version cannot be served (410 Expired).
        self._compacted = 0
        self._watchers: set[Watcher] = set()
        self._changed = trio.Event()

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def compacted(self) -> int:
        return self._compacted

    def next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def get(self, store_key: str, namespace: str, name: str) -> Obj | None:
        found = self._objects.get(store_key, {}).get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def peek(self, store_key: str, namespace: str, name: str) -> Obj | None:
        """The stored object itself, not a copy: read-only use."""
        return self._objects.get(store_key, {}).get((namespace, name))

    def items(self, store_key: str, namespace: str | None = None) -> Iterator[Obj]:
        """Stored objects (not copies) sorted by namespace then name."""
        bucket = self._objects.get(store_key, {})
        for key in sorted(bucket):
            if namespace is None or key[0] == namespace:
                yield bucket[key]

    def count(self, store_key: str) -> int:
        return len(self._objects.get(store_key, {}))

    def write(self, store_key: str, obj: Obj, *, event_type: str, old: Obj | None) -> Obj:
        """Store `obj` with a new resourceVersion and announce it; returns a copy."""
        meta = obj["metadata"]
        rv = self.next_rv()
        meta["resourceVersion"] = str(rv)
        key = (meta.get("namespace", ""), meta["name"])
        stored = copy.deepcopy(obj)
        bucket = self._objects.setdefault(store_key, {})
        if event_type == "DELETED":
            bucket.pop(key, None)
        else:
            bucket[key] = stored
        self._record(Event(rv, store_key, event_type, stored, old))
        return copy.deepcopy(stored)

    def drop_all(self, store_key: str) -> list[Obj]:
        """Remove every object of a store key, each with a DELETED event."""
        gone = []
        for obj in list(self.items(store_key)):
            gone.append(self.write(store_key, copy.deepcopy(obj), event_type="DELETED", old=obj))
        return gone

    def _record(self, event: Event) -> None:
        self._history.append(event)
        while len(self._history) > self._history_limit:
            self._compacted = self._history.popleft().rv
        for watcher in list(self._watchers):
            if watcher.store_key != event.store_key:
                continue
            try:
                watcher.send.send_nowait(event)
            except trio.WouldBlock:
                self.close_watcher(watcher)
            except trio.ClosedResourceError:
                self._watchers.discard(watcher)
        self._changed.set()
        self._changed = trio.Event()

    def compact(self) -> None:
        """Forget all history: a watch from any version before now gets 410."""
        if self._history:
            self._compacted = self._history[-1].rv
        self._history.clear()

    def events_since(self, store_key: str, rv: int) -> list[Event] | None:
        """Events after `rv` for a store key, or None when history no longer covers it."""
        if rv < self._compacted:
            return None
        start = bisect.bisect_right([e.rv for e in self._history], rv)
        return [e for e in list(self._history)[start:] if e.store_key == store_key]

    def watch(self, store_key: str, *, namespace: str | None, resource: str) -> Watcher:
        send, receive = trio.open_memory_channel[Event](WATCH_QUEUE_LIMIT)
        watcher = Watcher(store_key, namespace, send, receive, resource)
        self._watchers.add(watcher)
        return watcher

    def close_watcher(self, watcher: Watcher, *, abrupt: bool = False) -> None:
        watcher.abrupt = watcher.abrupt or abrupt
        watcher.send.close()
        self._watchers.discard(watcher)

    def watchers(self, resource: str | None = None) -> list[Watcher]:
        return [w for w in self._watchers if resource is None or w.resource == resource]

    async def wait_changed(self) -> None:
        """Wait for the next write (tests and `wait_for_watchers` use it)."""
        await self._changed.wait()

    def notify(self) -> None:
        """Wake `wait_changed` without a write (a watcher came or went)."""
        self._changed.set()
        self._changed = trio.Event()
