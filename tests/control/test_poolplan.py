"""The pool controller's pure plan (egressd/control/poolplan.py): scale up and down,
the rollout's availability bound, draining, ReplicaFailure and its backoff, the
provider check, adoption, External endpoints; and the PoolMembers index."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from egressd.control.poolfeed import PoolMembers, pool_of
from egressd.control.poolplan import Member, Plan, plan, template_hash
from egressd.model.constants import POOL_LABEL
from egressd.model.convert import parse_pool, parse_proxy
from egressd.model.pool import ProxyPool

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def make_pool(**spec: Any) -> ProxyPool:
    body: dict[str, Any] = {"template": {"spec": {"mode": "Managed", "provider": "local"}},
                            "replicas": 3, **spec}
    return parse_pool({"metadata": {"name": "eu", "namespace": "default", "uid": "u1",
                                    "generation": 1},
                       "spec": body, "status": {"observedGeneration": 1}})


def member(name: str, *, ready: bool = True, age: int = 600, hash: str | None = None,
           pool: ProxyPool | None = None, draining: int | None = None, leases: int = 0,
           failed: str | None = None, owned: bool = True, ready_once: bool | None = None
           ) -> Member:
    status: dict[str, Any] = {}
    if ready:
        status = {"phase": "Ready"}
    elif failed:
        status = {"phase": "Unhealthy", "conditions": [{
            "type": "Healthy", "status": "False", "reason": "ProbeFailed", "message": failed,
            "lastTransitionTime": "2026-12-01T11:00:00Z"}]}
    created = NOW - timedelta(seconds=age)
    proxy = parse_proxy({"metadata": {"name": name, "namespace": "default",
                                      "creationTimestamp": created.isoformat()},
                         "spec": {"mode": "Managed", "provider": "local"}, "status": status})
    return Member(proxy=proxy, owned=owned,
                  hash=hash if hash is not None else template_hash(pool or make_pool()),
                  draining_since=NOW - timedelta(seconds=draining) if draining is not None
                  else None,
                  ready_once=ready if ready_once is None else ready_once,
                  active_leases=leases)


def run(pool: ProxyPool, members: list[Member], *, provider_ok: bool = True,
        now: datetime = NOW, failure_since: datetime | None = None) -> Plan:
    return plan(pool, members, now=now, provider_ok=provider_ok, failure_since=failure_since)


def test_scale_up_from_nothing_creates_the_desired_count() -> None:
    result = run(make_pool(), [])
    assert result.creates == (None, None, None)
    assert (result.desired, result.current) == (3, 0)


def test_scale_down_drains_not_ready_first_then_the_newest() -> None:
    members = [member("a", age=900), member("b", age=100), member("c", age=500),
               member("d", ready=False, ready_once=True, age=800)]
    result = run(make_pool(replicas=2), members)
    assert sorted(result.drain) == ["b", "d"]
    assert result.creates == ()


def test_a_rollout_surges_first_and_keeps_every_ready_proxy_with_max_unavailable_0() -> None:
    pool = make_pool(maxUnavailable=0, maxSurge=1)
    old = [member(n, hash="old", age=1000 + i) for i, n in enumerate("abc")]
    first = run(pool, old)
    assert first.creates == (None,) and first.drain == ()
    # the surge Proxy is up but not Ready yet: nothing old goes
    pending = member("n1", ready=False, ready_once=False, age=5)
    assert run(pool, [*old, pending]).drain == ()
    # once it is Ready, one old Proxy (the oldest) drains, and one more new is made
    second = run(pool, [*old, member("n1", age=5)])
    assert second.drain == ("c",)
    assert second.ready >= 3


def test_the_availability_bound_holds_at_every_step_of_a_rollout() -> None:
    pool = make_pool(replicas=4, maxUnavailable=1, maxSurge=1)
    members = {n: member(n, hash="old", age=1000 + i) for i, n in enumerate("abcd")}
    made = 0
    for _ in range(20):
        result = run(pool, list(members.values()))
        for name in result.drain:
            members.pop(name)
        assert sum(1 for m in members.values() if m.ready) >= 4 - 1
        assert len(members) <= 4 + 1
        for _created in result.creates:
            made += 1
            members[f"n{made}"] = member(f"n{made}", age=0)  # Ready at once, next pass
        if all(m.hash == template_hash(pool) for m in members.values()) \
                and len(members) == 4:
            break
    else:
        raise AssertionError(f"the rollout did not finish: {sorted(members)}")


def test_a_draining_proxy_waits_for_its_leases_until_the_timeout() -> None:
    pool = make_pool(replicas=1, drainTimeoutSeconds=600)
    busy = member("old", draining=30, leases=2)
    result = run(pool, [member("a"), busy])
    assert result.delete == () and result.draining == 1
    assert result.requeue is not None and result.requeue <= 5
    assert run(pool, [member("a"), member("old", draining=30, leases=0)]).delete == ("old",)
    assert run(pool, [member("a"), member("old", draining=601, leases=2)]).delete == ("old",)


def test_replica_failure_latches_then_retries_one_after_the_backoff() -> None:
    pool = make_pool(replicas=2, failureThreshold=3)
    bad = [member(f"f{i}", ready=False, failed="CONNECT refused: 403 from squid", age=10 + i)
           for i in range(3)]
    result = run(pool, bad)
    assert result.failed_creates == 3 and sorted(result.delete) == ["f0", "f1", "f2"]
    assert "403 from squid" in (result.last_error or "")
    assert result.creates == ()
    latched = parse_pool({**_wire(pool), "status": {"observedGeneration": 1,
                                                     "failedCreates": 3}})
    assert run(latched, [], failure_since=NOW).creates == ()
    later = NOW + timedelta(seconds=31)
    assert run(latched, [], now=later, failure_since=NOW).creates == (None,)
    # a Proxy that becomes Ready resets the count
    fine = member("ok", ready=True, ready_once=False)
    assert run(latched, [fine], failure_since=NOW).failed_creates == 0


def _wire(pool: ProxyPool) -> dict[str, Any]:
    from egressd.model.convert import unstructure

    wire: dict[str, Any] = unstructure(pool)
    return wire


def test_a_new_generation_clears_the_failure_count() -> None:
    wire = _wire(make_pool())
    wire["metadata"]["generation"] = 2
    wire["status"] = {"observedGeneration": 1, "failedCreates": 5}
    assert run(parse_pool(wire), []).failed_creates == 0


def test_an_unconfigured_provider_creates_nothing() -> None:
    assert run(make_pool(), [], provider_ok=False).creates == ()


def test_orphans_are_adopted_and_other_controllers_left_alone() -> None:
    orphan = member("o", owned=False)
    foreign_proxy = parse_proxy({"metadata": {"name": "x", "ownerReferences": [{
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool", "name": "other",
        "uid": "u2", "controller": True}]}, "spec": {"mode": "Managed", "provider": "p"}})
    foreign = Member(proxy=foreign_proxy, owned=False, hash=None, draining_since=None,
                     ready_once=False)
    result = run(make_pool(), [orphan, foreign])
    assert result.adopt == ("o",)
    assert "x" not in result.drain + result.delete


def test_an_external_pool_makes_one_proxy_per_endpoint() -> None:
    pool = parse_pool({"metadata": {"name": "v", "generation": 1},
                       "spec": {"template": {"spec": {"mode": "External"}},
                                "endpoints": [{"host": "203.0.113.1"},
                                              {"host": "203.0.113.2", "port": 8080}]}})
    result = run(pool, [])
    assert [e.host if e else None for e in result.creates] == ["203.0.113.1", "203.0.113.2"]
    assert result.desired == 2


def test_pool_members_index_follows_labels_and_owners() -> None:
    members = PoolMembers()
    labelled = {"metadata": {"name": "p1", "namespace": "ns", "labels": {POOL_LABEL: "eu"}}}
    assert pool_of(labelled) == "ns/eu"
    members.set("ns/p1", pool_of(labelled))
    members.set("ns/p2", "ns/eu")
    assert list(members.of("ns/eu")) == ["ns/p1", "ns/p2"]
    members.set("ns/p1", None)
    assert list(members.of("ns/eu")) == ["ns/p2"]
    owned_elsewhere = {"metadata": {"name": "p3", "namespace": "ns",
                                    "labels": {POOL_LABEL: "eu"},
                                    "ownerReferences": [{"kind": "ReplicaSet", "name": "r",
                                                         "controller": True}]}}
    assert pool_of(owned_elsewhere) is None
