"""A list+watch cache of one resource, like client-go's reflector and informer.

`Informer.run` lists, then watches from the list's resourceVersion with
bookmarks, a random 5-10 min `timeoutSeconds` and an inactivity timeout. A
watch that ends or breaks is resumed from the last version seen (no relist);
a `410 Gone` relists from that version, and a relist that is 410 too falls
back to a quorum list (resourceVersion ""). Relists and failing watch opens
back off 0.8 s doubling to 30 s with jitter. The cache is raw dicts keyed
`namespace/name`; handlers are synchronous callbacks (typically: enqueue the
key), called after the cache has changed.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import attrs
import trio

from egressd.backoff import Backoff, Retries
from egressd.kube.client import KubeClient
from egressd.kube.errors import ApiError, ApiUnavailable, Gone
from egressd.kube.resources import Resource, object_key
from egressd.kube.resources import resource_version as version_of
from egressd.kube.watch import ADDED, BOOKMARK, DELETED, MODIFIED, WatchCut, WatchEvent
from egressd.metrics import WATCH_RESTARTS

log = logging.getLogger(__name__)

Obj = dict[str, Any]

REPLACE_BATCH = 200
"""Handler calls between two checkpoints when a list replaces the cache (`_replace`)."""


@attrs.frozen
class Handler:
    """Callbacks for one consumer; any of them may be None."""

    on_add: Callable[[Obj], None] | None = None
    on_update: Callable[[Obj, Obj], None] | None = None
    """Called with (old, new)."""
    on_delete: Callable[[Obj], None] | None = None
    """Called with the last state of the object."""


class Informer:
    """An in-memory, watch-fed cache of one resource (optionally namespace/label restricted)."""

    def __init__(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout: tuple[int, int] = (300, 600),
        inactivity_timeout: float = 120.0,
        relist_backoff: tuple[float, float] = (0.8, 30.0),
        healthy_watch: float = 1.0,
    ) -> None:
        """`watch_timeout` is the range of the random timeoutSeconds; a watch
        that does not open, or then delivers nothing, for `inactivity_timeout`
        seconds is reopened; one that lived `healthy_watch` seconds or
        delivered an event is reopened at once, a shorter one after a backoff."""
        self.resource = resource
        self.namespace = namespace or None
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.synced = trio.Event()
        self._watch_timeout = watch_timeout
        self._inactivity_timeout = inactivity_timeout
        # Only lengthened (1.0-1.5): a relist storm against a struggling server is what
        # the backoff is for.
        self._backoff = Retries(Backoff(*relist_backoff, jitter=(1.0, 1.5)))
        self._healthy_watch = healthy_watch
        self._cache: dict[str, Obj] = {}
        self._handlers: list[Handler] = []
        self._rv = ""
        self.lists = 0
        """How many lists this informer made (the first one included)."""

    # -- the cache ---------------------------------------------------------

    def get(self, key: str) -> Obj | None:
        """The cached object for `namespace/name`, or None."""
        return self._cache.get(key)

    def items(self) -> list[Obj]:
        """Every cached object (a snapshot list; the dicts are shared, do not mutate)."""
        return list(self._cache.values())

    def keys(self) -> list[str]:
        return list(self._cache)

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def resource_version(self) -> str:
        """The last resourceVersion seen (list, event or bookmark)."""
        return self._rv

    def add_handler(
        self,
        *,
        on_add: Callable[[Obj], None] | None = None,
        on_update: Callable[[Obj, Obj], None] | None = None,
        on_delete: Callable[[Obj], None] | None = None,
    ) -> None:
        """Register callbacks; objects already cached are replayed to `on_add`."""
        handler = Handler(on_add, on_update, on_delete)
        self._handlers.append(handler)
        if on_add is not None:
            for obj in list(self._cache.values()):
                self._call(on_add, obj)

    def add_key_handler(self, callback: Callable[[str], None]) -> None:
        """Call `callback(namespace/name)` on every add, update and delete."""
        self.add_handler(
            on_add=lambda obj: callback(object_key(obj)),
            on_update=lambda old, new: callback(object_key(new)),
            on_delete=lambda obj: callback(object_key(obj)),
        )

    def _call(self, fn: Callable[..., None], *args: Obj) -> None:
        try:
            fn(*args)
        except Exception:
            # A handler bug must not stop the cache (client-go's HandleCrash).
            log.exception("informer handler failed", extra={"resource": self.resource.plural})

    def _added(self, obj: Obj) -> None:
        for h in self._handlers:
            if h.on_add is not None:
                self._call(h.on_add, obj)

    def _updated(self, old: Obj, new: Obj) -> None:
        for h in self._handlers:
            if h.on_update is not None:
                self._call(h.on_update, old, new)

    def _deleted(self, obj: Obj) -> None:
        for h in self._handlers:
            if h.on_delete is not None:
                self._call(h.on_delete, obj)

    async def _replace(self, items: list[Obj], resource_version: str) -> None:
        """Swap in a list's objects, then tell the handlers what changed.

        The handlers run in batches of `REPLACE_BATCH` with a checkpoint between:
        a relist of 10,000 changed Proxies costs seconds of handler work (each is
        parsed and indexed), which in one go would stall every request meanwhile.
        Between two batches the handlers' views lag the cache, as they do while
        watch events are on their way.
        """
        fresh = {object_key(obj): obj for obj in items}
        old_cache = self._cache
        self._cache = fresh
        self._rv = resource_version
        calls = 0
        for key, gone in old_cache.items():
            if key not in fresh:
                self._deleted(gone)
                calls += 1
                if calls % REPLACE_BATCH == 0:
                    await trio.lowlevel.checkpoint()
        for key, obj in fresh.items():
            old = old_cache.get(key)
            if old is None:
                self._added(obj)
            elif version_of(old) != version_of(obj):
                self._updated(old, obj)
            else:
                continue
            calls += 1
            if calls % REPLACE_BATCH == 0:
                await trio.lowlevel.checkpoint()

    def _apply(self, event: WatchEvent) -> None:
        obj = event.object
        if event.type == BOOKMARK:
            self._rv = event.resource_version or self._rv
            return
        if event.type not in (ADDED, MODIFIED, DELETED):
            log.warning("unknown watch event type", extra={"type": event.type})
            return
        key = object_key(obj)
        if event.type == DELETED:
            old = self._cache.pop(key, None)
            self._rv = event.resource_version or self._rv
            self._deleted(obj if obj.get("metadata") else (old or obj))
            return
        previous = self._cache.get(key)
        self._cache[key] = obj
        self._rv = event.resource_version or self._rv
        if previous is None:
            self._added(obj)
        else:
            self._updated(previous, obj)

    # -- list and watch ----------------------------------------------------

    def _restart(self, reason: str) -> None:
        WATCH_RESTARTS.labels(resource=self.resource.plural, reason=reason).inc()

    async def _list(self, client: KubeClient, resource_version: str) -> None:
        """List into the cache; a 410 on a versioned relist falls back to a quorum list."""
        self.lists += 1
        try:
            result = await client.list(
                self.resource, namespace=self.namespace, label_selector=self.label_selector,
                field_selector=self.field_selector, resource_version=resource_version)
        except Gone:
            if not resource_version:
                raise
            log.info("relist version too old, quorum list",
                     extra={"resource": self.resource.plural})
            self.lists += 1
            result = await client.list(
                self.resource, namespace=self.namespace, label_selector=self.label_selector,
                field_selector=self.field_selector, resource_version="")
        await self._replace(result.items, result.resource_version)

    async def run(
        self, client: KubeClient, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the cache in sync until cancelled; `started()` once the first list is in."""
        started = False
        list_version = ""
        while True:
            try:
                await self._list(client, list_version)
            except (ApiError, ApiUnavailable) as exc:
                delay = self._backoff.next()
                log.warning("list failed, retrying",
                            extra={"resource": self.resource.plural, "error": str(exc),
                                   "delay": round(delay, 2)})
                await trio.sleep(delay)
                continue
            if not started:
                started = True
                self.synced.set()
                task_status.started()
            await self._watch_until_gone(client)
            self._restart("gone")
            list_version = self._rv
            await trio.sleep(self._backoff.next())

    async def _watch_until_gone(self, client: KubeClient) -> None:
        """Watch and resume from the last version until the server answers 410."""
        while True:
            low, high = self._watch_timeout
            opened_at: float | None = None
            delivered = False
            reason = "closed"
            try:
                # One deadline, pushed back by every event, also bounds the
                # open: a watch has no read timeout (it must idle), so a server
                # that never answers the request would otherwise hang it.
                with trio.CancelScope(
                        deadline=trio.current_time() + self._inactivity_timeout) as quiet:
                    async with client.watch(
                        self.resource, namespace=self.namespace,
                        label_selector=self.label_selector,
                        field_selector=self.field_selector, resource_version=self._rv,
                        timeout_seconds=random.randint(low, high),  # noqa: S311 - spread
                    ) as stream:
                        opened_at = trio.current_time()
                        quiet.deadline = opened_at + self._inactivity_timeout
                        async for event in stream:
                            self._apply(event)
                            delivered = True
                            quiet.deadline = trio.current_time() + self._inactivity_timeout
                if quiet.cancelled_caught:
                    reason = "inactive"
            except Gone:
                log.info("watch version too old, relisting",
                         extra={"resource": self.resource.plural, "version": self._rv})
                return
            except WatchCut as exc:
                reason = "cut"
                log.info("watch cut, resuming",
                         extra={"resource": self.resource.plural, "error": str(exc)})
            except (ApiError, ApiUnavailable) as exc:
                reason = "error"
                log.warning("watch failed",
                            extra={"resource": self.resource.plural, "error": str(exc)})
            self._restart(reason)
            healthy = delivered or (
                opened_at is not None
                and trio.current_time() - opened_at >= self._healthy_watch)
            if healthy:
                self._backoff.reset()
            else:
                await trio.sleep(self._backoff.next())
