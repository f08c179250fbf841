"""Cooldowns that survive a restart and reach every replica (docs/reference.md).

`CooldownWriter` observes the lease store: the store calls its hook with every
cooldown a report starts, and the writer writes it to the Proxy's
`status.cooldowns` with one merge patch
(`{"status": {"cooldowns": {"<target or *>": {until, reason}}}}`), which also
sets the proxy's expired entries to null (pruning). Every Proxy the informer
delivers (the initial list included) is read back into the store, so a
restarted replica, or a second one, enforces the same cooldowns. An entry is
also pruned when it ends, by a timer, so a proxy nobody reports on or changes
does not keep an ended cooldown in its status. The writer owns the queue, the
prune timer and the patches; the store owns every rule about cooldowns.

Writes happen in a background task fed by a queue, not in the request: a
report answers at once (the cooldown is already in force in memory) and a slow
or failing API server cannot stall clients. If a write fails for good the
cooldown still holds on this replica until it ends; only a restart in that
window would lose it, which is logged.

Active leases are not persisted: after a restart their ids answer as unknown
and their capacity frees within one TTL (docs/reference.md).
"""

from __future__ import annotations

import datetime as dt
import heapq
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import attrs
import trio

from egressd.kube.client import KubeClient
from egressd.kube.errors import ApiError, ApiUnavailable, Conflict, NotFound
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES, object_key
from egressd.kube.resources import resource_version as kube_resource_version
from egressd.leases.cooldowns import DEFAULT_CAP, evictions
from egressd.leases.interface import GLOBAL, Cooldown, Result, outlasts
from egressd.model.constants import GLOBAL_COOLDOWN_KEY
from egressd.model.convert import ModelError, parse_proxy
from egressd.timestamps import format_wall

log = logging.getLogger(__name__)

QUEUE_SIZE = 4096
"""Cooldown writes waiting at most; beyond that a write is dropped (and logged)."""

WRITE_TIMEOUT = 10.0
"""Longest one cooldown write may take; it is shielded from cancellation up to this."""

FLUSH_TIMEOUT = 5.0
"""At shutdown, how long queued cooldown writes may still be flushed."""

CONFLICT_RETRIES = 5
"""Times a cooldown write re-reads the Proxy after a 409 before it gives up (and logs)."""

RawObject = dict[str, Any]


class CooldownSink(Protocol):
    """Where cooldowns read back from status go: the lease store."""

    def merge_cooldowns(self, cooldowns: Iterable[Cooldown]) -> None: ...


def wire_key(target: str) -> str:
    return target or GLOBAL_COOLDOWN_KEY


def store_target(key: str) -> str:
    return GLOBAL if key == GLOBAL_COOLDOWN_KEY else key


def _wall(value: dt.datetime) -> float:
    return value.timestamp()


def _timestamp(wall: float) -> str:
    return format_wall(wall)


@attrs.frozen
class _Write:
    """One queued status patch for one proxy: a new cooldown, or only a prune."""

    key: str
    cooldown: Cooldown | None


def cooldowns_in(obj: RawObject) -> dict[str, Cooldown]:
    """The cooldowns recorded in a raw Proxy's status, by store target ("" = global).

    A reason other than ours (a cooldown written by hand) is honoured as a ban.
    Raises ModelError if the object does not parse.
    """
    proxy = parse_proxy(obj)
    out: dict[str, Cooldown] = {}
    for key, entry in proxy.status.cooldowns.items():
        try:
            reason = Result(entry.reason)
        except ValueError:
            reason = Result.BANNED
        target = store_target(key)
        out[target] = Cooldown(key=proxy.key, target=target, until=_wall(entry.until),
                               reason=reason)
    return out


def cooldown_patch(
    new: Cooldown | None, recorded: Iterable[Cooldown], *, now: float, cap: int = DEFAULT_CAP,
) -> dict[str, Any] | None:
    """The merge patch that adds `new` and nulls every recorded entry that has ended,
    and those past the store's cap per proxy (the same `evictions` rule).

    None when there is nothing to write.
    """
    recorded = list(recorded)
    entries: dict[str, Any] = {
        wire_key(cd.target): None for cd in recorded if cd.until <= now
    }
    live = [cd for cd in recorded if cd.until > now and (new is None or cd.target != new.target)]
    adding = new is not None and new.target != GLOBAL
    for gone in evictions(live, room=cap - 1 if adding else cap):
        entries[wire_key(gone.target)] = None
    if new is not None:
        entries[wire_key(new.target)] = {
            "until": _timestamp(new.until), "reason": new.reason.value}
    if not entries:
        return None
    return {"status": {"cooldowns": entries}}


class CooldownWriter:
    """Writes the store's cooldowns to `status.cooldowns` and reads them back.

    `cooldown_started` is the store's cooldown hook. `lookup(key)` returns the
    cached raw Proxy (the informer's `get`), used to find entries to prune
    without a GET per write. `clock` is the store's wall clock.
    """

    def __init__(
        self,
        *,
        client: KubeClient,
        lookup: Callable[[str], RawObject | None],
        clock: Callable[[], float],
        cap: int = DEFAULT_CAP,
    ) -> None:
        self._client = client
        self._cap = cap
        self._lookup = lookup
        self._clock = clock
        self._send, self._receive = trio.open_memory_channel[_Write](QUEUE_SIZE)
        self._prune_pending: set[str] = set()
        # (until, proxy key) of every cooldown this replica knows of, for the prune timer.
        self._ends: list[tuple[float, str]] = []
        self._ends_seen: set[tuple[float, str]] = set()
        self._ends_changed = trio.Event()
        self._closing = False

    async def cooldown_started(self, cooldown: Cooldown) -> None:
        """The store's hook: queue the write of a cooldown it has just put in force."""
        self._remember_end(cooldown)
        write = _Write(key=cooldown.key, cooldown=cooldown)
        if self._closing:
            # The writer has stopped (shutdown, while the HTTP servers drain): write
            # from the request itself so a report answered at shutdown is not lost.
            await self._write(write)
        else:
            self._enqueue(write)

    # --- reading back ---------------------------------------------------------------

    def load(self, obj: RawObject, store: CooldownSink) -> None:
        """Hand the cooldowns of one Proxy to `store`; queue a prune if some have ended."""
        try:
            recorded = cooldowns_in(obj)
        except ModelError as exc:
            log.warning("cannot read cooldowns", extra={"proxy": object_key(obj),
                                                        "error": str(exc)})
            return
        store.merge_cooldowns(recorded.values())
        now = self._clock()
        key = object_key(obj)
        for cd in recorded.values():
            if cd.until > now:
                self._remember_end(cd)
        if any(cd.until <= now for cd in recorded.values()):
            self._prune(key)

    def attach(self, informer: Informer, store: CooldownSink) -> None:
        """Load every Proxy the informer delivers (its first list included) into `store`."""
        informer.add_handler(on_add=lambda obj: self.load(obj, store),
                             on_update=lambda _old, new: self.load(new, store))

    # --- writing --------------------------------------------------------------------

    def _prune(self, key: str) -> None:
        if key not in self._prune_pending:
            self._prune_pending.add(key)
            self._enqueue(_Write(key=key, cooldown=None))

    def _remember_end(self, cd: Cooldown) -> None:
        # Every replica loads every Proxy on every event: remember each (until, key) once.
        if (cd.until, cd.key) in self._ends_seen:
            return
        self._ends_seen.add((cd.until, cd.key))
        heapq.heappush(self._ends, (cd.until, cd.key))
        if self._ends[0] == (cd.until, cd.key):
            self._ends_changed.set()
            self._ends_changed = trio.Event()

    async def _prune_when_ended(self) -> None:
        """Queue a prune of each proxy's status as soon as one of its cooldowns ends."""
        while True:
            now = self._clock()
            while self._ends and self._ends[0][0] <= now:
                end = heapq.heappop(self._ends)
                self._ends_seen.discard(end)
                self._prune(end[1])
            # The store's clock is wall time; sleep on trio's for the same span, and
            # wake early when an earlier end is recorded.
            delay = self._ends[0][0] - now if self._ends else math.inf
            with trio.move_on_after(delay):
                await self._ends_changed.wait()

    def _enqueue(self, write: _Write) -> None:
        try:
            self._send.send_nowait(write)
        except trio.WouldBlock:
            log.error("cooldown write queue full; cooldown kept in memory only",
                      extra={"proxy": write.key})
            self._prune_pending.discard(write.key)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write queued cooldowns, one merge patch each, and prune ended ones, until cancelled.

        Cooldowns are data a restart must not lose (docs/reference.md), so a write in flight is
        shielded from cancellation (up to WRITE_TIMEOUT), and on cancellation the
        cooldowns still queued are flushed (up to FLUSH_TIMEOUT) before it returns;
        reports answered after that write from the request itself.
        """
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._prune_when_ended)
                task_status.started()
                async for write in self._receive:
                    if write.cooldown is None:
                        self._prune_pending.discard(write.key)
                    with trio.CancelScope(shield=True) as scope:
                        scope.deadline = trio.current_time() + WRITE_TIMEOUT
                        await self._write(write)
        finally:
            self._closing = True
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + FLUSH_TIMEOUT
                await self._flush()

    async def _flush(self) -> None:
        while True:
            try:
                write = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return
            if write.cooldown is not None:  # prunes can wait for the next start
                await self._write(write)

    async def _write(self, write: _Write) -> None:
        # The patch carries the resourceVersion it was computed from, so a replica whose
        # cache has not yet seen another replica's longer cooldown for the same target
        # gets a 409 instead of overwriting it; it re-reads and never shortens an entry.
        namespace, _, name = write.key.rpartition("/")
        current = self._lookup(write.key)
        for _ in range(CONFLICT_RETRIES):
            patch = self._patch_for(write, current)
            if patch is None:
                return
            try:
                await self._client.patch_status(PROXIES, name, patch, namespace=namespace)
                return
            except Conflict:
                try:
                    current = await self._client.get(PROXIES, name, namespace=namespace)
                except NotFound:
                    return
                except (ApiError, ApiUnavailable) as exc:
                    self._not_persisted(write, exc)
                    return
            except NotFound:
                return  # the Proxy is gone, and its cooldowns with it
            except (ApiError, ApiUnavailable) as exc:
                # The client already retried what is worth retrying.
                self._not_persisted(write, exc)
                return
        self._not_persisted(write, f"still conflicting after {CONFLICT_RETRIES} tries")

    def _patch_for(self, write: _Write, current: RawObject | None) -> dict[str, Any] | None:
        recorded: dict[str, Cooldown] = {}
        resource_version = None
        if current is not None:
            resource_version = kube_resource_version(current) or None
            try:
                recorded = cooldowns_in(current)
            except ModelError:
                recorded = {}
        new = write.cooldown
        if new is not None and not outlasts(new, recorded.get(new.target)):
            new = None  # at least as long a cooldown is recorded already
        patch = cooldown_patch(new, recorded.values(), now=self._clock(), cap=self._cap)
        if patch is not None and resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        return patch

    @staticmethod
    def _not_persisted(write: _Write, why: object) -> None:
        log.warning("cooldown not persisted; it holds on this replica only",
                    extra={"proxy": write.key, "error": str(why)})
