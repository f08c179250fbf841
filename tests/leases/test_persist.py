"""Cooldowns persisted to status.cooldowns, through the fake API server (SPEC §7, item 2).

Each "replica" is an Informer on Proxies plus a fresh in-memory store observed
by a CooldownWriter, exactly as the daemon composes them. The stores' wall
clock is trio's clock plus an offset the tests move to make cooldowns end
(the API server and its watches keep running on real time).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from egressd.kube.client import KubeClient
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES
from egressd.leases import Candidate, Grant, Refusal, Result
from egressd.leases.persist import CooldownWriter
from egressd.leases.store import MemoryLeaseStore
from egressd.model.convert import parse_time
from egressd.sandbox.apiserver import FakeApiServer

EPOCH = 1_800_000_000.0


class Wall:
    """EPOCH + trio time + a jump the test controls."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return EPOCH + self.offset + trio.current_time()


def proxy(name: str) -> dict[str, Any]:
    return {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"mode": "External", "endpoint": {"host": "10.1.2.3"}}}


class Watcher:
    """Wait until an informer's cached object satisfies a predicate (event driven)."""

    def __init__(self, informer: Informer) -> None:
        self._informer = informer
        self._changed = trio.Event()
        self.history: list[tuple[str, dict[str, Any]]] = []
        informer.add_handler(on_add=self._poke, on_update=lambda _old, new: self._poke(new))

    def _poke(self, obj: dict[str, Any]) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        self.history.append((key, self.cooldowns(key)))
        self._changed.set()
        self._changed = trio.Event()

    def cooldowns(self, key: str) -> dict[str, Any]:
        obj = self._informer.get(key) or {}
        return dict((obj.get("status") or {}).get("cooldowns") or {})

    async def until(self, key: str, predicate: Callable[[dict[str, Any]], bool]) -> None:
        while not predicate(self.cooldowns(key)):
            await self._changed.wait()


def persisted_store(
    client: KubeClient, wall: Wall, lookup: Callable[[str], dict[str, Any] | None],
    cap: int = 64,
) -> tuple[MemoryLeaseStore, CooldownWriter]:
    """A store and the writer observing it, composed as the daemon does."""
    writer = CooldownWriter(client=client, lookup=lookup, clock=wall, cap=cap)
    store = MemoryLeaseStore(cooldown=600, ban_cooldown=3600, max_cooldown=3600, clock=wall,
                             max_cooldowns_per_proxy=cap, on_cooldown=writer.cooldown_started)
    return store, writer


@asynccontextmanager
async def replica(client: KubeClient, wall: Wall) -> AsyncIterator[
        tuple[MemoryLeaseStore, Watcher]]:
    informer = Informer(PROXIES, relist_backoff=(0.05, 0.2))
    store, writer = persisted_store(client, wall, informer.get)
    async with trio.open_nursery() as nursery:
        await nursery.start(informer.run, client)
        watcher = Watcher(informer)
        writer.attach(informer, store)
        await nursery.start(writer.run)
        yield store, watcher
        nursery.cancel_scope.cancel()


async def acquire(store: MemoryLeaseStore, key: str, target: str) -> Grant | Refusal:
    """Offer the proxy `key` to the store as the Proxy cache would, and acquire it alone."""
    store.put_candidate(Candidate(key=key, max_leases=10, attributes={"key": key}))
    return await store.acquire({"key": key}, target=target, ttl=60)


async def lease(store: MemoryLeaseStore, key: str, target: str = "") -> str:
    outcome = await acquire(store, key, target)
    assert isinstance(outcome, Grant), outcome
    return outcome.lease.id


async def test_report_restart_cooldown_still_holds(
    kube_client: KubeClient, apiserver: FakeApiServer,
) -> None:
    apiserver.create(proxy("a"))
    wall = Wall()
    with trio.fail_after(20):
        async with replica(kube_client, wall) as (first, seen):
            cd_target = await first.report(
                await lease(first, "default/a", "shop.example"), result=Result.RATE_LIMITED)
            cd_global = await first.report(
                await lease(first, "default/a"), result=Result.BANNED)
            assert cd_target is not None and cd_global is not None
            await seen.until("default/a", lambda c: set(c) == {"shop.example", "*"})
        stored = (await kube_client.get(PROXIES, "a", namespace="default"))["status"]["cooldowns"]
        assert stored["shop.example"]["reason"] == "rate_limited"
        assert stored["*"]["reason"] == "banned"
        assert parse_time(stored["*"]["until"]).timestamp() == cd_global.until

        # A restart: a fresh informer and an empty store.
        async with replica(kube_client, wall) as (second, _):
            restored = second.cooldowns("default/a")
            assert restored[""] == cd_global
            assert restored["shop.example"] == cd_target
            for target in ("", "shop.example", "other.example"):
                refused = await acquire(second, "default/a", target)
                assert isinstance(refused, Refusal) and refused.in_cooldown == 1


async def test_second_replica_sees_reports_and_reports_never_overwrite(
    kube_client: KubeClient, apiserver: FakeApiServer,
) -> None:
    apiserver.create(proxy("a"))
    wall = Wall()
    with trio.fail_after(20):
        async with replica(kube_client, wall) as (one, _), \
                replica(kube_client, wall) as (two, seen_by_two):
            await one.report(await lease(one, "default/a", "x.example"),
                             result=Result.RATE_LIMITED, retry_after=30)
            await two.report(await lease(two, "default/a", "y.example"),
                             result=Result.BANNED)
            await seen_by_two.until("default/a", lambda c: set(c) == {"x.example", "y.example"})
            assert set(two.cooldowns("default/a")) == {"x.example", "y.example"}
            refused = await acquire(two, "default/a", "x.example")
            assert isinstance(refused, Refusal) and refused.in_cooldown == 1


async def test_expired_entries_are_pruned(
    kube_client: KubeClient, apiserver: FakeApiServer,
) -> None:
    apiserver.create(proxy("a"))
    apiserver.create(proxy("b"))
    wall = Wall()
    with trio.fail_after(20):
        async with replica(kube_client, wall) as (store, seen):
            await store.report(await lease(store, "default/a", "old.example"),
                               result=Result.RATE_LIMITED, retry_after=30)
            await seen.until("default/a", lambda c: "old.example" in c)
            wall.offset += 31
            # The next report's patch sets the ended entry to null.
            await store.report(await lease(store, "default/a", "new.example"),
                               result=Result.BANNED)
            await seen.until("default/a", lambda c: set(c) == {"new.example"})

            # An ended entry arriving from elsewhere (an old replica) is pruned on sight,
            # and never enforced.
            ended = {"until": "2020-01-01T00:00:00Z", "reason": "banned"}
            await kube_client.patch_status(
                PROXIES, "b", {"status": {"cooldowns": {"*": ended}}}, namespace="default")
            await seen.until("default/b", lambda c: c == {} and ("default/b", {"*": ended})
                             in seen.history)
            assert store.cooldowns("default/b") == {}


async def test_an_ended_cooldown_is_pruned_without_any_event(
    kube_client: KubeClient, apiserver: FakeApiServer,
) -> None:
    # No later report and no other change to the Proxy: the prune timer alone removes
    # the entry once it ends (a Retry-After of 1 s, the shortest cooldown there is).
    apiserver.create(proxy("a"))
    wall = Wall()
    with trio.fail_after(10):
        async with replica(kube_client, wall) as (store, seen):
            cd = await store.report(await lease(store, "default/a", "quick.example"),
                                    result=Result.RATE_LIMITED, retry_after=1)
            assert cd is not None
            await seen.until("default/a", lambda c: "quick.example" in c)
            await seen.until("default/a", lambda c: c == {})
            assert wall() >= cd.until
            assert store.cooldowns("default/a") == {}


async def test_a_stale_replica_never_shortens_a_recorded_cooldown(
    kube_client: KubeClient, apiserver: FakeApiServer,
) -> None:
    # Replica two's cache has not seen replica one's ban yet when it writes a shorter
    # rate limit for the same target: its patch must not overwrite the ban in status.
    apiserver.create(proxy("a"))
    wall = Wall()
    with trio.fail_after(20):
        stale = await kube_client.get(PROXIES, "a", namespace="default")
        async with replica(kube_client, wall) as (one, seen):
            ban = await one.report(await lease(one, "default/a", "x.example"),
                                   result=Result.BANNED)
            assert ban is not None
            await seen.until("default/a", lambda c: "x.example" in c)

            two, two_writer = persisted_store(kube_client, wall, lambda _key: stale)
            async with trio.open_nursery() as nursery:
                await nursery.start(two_writer.run)
                await two.report(await lease(two, "default/a", "x.example"),
                                 result=Result.RATE_LIMITED, retry_after=30)
                # Writes are sequential: once this one shows, the one above is done.
                await two.report(await lease(two, "default/a", "z.example"),
                                 result=Result.RATE_LIMITED, retry_after=30)
                await seen.until("default/a", lambda c: "z.example" in c)
                nursery.cancel_scope.cancel()
            stored = seen.cooldowns("default/a")
            assert stored["x.example"]["reason"] == "banned"
            assert parse_time(stored["x.example"]["until"]).timestamp() == ban.until


async def test_cooldowns_reported_at_shutdown_are_still_written(
    kube_client: KubeClient, apiserver: FakeApiServer,
) -> None:
    # Stopping the writer (SIGTERM) must not drop a report it has not written yet, nor
    # one answered while the HTTP servers drain after it stopped (SPEC §7).
    apiserver.create(proxy("a"))
    wall = Wall()
    store, writer = persisted_store(kube_client, wall, lambda _key: None)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            # No checkpoint between the report and the cancel: the write is still queued.
            await store.report(await lease(store, "default/a", "queued.example"),
                               result=Result.BANNED)
            nursery.cancel_scope.cancel()
        await store.report(await lease(store, "default/a", "late.example"),
                           result=Result.BANNED)
    stored = (await kube_client.get(PROXIES, "a", namespace="default"))["status"]["cooldowns"]
    assert set(stored) == {"queued.example", "late.example"}


async def test_status_cooldowns_are_capped_like_the_store(
    kube_client: KubeClient, apiserver: FakeApiServer,
) -> None:
    # Issue 19 item 2: a flood of distinct targets must not grow the Proxy object; the
    # writer nulls what the store evicted (the soonest-ending), by the same rule.
    apiserver.create(proxy("a"))
    wall = Wall()
    informer = Informer(PROXIES, relist_backoff=(0.05, 0.2))
    store, writer = persisted_store(kube_client, wall, informer.get, cap=2)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(informer.run, kube_client)
            seen = Watcher(informer)
            writer.attach(informer, store)
            await nursery.start(writer.run)
            lease_id = await lease(store, "default/a")
            for target, seconds in (("t1.example", 300), ("t2.example", 100),
                                    ("t3.example", 200)):
                await store.report(lease_id, result=Result.RATE_LIMITED, target=target,
                                   retry_after=seconds)
            await seen.until("default/a", lambda c: "t3.example" in c)
            assert set(seen.cooldowns("default/a")) == {"t1.example", "t3.example"}
            assert set(store.cooldowns("default/a")) == {"t1.example", "t3.example"}
            nursery.cancel_scope.cancel()
