"""Leader election on a coordination.k8s.io/v1 Lease, trio-native (docs/architecture.md).

`run_elected` campaigns for the Lease and runs `lead()` only while this
replica holds it, in a child cancel scope: when a renewal cannot be made
within the renew deadline, or the Lease shows another holder, `lead()` is
cancelled before anything else happens (no write after losing) and the
replica campaigns again. Writes use the Lease's resourceVersion (optimistic
concurrency). On cancellation the leader releases the Lease (empty holder,
leaseDurationSeconds 1, like client-go's ReleaseOnCancel) so a standby takes
over at once.

As in client-go, expiry is judged on this replica's own clock: a Lease is
free when its record has not changed for its leaseDurationSeconds since this
replica first saw that record, so clock skew between replicas does not matter.
The leader's renew deadline counts from when its last successful renewal was
*sent*, not answered: a standby can see the write as soon as it lands, so a
slow answer must not stretch this replica's term past the standby's wait.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from egressd import timestamps
from egressd.backoff import Backoff
from egressd.kube.client import KubeClient
from egressd.kube.errors import ApiError, ApiUnavailable, Conflict, NotFound
from egressd.kube.resources import LEASES
from egressd.metrics import LEADER

log = logging.getLogger(__name__)


def _renew_time() -> str:
    # A Lease's times are metav1.MicroTime: always six fraction digits.
    return timestamps.now(precision="micro")


class LeaderElector:
    """One candidate's view of one Lease."""

    def __init__(
        self,
        client: KubeClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self._client = client
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._observed_spec: dict[str, Any] | None = None
        self._observed_at = -math.inf
        self._renewed_at = -math.inf
        self.leading = False
        self.may_hold = False
        """True from the moment a write that takes the Lease is sent until a read shows
        another holder: a write cancelled before its answer may still have landed."""

    @property
    def holder(self) -> str:
        """The holder of the Lease as last seen ("" when free or unknown)."""
        return str((self._observed_spec or {}).get("holderIdentity") or "")

    def _observe(self, lease: dict[str, Any]) -> None:
        spec = dict(lease.get("spec") or {})
        if spec != self._observed_spec:
            if self.holder != str(spec.get("holderIdentity") or ""):
                log.info("lease holder changed",
                         extra={"lease": f"{self.namespace}/{self.name}",
                                "holder": spec.get("holderIdentity") or ""})
            self._observed_spec = spec
            self._observed_at = trio.current_time()
        self.may_hold = self.holder == self.identity

    def _held_by_other(self) -> bool:
        spec = self._observed_spec or {}
        holder = str(spec.get("holderIdentity") or "")
        if not holder or holder == self.identity:
            return False
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        return self._observed_at + duration > trio.current_time()

    def _spec(self, old: dict[str, Any] | None) -> dict[str, Any]:
        now = _renew_time()
        old = old or {}
        same = old.get("holderIdentity") == self.identity
        transitions = int(old.get("leaseTransitions") or 0)
        return {
            **old,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
            "acquireTime": old.get("acquireTime") if same and old.get("acquireTime") else now,
            "renewTime": now,
            "leaseTransitions": transitions if same or not old else transitions + 1,
        }

    async def try_acquire_or_renew(self) -> bool:
        """One attempt to take or keep the Lease; False when someone else holds it.

        On success the attempt's start is kept as the renewal time: it is at
        or before the moment any other replica can have seen the write.
        """
        began = trio.current_time()
        try:
            lease = await self._client.get(LEASES, self.name, namespace=self.namespace)
        except NotFound:
            body = {"metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(None)}
            self.may_hold = True
            try:
                created = await self._client.create(LEASES, body, namespace=self.namespace)
            except Conflict:
                self.may_hold = False
                return False  # another candidate created it first
            self._observe(created)
            self._renewed_at = began
            return True
        self._observe(lease)
        if self._held_by_other():
            return False
        body = {**lease, "spec": self._spec(lease.get("spec"))}
        self.may_hold = True
        try:
            updated = await self._client.replace(LEASES, self.name, body,
                                                 namespace=self.namespace)
        except Conflict:
            self.may_hold = self.holder == self.identity
            return False  # someone wrote since our read; look again next round
        self._observe(updated)
        self._renewed_at = began
        return True

    async def acquire(self) -> None:
        """Return once this replica holds the Lease."""
        while True:
            try:
                if await self.try_acquire_or_renew():
                    return
            except (ApiError, ApiUnavailable) as exc:
                log.warning("acquiring the leader lease failed", extra={"error": str(exc)})
            # client-go's JitterUntil: +0-20 %, so candidates do not knock in step.
            await trio.sleep(Backoff(self.retry_period, self.retry_period,
                                     jitter=(1.0, 1.2)).delay(1))

    async def keep(self) -> None:
        """Renew every retry period; return as soon as leadership is lost.

        Lost means: no successful renewal within the renew deadline (counted
        from when the last successful renewal began, see the module
        docstring), or the Lease seen held by another candidate.
        """
        while True:
            await trio.sleep(self.retry_period)
            renewed = False
            with trio.move_on_at(self._renewed_at + self.renew_deadline):
                while True:
                    try:
                        renewed = await self.try_acquire_or_renew()
                    except (ApiError, ApiUnavailable) as exc:
                        log.warning("renewing the leader lease failed",
                                    extra={"error": str(exc)})
                    if renewed:
                        break
                    if self._held_by_other():
                        log.warning("leader lease taken by another replica",
                                    extra={"holder": self.holder})
                        return
                    await trio.sleep(self.retry_period)
            if not renewed:
                log.warning("leader lease not renewed within the deadline")
                return

    async def release(self) -> None:
        """Give the Lease up (empty holder, 1 s duration) if this replica still holds it."""
        lease = await self._client.get(LEASES, self.name, namespace=self.namespace)
        spec = dict(lease.get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            return
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_renew_time(),
                    acquireTime=_renew_time())
        released = await self._client.replace(
            LEASES, self.name, {**lease, "spec": spec}, namespace=self.namespace)
        self._observe(released)


async def run_elected(
    client: KubeClient,
    *,
    name: str,
    namespace: str,
    identity: str,
    lead: Callable[[], Awaitable[None]],
    lease_duration: float = 15.0,
    renew_deadline: float = 10.0,
    retry_period: float = 2.0,
    release_on_cancel: bool = True,
    release_timeout: float | None = None,
    task_status: trio.TaskStatus[LeaderElector] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Campaign forever; run `lead()` while leading and cancel it on losing.

    Returns when `lead()` returns on its own (after releasing the Lease); an
    exception from `lead()` propagates. `started()` hands back the elector
    (for its `leading` flag) as soon as the campaign begins. The release on the
    way out gets `release_timeout` (default: the renew deadline); the daemon passes
    its shutdown grace, so an unreachable API server cannot hold the stop past it.
    """
    elector = LeaderElector(
        client, name=name, namespace=namespace, identity=identity,
        lease_duration=lease_duration, renew_deadline=renew_deadline, retry_period=retry_period)
    task_status.started(elector)
    try:
        while True:
            await elector.acquire()
            elector.leading = True
            LEADER.set(1)
            log.info("became leader", extra={"lease": f"{namespace}/{name}", "identity": identity})
            finished = False
            async with trio.open_nursery() as nursery:
                async def leading() -> None:
                    nonlocal finished
                    await lead()
                    finished = True
                    nursery.cancel_scope.cancel()

                nursery.start_soon(leading)
                await elector.keep()
                # Lost: no longer leading from this instant; cancel lead()
                # before anything else is written.
                elector.leading = False
                LEADER.set(0)
                nursery.cancel_scope.cancel()
            if finished:
                return
            log.warning("lost leadership", extra={"lease": f"{namespace}/{name}"})
    finally:
        was_leading = elector.leading
        elector.leading = False
        LEADER.set(0)
        # `may_hold` covers a cancel between the acquiring write landing and its answer:
        # not yet leading, but the Lease may name this replica. release() checks first.
        if (was_leading or elector.may_hold) and release_on_cancel:
            # Shutdown (or lead() ended): hand the Lease over now instead of
            # making the standby wait out the lease duration.
            bound = renew_deadline if release_timeout is None else release_timeout
            with trio.CancelScope(shield=True), trio.move_on_after(bound) as release_scope:
                try:
                    await elector.release()
                    log.info("released the leader lease",
                             extra={"lease": f"{namespace}/{name}"})
                except (ApiError, ApiUnavailable) as exc:
                    log.warning("releasing the leader lease failed", extra={"error": str(exc)})
            if release_scope.cancelled_caught:
                log.warning("releasing the leader lease failed",
                            extra={"error": f"no answer within {bound:g} s"})
