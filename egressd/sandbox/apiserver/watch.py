"""Watch streams: the initial events (a snapshot, or history since a resourceVersion),
then live events translated for the watcher's selection, bookmarks, and the end."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from contextlib import nullcontext

import attrs
import trio

from egressd.sandbox.apiserver import table
from egressd.sandbox.apiserver.errors import ApiError, bad_request, expired
from egressd.sandbox.apiserver.faults import Faults
from egressd.sandbox.apiserver.reads import parse_rv, selectors
from egressd.sandbox.apiserver.resources import ResourceType
from egressd.sandbox.apiserver.respond import out, watch_line
from egressd.sandbox.apiserver.routing import Target
from egressd.sandbox.apiserver.store import Event, Obj, Store, Watcher
from egressd.sandbox.apiserver.wire import AbortStream, Request, Send, Stream

Matcher = Callable[[Obj | None], bool]


def error_stream(error: ApiError) -> Stream:
    """A watch that answers one ERROR event, as a real server reports 410 Gone."""
    async def run(send: Send) -> None:
        await send(watch_line("ERROR", error.status()))

    return Stream(200, run)


def translate(event: Event, matches: Matcher) -> tuple[str, Obj] | None:
    """The event a selective watcher sees: objects entering or leaving its selection
    arrive as ADDED or DELETED, as kube-apiserver's watch cache sends them."""
    now, before = matches(event.obj), matches(event.old)
    if event.type == "DELETED":
        return ("DELETED", event.obj) if (now or before) else None
    if event.type == "ADDED":
        return ("ADDED", event.obj) if now else None
    if now and before:
        return ("MODIFIED", event.obj)
    if now:
        return ("ADDED", event.obj)
    if before:
        return ("DELETED", event.obj)
    return None


@attrs.frozen
class _Options:
    """A watch request's query, parsed before the stream starts."""

    rv: str
    timeout: float
    as_table: bool
    include: str
    bookmarks: bool
    send_initial: bool

    @classmethod
    def parse(cls, request: Request) -> _Options:
        try:
            timeout = float(request.param("timeoutSeconds") or 0)
        except ValueError:
            raise bad_request("timeoutSeconds: must be an integer") from None
        return cls(rv=request.param("resourceVersion"), timeout=timeout,
                   as_table=table.wants(request.headers.get("accept", ""), "Table"),
                   include=request.param("includeObject"),
                   bookmarks=request.flag("allowWatchBookmarks"),
                   send_initial=request.flag("sendInitialEvents"))

    @property
    def from_now(self) -> bool:
        return self.rv in ("", "0")


def _matcher(target: Target, request: Request) -> Matcher:
    labels, fields = selectors(target, request)
    namespace = target.namespace or None
    name = target.name or fields.name()

    def matches(obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        return ((namespace is None or meta.get("namespace", "") == namespace)
                and (name is None or meta["name"] == name)
                and labels.matches(obj) and fields.matches(obj))

    return matches


class Watches:
    """Opens watch streams on the store; `faults` may withhold bookmarks."""

    def __init__(self, store: Store, faults: Faults, *, now: Callable[[], datetime.datetime],
                 bookmark_interval: float) -> None:
        self.store = store
        self.faults = faults
        self._now = now
        self.bookmark_interval = bookmark_interval

    def open(self, target: Target, request: Request) -> Stream:
        rt = target.rt
        matches = _matcher(target, request)
        options = _Options.parse(request)
        # Register and snapshot with no checkpoint in between: nothing is missed or doubled.
        if options.from_now:
            initial = [("ADDED", copy.deepcopy(o))
                       for o in self.store.items(rt.store_key, target.namespace or None)
                       if matches(o)]
        else:
            since = self.store.events_since(rt.store_key, parse_rv(options.rv))
            if since is None:
                return error_stream(expired(parse_rv(options.rv), self.store.compacted + 1))
            initial = [t for t in (translate(e, matches) for e in since) if t is not None]
        watcher = self.store.watch(rt.store_key, namespace=target.namespace or None,
                                   resource=rt.plural)
        self.store.notify()

        def render(kind: str, obj: Obj) -> bytes:
            if options.as_table:
                return watch_line(kind, table.table(rt, [out(rt, obj)], now=self._now(),
                                                    include=options.include))
            return watch_line(kind, out(rt, obj))

        async def run(send: Send) -> None:
            try:
                with trio.move_on_after(options.timeout) if options.timeout > 0 else (
                        nullcontext()):
                    for kind, obj in initial:
                        await send(render(kind, obj))
                    if options.send_initial and options.bookmarks and options.from_now:
                        await send(self._bookmark(rt, initial_end=True))
                    await self._pump(watcher, rt, render, matches, send,
                                     bookmarks=options.bookmarks)
            finally:
                self.store.close_watcher(watcher)
                self.store.notify()

        return Stream(200, run)

    def _bookmark(self, rt: ResourceType, *, initial_end: bool = False) -> bytes:
        meta: Obj = {"resourceVersion": str(self.store.resource_version)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return watch_line("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version,
                                       "metadata": meta})

    async def _pump(self, watcher: Watcher, rt: ResourceType,
                    render: Callable[[str, Obj], bytes], matches: Matcher,
                    send: Send, *, bookmarks: bool) -> None:
        next_bookmark = trio.current_time() + self.bookmark_interval
        while True:
            event: Event | None = None
            with trio.move_on_at(next_bookmark if bookmarks else float("inf")):
                try:
                    event = await watcher.receive.receive()
                except trio.EndOfChannel:
                    if watcher.abrupt:
                        raise AbortStream from None
                    return
            if event is None:
                next_bookmark = trio.current_time() + self.bookmark_interval
                # Only when the queue is empty is "now" a version this watcher has reached.
                if (not self.faults.drop_bookmarks
                        and watcher.receive.statistics().current_buffer_used == 0):
                    await send(self._bookmark(rt))
                continue
            translated = translate(event, matches)
            if translated is not None:
                await send(render(*translated))
