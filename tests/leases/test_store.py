"""The in-memory lease store: selection order, capacity, cooldown scoping, TTL and the sweeper.

The store's wall clock is derived from trio's mock clock (`EPOCH + current_time()`),
so `await trio.sleep(n)` under `autojump_clock` moves the store's time by exactly n.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import trio
import trio.lowlevel
import trio.testing

from egressd import metrics
from egressd.leases import Candidate, Cooldown, Grant, Refusal, Result, UnknownLeaseError
from egressd.leases.store import MemoryLeaseStore

EPOCH = 1_800_000_000.0


def trio_wall() -> float:
    return EPOCH + trio.current_time()


def make_store(**kw: float) -> MemoryLeaseStore:
    args: dict[str, float] = {"cooldown": 600.0, "ban_cooldown": 3600.0, "max_cooldown": 3600.0}
    args.update(kw)
    return MemoryLeaseStore(**args, clock=trio_wall)  # type: ignore[arg-type]


def cand(key: str, max_leases: int = 10, latency: float | None = None) -> Candidate:
    return Candidate(key=key, max_leases=max_leases, latency_ms=latency)


async def acquire(store: MemoryLeaseStore, cands: Iterable[Candidate], *, target: str,
                  ttl: float) -> Grant | Refusal:
    """Offer `cands` to the store as the Proxy cache would, then acquire with no selector."""
    for c in cands:
        store.put_candidate(c)
    return await store.acquire({}, target=target, ttl=ttl)


def grant(result: Grant | Refusal) -> Grant:
    assert isinstance(result, Grant), result
    return result


def refusal(result: Grant | Refusal) -> Refusal:
    assert isinstance(result, Refusal), result
    return result


async def test_grant_shape_and_ids(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store()
    g = grant(await acquire(store, [cand("ns/a")], target="example.org", ttl=300))
    assert g.active_leases == 1
    assert g.lease.key == "ns/a"
    assert g.lease.target == "example.org"
    assert g.lease.expires_at == pytest.approx(trio_wall() + 300)
    ids = {g.lease.id}
    for _ in range(50):
        ids.add(grant(await acquire(store, [cand("ns/a", 100)], target="", ttl=1)).lease.id)
    assert len(ids) == 51
    assert all(len(i) >= 32 for i in ids)  # token_urlsafe(24): 32 characters, 192 bits


async def test_order_fewest_leases_then_latency_then_name(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = make_store()
    cands = [cand("ns/c", latency=None), cand("ns/b", latency=50.0), cand("ns/a", latency=50.0),
             cand("ns/d", latency=10.0)]
    picks = [grant(await acquire(store, cands, target="", ttl=60)).lease.key for _ in range(8)]
    # Round one by latency (unknown last), ties by name; round two the same again.
    assert picks == ["ns/d", "ns/a", "ns/b", "ns/c"] * 2


async def test_capacity_and_max_leases_zero(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store()
    cands = [cand("ns/a", max_leases=2), cand("ns/zero", max_leases=0)]
    for _ in range(2):
        assert grant(await acquire(store, cands, target="", ttl=60)).lease.key == "ns/a"
    r = refusal(await acquire(store, cands, target="", ttl=60))
    assert (r.considered, r.at_capacity, r.in_cooldown) == (2, 2, 0)


async def test_release_frees_capacity_and_is_idempotent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = make_store()
    g = grant(await acquire(store, [cand("ns/a", 1)], target="", ttl=60))
    assert isinstance(await acquire(store, [cand("ns/a", 1)], target="", ttl=60), Refusal)
    await store.release(g.lease.id)
    await store.release(g.lease.id)
    await store.release("never-issued")
    assert (await store.usage(["ns/a"])) == {}
    g2 = grant(await acquire(store, [cand("ns/a", 1)], target="", ttl=60))
    assert g2.active_leases == 1


async def test_ttl_frees_capacity_without_sweeper(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store()
    grant(await acquire(store, [cand("ns/a", 1)], target="", ttl=30))
    await trio.sleep(29.9)
    assert isinstance(await acquire(store, [cand("ns/a", 1)], target="", ttl=30), Refusal)
    await trio.sleep(0.1)
    # No sweeper task runs in this test: expiry is read off the clock.
    assert grant(await acquire(store, [cand("ns/a", 1)], target="", ttl=30)).active_leases == 1


async def test_cooldown_scoping(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store()
    a = [cand("ns/a")]
    g = grant(await acquire(store, a, target="shop.example", ttl=60))
    cd = await store.report(g.lease.id, result=Result.RATE_LIMITED)
    assert cd is not None and cd.target == "shop.example"  # the lease's target
    # A target cooldown blocks that target only; no-target acquires see only global ones.
    assert refusal(await acquire(store, a, target="shop.example", ttl=60)).in_cooldown == 1
    grant(await acquire(store, a, target="other.example", ttl=60))
    g = grant(await acquire(store, a, target="", ttl=60))
    # A report's own target wins over the lease's.
    cd = await store.report(g.lease.id, result=Result.BANNED, target="news.example")
    assert cd is not None and cd.target == "news.example"
    grant(await acquire(store, a, target="", ttl=60))
    # No target on the report nor the lease: global, which blocks everything.
    g = grant(await acquire(store, a, target="", ttl=60))
    cd = await store.report(g.lease.id, result=Result.RATE_LIMITED)
    assert cd is not None and cd.target == ""
    for target in ("", "other.example", "third.example"):
        r = refusal(await acquire(store, a, target=target, ttl=60))
        assert (r.considered, r.at_capacity, r.in_cooldown) == (1, 0, 1)


async def test_report_durations_and_bounds(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store(cooldown=600, ban_cooldown=7200, max_cooldown=1800)
    now = trio_wall()

    async def until(result: Result, retry_after: float | None, target: str) -> float:
        g = grant(await acquire(store, [cand("ns/a", 100)], target=target, ttl=60))
        cd = await store.report(g.lease.id, result=result, retry_after=retry_after)
        assert cd is not None and cd.reason is result
        return cd.until - now

    assert await until(Result.RATE_LIMITED, None, "t1") == pytest.approx(600)
    assert await until(Result.RATE_LIMITED, 42, "t2") == pytest.approx(42)
    assert await until(Result.RATE_LIMITED, 0, "t3") == pytest.approx(1)
    assert await until(Result.RATE_LIMITED, 0.2, "t4") == pytest.approx(1)
    assert await until(Result.RATE_LIMITED, 99999, "t5") == pytest.approx(1800)
    # A ban never takes the client's Retry-After, and never shares the 429 duration.
    assert await until(Result.BANNED, 42, "t6") == pytest.approx(7200)
    g = grant(await acquire(store, [cand("ns/a", 100)], target="t7", ttl=60))
    assert await store.report(g.lease.id, result=Result.OK) is None
    assert "t7" not in store.cooldowns("ns/a")


async def test_rate_limit_does_not_shorten_a_ban(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store()
    g = grant(await acquire(store, [cand("ns/a")], target="t", ttl=60))
    ban = await store.report(g.lease.id, result=Result.BANNED)
    again = await store.report(g.lease.id, result=Result.RATE_LIMITED, retry_after=5)
    assert again == ban


async def test_cooldown_expires(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store()
    g = grant(await acquire(store, [cand("ns/a")], target="t", ttl=60))
    await store.report(g.lease.id, result=Result.RATE_LIMITED, retry_after=30)
    await trio.sleep(29.5)
    assert isinstance(await acquire(store, [cand("ns/a")], target="t", ttl=60), Refusal)
    await trio.sleep(0.5)
    grant(await acquire(store, [cand("ns/a")], target="t", ttl=60))


async def test_late_report_on_expired_lease(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store(cooldown=600)
    g = grant(await acquire(store, [cand("ns/a")], target="t", ttl=10))
    await trio.sleep(10 + 599)
    cd = await store.report(g.lease.id, result=Result.BANNED)
    assert cd is not None and cd.target == "t"
    await trio.sleep(1)
    with pytest.raises(UnknownLeaseError):
        await store.report(g.lease.id, result=Result.OK)
    with pytest.raises(UnknownLeaseError):
        await store.report("never-issued", result=Result.OK)


async def test_report_after_release_still_lands(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store()
    g = grant(await acquire(store, [cand("ns/a")], target="t", ttl=60))
    await store.release(g.lease.id)
    assert await store.report(g.lease.id, result=Result.RATE_LIMITED) is not None


async def test_concurrent_acquires_never_overcommit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = make_store()
    granted: list[str] = []

    async def one() -> None:
        await trio.lowlevel.checkpoint()
        r = await acquire(store, [cand("ns/a", 5), cand("ns/b", 0)], target="", ttl=60)
        if isinstance(r, Grant):
            granted.append(r.lease.id)

    async with trio.open_nursery() as nursery:
        for _ in range(200):
            nursery.start_soon(one)
    assert len(granted) == 5
    assert (await store.usage(["ns/a"]))["ns/a"].active_leases == 5


async def test_sweeper_only_collects(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store(cooldown=100)
    before_active = metrics.REGISTRY.get_sample_value("egressd_leases_active") or 0.0
    before_cd = metrics.REGISTRY.get_sample_value("egressd_cooldowns_active") or 0.0
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        g = grant(await acquire(store, [cand("ns/a")], target="t", ttl=10))
        await store.report(g.lease.id, result=Result.RATE_LIMITED, retry_after=50)
        assert metrics.REGISTRY.get_sample_value("egressd_leases_active") == before_active + 1
        assert metrics.REGISTRY.get_sample_value("egressd_cooldowns_active") == before_cd + 1
        assert store.remembered() == 1
        await trio.sleep(60)
        # Lease expired (gauge down), cooldown over and collected; lease still retained.
        assert metrics.REGISTRY.get_sample_value("egressd_leases_active") == before_active
        assert metrics.REGISTRY.get_sample_value("egressd_cooldowns_active") == before_cd
        assert store.cooldowns("ns/a") == {}
        assert store.remembered() == 1
        await trio.sleep(60)
        assert store.remembered() == 0
        nursery.cancel_scope.cancel()


async def test_merge_cooldowns_never_shortens(autojump_clock: trio.testing.MockClock) -> None:
    from egressd.leases import Cooldown

    store = make_store()
    now = trio_wall()
    store.merge_cooldowns([
        Cooldown(key="ns/a", target="", until=now + 100, reason=Result.BANNED),
        Cooldown(key="ns/b", target="t", until=now - 1, reason=Result.BANNED),  # already over
    ])
    store.merge_cooldowns(
        [Cooldown(key="ns/a", target="", until=now + 5, reason=Result.RATE_LIMITED)])
    assert store.cooldowns("ns/a")[""].until == now + 100
    assert store.cooldowns("ns/b") == {}
    assert refusal(await acquire(store, [cand("ns/a")], target="x", ttl=1)).in_cooldown == 1


async def test_selection_among_10000_candidates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The cache offers the fleet once; each acquire takes the best by the same rule.
    store = make_store()
    for i in range(10_000):
        store.put_candidate(cand(f"ns/p{i:05d}", latency=float(10_000 - i)))
    g = grant(await store.acquire({}, target="", ttl=1))
    assert g.lease.key == "ns/p09999"
    assert grant(await store.acquire({}, target="", ttl=1)).lease.key == "ns/p09998"


async def test_proxy_error_starts_no_cooldown_and_counts_once_per_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    counted: list[str] = []
    store = MemoryLeaseStore(cooldown=600.0, ban_cooldown=3600.0, max_cooldown=3600.0,
                             clock=trio_wall, on_proxy_error=counted.append)
    first = grant(await acquire(store, [cand("ns/a")], target="t.example", ttl=60))
    second = grant(await acquire(store, [cand("ns/a")], target="t.example", ttl=60))
    for _ in range(3):
        assert await store.report(first.lease.id, result=Result.PROXY_ERROR) is None
    assert await store.report(second.lease.id, result=Result.PROXY_ERROR,
                              target="t.example", retry_after=30) is None
    # One count per lease however often it is reported, and no cooldown at all.
    assert counted == ["ns/a", "ns/a"]
    assert store.cooldowns("ns/a") == {}
    assert isinstance(await acquire(store, [cand("ns/a")], target="t.example", ttl=60), Grant)
    with pytest.raises(UnknownLeaseError):
        await store.report("never-issued", result=Result.PROXY_ERROR)
    assert counted == ["ns/a", "ns/a"]
    # A store without a handler accepts the outcome too.
    plain = make_store()
    g = grant(await acquire(plain, [cand("ns/b")], target="", ttl=60))
    assert await plain.report(g.lease.id, result=Result.PROXY_ERROR) is None


async def test_selector_terms_and_label_changes(autojump_clock: trio.testing.MockClock) -> None:
    store = make_store()
    eu_dc = Candidate(key="ns/a", max_leases=1, latency_ms=50.0,
                      attributes={"region": "eu", "tier": "dc"})
    store.put_candidate(eu_dc)
    store.put_candidate(Candidate(key="ns/b", max_leases=1, latency_ms=10.0,
                                  attributes={"region": "eu", "tier": "res"}))
    store.put_candidate(Candidate(key="ns/c", max_leases=1, attributes={"region": "us"}))
    assert grant(await store.acquire({"region": "eu", "tier": "dc"}, target="", ttl=60)
                 ).lease.key == "ns/a"
    r = refusal(await store.acquire({"region": "eu", "tier": "dc"}, target="", ttl=60))
    assert (r.considered, r.at_capacity, r.in_cooldown) == (1, 1, 0)
    assert r.retry_after == pytest.approx(60)  # when a's lease ends
    assert grant(await store.acquire({"region": "eu"}, target="", ttl=60)).lease.key == "ns/b"
    assert refusal(await store.acquire({"region": "mars"}, target="", ttl=60)) == Refusal(
        considered=0, at_capacity=0, in_cooldown=0, retry_after=None)
    # c moves to eu: found under its new label, gone from its old one.
    store.put_candidate(Candidate(key="ns/c", max_leases=1, attributes={"region": "eu"}))
    assert refusal(await store.acquire({"region": "us"}, target="", ttl=60)).considered == 0
    assert grant(await store.acquire({"region": "eu"}, target="", ttl=60)).lease.key == "ns/c"
    # Not leasable any more: out of every bucket, its lease still counted.
    store.remove_candidate("ns/a")
    r = refusal(await store.acquire({"tier": "dc"}, target="", ttl=60))
    assert r.considered == 0
    assert (await store.usage(["ns/a"]))["ns/a"].active_leases == 1


async def test_target_cooldowns_are_skipped_and_retry_after_is_the_soonest_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = make_store()
    for i, latency in enumerate([1.0, 2.0, 3.0]):
        store.put_candidate(cand(f"ns/p{i}", max_leases=1, latency=latency))
    # The two fastest are banned by one site for 40 s and 20 s (merged from status).
    now = trio_wall()
    store.merge_cooldowns([
        Cooldown(key="ns/p0", target="shop.example", until=now + 40, reason=Result.BANNED),
        Cooldown(key="ns/p1", target="shop.example", until=now + 20, reason=Result.BANNED),
    ])
    # The walk skips both for that site, and no other site sees them.
    g = grant(await store.acquire({}, target="shop.example", ttl=90))
    assert g.lease.key == "ns/p2"
    r = refusal(await store.acquire({}, target="shop.example", ttl=90))
    assert (r.considered, r.at_capacity, r.in_cooldown) == (3, 1, 2)
    assert r.retry_after == pytest.approx(20)
    assert grant(await store.acquire({}, target="news.example", ttl=90)).lease.key == "ns/p0"
    await trio.sleep(20)
    assert grant(await store.acquire({}, target="shop.example", ttl=90)).lease.key == "ns/p1"
    # Everything full now: the soonest lease end (p2's, 90 s after the first grant).
    r = refusal(await store.acquire({}, target="", ttl=90))
    assert (r.considered, r.at_capacity, r.in_cooldown) == (3, 3, 0)
    assert r.retry_after == pytest.approx(70)


async def test_a_global_cooldown_takes_a_candidate_out_until_it_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = make_store()
    store.put_candidate(cand("ns/a", latency=1.0))
    store.put_candidate(cand("ns/b", max_leases=0))
    g = grant(await store.acquire({}, target="", ttl=60))
    await store.report(g.lease.id, result=Result.RATE_LIMITED, retry_after=30)
    r = refusal(await store.acquire({}, target="x.example", ttl=60))
    # b never frees (maxLeases 0): only a's cooldown end is a Retry-After.
    assert (r.considered, r.at_capacity, r.in_cooldown) == (2, 1, 1)
    assert r.retry_after == pytest.approx(30)
    assert await store.lease(g.lease.id) == g.lease
    await trio.sleep(30)
    # No sweeper and no other call in between: the end is read off the clock.
    assert grant(await store.acquire({}, target="x.example", ttl=60)).lease.key == "ns/a"
    await trio.sleep(30)
    assert await store.lease(g.lease.id) is None  # expired


async def test_cooldowns_per_proxy_are_capped_soonest_ending_evicted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = MemoryLeaseStore(cooldown=600.0, ban_cooldown=3600.0, max_cooldown=3600.0,
                             clock=trio_wall, max_cooldowns_per_proxy=3)
    store.put_candidate(cand("ns/a", max_leases=100))
    evicted = metrics.REGISTRY.get_sample_value("egressd_cooldowns_evicted_total") or 0.0
    g = grant(await store.acquire({}, target="", ttl=600))
    await store.report(g.lease.id, result=Result.BANNED)  # global: never evicted
    for target, seconds in (("t1", 50), ("t2", 10), ("t3", 30)):
        await store.report(g.lease.id, result=Result.RATE_LIMITED, target=target,
                           retry_after=seconds)
    assert set(store.cooldowns("ns/a")) == {"", "t1", "t2", "t3"}
    # A fourth target entry pushes out the one ending soonest (t2), and only it.
    await store.report(g.lease.id, result=Result.RATE_LIMITED, target="t4", retry_after=40)
    assert set(store.cooldowns("ns/a")) == {"", "t1", "t3", "t4"}
    await store.report(g.lease.id, result=Result.RATE_LIMITED, target="t5", retry_after=20)
    assert set(store.cooldowns("ns/a")) == {"", "t1", "t4", "t5"}
    assert metrics.REGISTRY.get_sample_value("egressd_cooldowns_evicted_total") == evicted + 2
    # A lengthened entry is not a new one: nothing is evicted for it.
    await store.report(g.lease.id, result=Result.BANNED, target="t4")
    assert set(store.cooldowns("ns/a")) == {"", "t1", "t4", "t5"}
    # The evicted ones end without a trace (their heap entries are stale).
    await trio.sleep(3600)
    assert store.cooldowns("ns/a") == {}
