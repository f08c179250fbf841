"""Lease leader election against the fake API server, with short real durations."""

from __future__ import annotations

import datetime
import functools
from typing import Any

import httpx
import pytest
import trio

from egressd.kube.client import KubeClient
from egressd.kube.config import KubeConfig
from egressd.kube.election import LeaderElector, run_elected
from egressd.kube.resources import LEASES
from egressd.metrics import REGISTRY
from egressd.sandbox.apiserver import FakeApiServer
from tests.fixtures.kube import hooked_client

# Short real durations: HTTP and MockClock do not mix. retry < renew < lease.
FAST = {"lease_duration": 1.0, "renew_deadline": 0.6, "retry_period": 0.1}


def lease_spec(apiserver: FakeApiServer) -> dict[str, Any]:
    lease = apiserver.get("coordination.k8s.io/v1", "Lease", "egressd", namespace="default")
    assert lease is not None
    return dict(lease["spec"])


def parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


class Candidate:
    """One replica: `lead()` records when it starts and stops."""

    def __init__(self, client: KubeClient, identity: str, **timings: Any) -> None:
        self.client = client
        self.identity = identity
        self.timings = {**FAST, **timings}
        self.leading = trio.Event()
        self.stopped = trio.Event()
        self.terms = 0
        self.scope = trio.CancelScope()
        self.finished = trio.Event()
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    async def lead(self) -> None:
        self.terms += 1
        self.stopped = trio.Event()
        self.started_at = trio.current_time()
        self.leading.set()
        try:
            await trio.sleep_forever()
        finally:
            self.stopped_at = trio.current_time()
            self.leading = trio.Event()
            self.stopped.set()

    async def run(self, *, release_on_cancel: bool = True,
                  task_status: trio.TaskStatus[LeaderElector] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        with self.scope:
            await run_elected(
                self.client, name="egressd", namespace="default", identity=self.identity,
                lead=self.lead, release_on_cancel=release_on_cancel, task_status=task_status,
                **self.timings)
        self.finished.set()


def leader_metric() -> float | None:
    return REGISTRY.get_sample_value("egressd_leader")


async def test_leads_then_releases_on_cancel(kube_client: KubeClient, apiserver: FakeApiServer,
                                             nursery: trio.Nursery) -> None:
    a = Candidate(kube_client, "a")
    with trio.fail_after(10):
        elector = await nursery.start(a.run)
        await a.leading.wait()
        assert elector.leading
        assert leader_metric() == 1
        spec = lease_spec(apiserver)
        assert spec["holderIdentity"] == "a"
        assert spec["leaseDurationSeconds"] == 1
        a.scope.cancel()
        # The release is written before run_elected returns.
        await a.finished.wait()
    released = lease_spec(apiserver)
    assert released["holderIdentity"] == ""
    assert released["leaseDurationSeconds"] == 1
    assert leader_metric() == 0


async def test_standby_takes_over_at_once_after_a_release(
    kube_client: KubeClient, apiserver: FakeApiServer, nursery: trio.Nursery
) -> None:
    # A long lease: without the release, b would wait 30 s.
    a = Candidate(kube_client, "a", lease_duration=30.0, renew_deadline=5.0)
    b = Candidate(kube_client, "b", lease_duration=30.0, renew_deadline=5.0)
    with trio.fail_after(10):
        await nursery.start(a.run)
        await a.leading.wait()
        await nursery.start(b.run)
        a.scope.cancel()
        await b.leading.wait()
    spec = lease_spec(apiserver)
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] >= 1


async def test_standby_takes_over_after_the_lease_duration(
    kube_client: KubeClient, apiserver: FakeApiServer, nursery: trio.Nursery
) -> None:
    a = Candidate(kube_client, "a")
    b = Candidate(kube_client, "b")
    with trio.fail_after(10):
        await nursery.start(functools.partial(a.run, release_on_cancel=False))
        await a.leading.wait()
        await nursery.start(b.run)
        a.scope.cancel()  # a crash: no release
        await a.stopped.wait()
        last_renewal = parse_time(lease_spec(apiserver)["renewTime"])
        assert lease_spec(apiserver)["holderIdentity"] == "a"
        await b.leading.wait()
    taken = parse_time(lease_spec(apiserver)["acquireTime"])
    assert lease_spec(apiserver)["holderIdentity"] == "b"
    # b waited out a's lease on its own clock before taking it.
    assert (taken - last_renewal).total_seconds() >= FAST["lease_duration"]


async def test_losing_the_lease_cancels_lead_and_stops_writing(
    kube_client: KubeClient, apiserver: FakeApiServer, nursery: trio.Nursery
) -> None:
    a = Candidate(kube_client, "a")
    with trio.fail_after(10):
        elector = await nursery.start(a.run)
        await a.leading.wait()
        lease = await kube_client.get(LEASES, "egressd", namespace="default")
        lease["spec"].update(holderIdentity="intruder", leaseDurationSeconds=60)
        taken = await kube_client.replace(LEASES, "egressd", lease, namespace="default")
        await a.stopped.wait()
        assert not elector.leading
        assert leader_metric() == 0
        # a keeps campaigning but never writes over a valid Lease.
        await trio.sleep(5 * FAST["retry_period"])
        now = await kube_client.get(LEASES, "egressd", namespace="default")
        assert now["metadata"]["resourceVersion"] == taken["metadata"]["resourceVersion"]
        assert a.terms == 1


async def test_failing_renewals_step_down_then_campaign_again(
    kube_client: KubeClient, apiserver: FakeApiServer, nursery: trio.Nursery
) -> None:
    a = Candidate(kube_client, "a")
    with trio.fail_after(10):
        await nursery.start(a.run)
        await a.leading.wait()
        apiserver.faults.fail_next(10_000, code=500, resource="leases")
        await a.stopped.wait()  # within the renew deadline
        apiserver.faults.clear()
        await a.leading.wait()
        assert a.terms == 2


async def test_lead_returning_releases_and_returns(kube_client: KubeClient,
                                                   apiserver: FakeApiServer) -> None:
    ran = []

    async def lead() -> None:
        ran.append(True)

    with trio.fail_after(10):
        await run_elected(kube_client, name="egressd", namespace="default", identity="a",
                          lead=lead, **FAST)
    assert ran == [True]
    assert lease_spec(apiserver)["holderIdentity"] == ""


async def test_racing_candidates_only_one_wins(kube_client: KubeClient,
                                              apiserver: FakeApiServer) -> None:
    # All reads happen before any write: only optimistic concurrency (the
    # create's name clash, the update's resourceVersion) keeps it to one.
    async def race() -> dict[str, bool]:
        electors = [LeaderElector(kube_client, name="egressd", namespace="default",
                                  identity=f"c{i}", **FAST) for i in range(5)]
        won: dict[str, bool] = {}

        async def attempt(elector: LeaderElector) -> None:
            won[elector.identity] = await elector.try_acquire_or_renew()

        async with trio.open_nursery() as nursery:
            for elector in electors:
                nursery.start_soon(attempt, elector)
        return won

    with trio.fail_after(10):
        created = await race()  # no Lease yet: every candidate creates
        assert sum(created.values()) == 1
        assert lease_spec(apiserver)["holderIdentity"] == next(
            who for who, ok in created.items() if ok)
        lease = await kube_client.get(LEASES, "egressd", namespace="default")
        lease["spec"].update(holderIdentity="", leaseDurationSeconds=1)
        await kube_client.replace(LEASES, "egressd", lease, namespace="default")
        updated = await race()  # a free Lease: every candidate updates it
        assert sum(updated.values()) == 1
        assert lease_spec(apiserver)["holderIdentity"] == next(
            who for who, ok in updated.items() if ok)


async def test_renew_deadline_counts_from_the_request_not_the_answer(
    kube_client: KubeClient, kube_config: KubeConfig, nursery: trio.Nursery
) -> None:
    # a's renewal lands at once but its answer takes 0.6 s, then a is cut off
    # from the API. b sees the write when it lands and takes over one lease
    # duration later; a must have stopped leading by then.
    timings = {"lease_duration": 1.0, "renew_deadline": 0.9, "retry_period": 0.1}
    slow_put = False
    partitioned = trio.Event()

    async def hold_back(request: httpx.Request) -> None:
        if partitioned.is_set():
            await trio.sleep_forever()

    async def slow_answer(response: httpx.Response) -> None:
        nonlocal slow_put
        if slow_put and response.request.method == "PUT":
            slow_put = False
            partitioned.set()
            await trio.sleep(0.6)

    with trio.fail_after(10):
        async with hooked_client(kube_config, on_request=[hold_back],
                                 on_response=[slow_answer]) as a_client:
            a = Candidate(a_client, "a", **timings)
            b = Candidate(kube_client, "b", **timings)
            await nursery.start(a.run)
            await a.leading.wait()
            await nursery.start(b.run)
            slow_put = True
            await b.leading.wait()
            assert a.stopped_at is not None and b.started_at is not None
            assert partitioned.is_set()
            assert a.stopped_at <= b.started_at
            a.scope.cancel()
            b.scope.cancel()
            # a may still hold the Lease as far as it knows, so it tries a release,
            # bounded by its renew deadline: let it finish before its client closes.
            await a.finished.wait()


def test_timings_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_duration"):
        LeaderElector(None, name="x", namespace="y", identity="z",  # type: ignore[arg-type]
                      lease_duration=1.0, renew_deadline=2.0, retry_period=0.1)


async def test_cancel_while_the_acquiring_write_is_unanswered_still_releases(
    kube_config: KubeConfig, apiserver: FakeApiServer, nursery: trio.Nursery
) -> None:
    # The Lease is created on the server, but its answer is held back: the candidate
    # never learns it leads. Cancelled in that window, it must still hand the Lease
    # back, or a standby waits out the whole lease duration.
    write_landed = trio.Event()
    hold = trio.Event()

    async def hold_lease_writes(response: httpx.Response) -> None:
        if response.request.method in ("POST", "PUT") and "/leases" in str(response.url):
            write_landed.set()
            await hold.wait()

    async with hooked_client(kube_config, on_response=[hold_lease_writes]) as client:
        a = Candidate(client, "a", lease_duration=30.0, renew_deadline=20.0)
        with trio.fail_after(10):
            await nursery.start(a.run)
            await write_landed.wait()
            assert lease_spec(apiserver)["holderIdentity"] == "a"
            assert not a.leading.is_set()
            a.scope.cancel()  # delivered to the held hook at once
            hold.set()  # later answers (the release's) flow again
            await a.finished.wait()
    assert lease_spec(apiserver)["holderIdentity"] == ""
