"""The reconciler (docs/architecture.md): one level-based pass per Proxy key, one per term.

A pass reads the Proxy (the cache's, or the object its own last write returned:
`OwnWrites`), parses it once, and runs in a fixed shape:

1. the steps build the status the Proxy should show, as a value (`Draft`):
   External (host/port from the endpoint) or Managed (`ManagedSteps`:
   finalizer, cloud-init, instance create / replace / poll, address);
2. `sync_health` makes the health engine probe exactly the target that status
   advertises (or nothing) and puts the engine's verdict in the draft;
3. one merge patch of the status subresource, only if the draft differs from
   what the object shows, never touching `status.cooldowns` (the lease
   layer's);
4. for a Managed Proxy being deleted, after that write: delete the instance,
   drop the finalizer (`ManagedSteps.release`).

Every pass names its own follow-up (provisioning poll, ready resync,
immediate retry, quota retry, backoff; none for a latched failure), which
the worker loop (`worker.py`) schedules on the work queue.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime

import attrs
import trio

from egressd.control.draft import Draft, Stop
from egressd.control.managed import ManagedSteps
from egressd.control.ownwrites import OwnWrites
from egressd.control.probing import sync_health
from egressd.control.queue import WorkQueue
from egressd.control.status import REASON_EXTERNAL, compute_phase
from egressd.control.worker import (
    RESULT_CONFLICT,
    RESULT_ERROR,
    RESULT_GONE,
    RESULT_INVALID,
    Outcome,
    process,
    run_workers,
)
from egressd.health.engine import HealthEngine
from egressd.kube import errors as kube_errors
from egressd.kube.client import KubeClient
from egressd.kube.events import EventRecorder
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES
from egressd.metrics import PROXIES as PROXIES_GAUGE
from egressd.model.constants import Mode, Phase
from egressd.model.convert import ModelError, parse_proxy, unstructure_status
from egressd.model.helpers import effective_port
from egressd.model.proxy import ProxyStatus
from egressd.providers.registry import ProviderRegistry
from egressd.settings import Settings

log = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _comparable(status: ProxyStatus) -> ProxyStatus:
    return attrs.evolve(status, cooldowns={})


class Reconciler:
    """Drives Proxies to their spec; one per leadership term (docs/architecture.md)."""

    def __init__(
        self, *, client: KubeClient, proxies: Informer, secrets: Informer,
        providers: ProviderRegistry, engine: HealthEngine, queue: WorkQueue[str],
        events: EventRecorder, settings: Settings,
        wall_clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        """`wall_clock` stamps condition transition times (UTC)."""
        self._client = client
        self._proxies = proxies
        self._engine = engine
        self._queue = queue
        self._settings = settings
        self._wall_clock = wall_clock
        self._managed = ManagedSteps(client=client, secrets=secrets, providers=providers,
                                     events=events, settings=settings)
        self._own = OwnWrites()
        # The phase each key counts under in the PROXIES gauge (kept per key,
        # so the gauge never needs a scan of the fleet).
        self._phases: dict[str, Phase] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run `settings.workers` workers until cancelled; enqueue every cached key at start
        (so each term re-evaluates every Proxy, conditions of a former term included)."""
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(
                    run_workers, self._queue, self.reconcile, count=self._settings.workers))
                await self._proxies.synced.wait()
                for key in self._proxies.keys():  # noqa: SIM118 - no __iter__
                    self._queue.add(key)
                task_status.started()
        finally:
            # The gauge is process-wide; a lost term must not leave its counts.
            for phase in self._phases.values():
                PROXIES_GAUGE.labels(phase=phase.value).dec()
            self._phases.clear()

    async def reconcile(self, key: str) -> None:
        """One pass over `key`; schedules its own follow-up on the queue. Never raises
        (except Cancelled): an unexpected error is logged and retried with backoff."""
        await process(self._queue, key, self._pass)

    async def _pass(self, key: str) -> Outcome:
        raw, superseded = self._own.fresh(key, self._proxies.get(key))
        if raw is None:
            sync_health(self._engine, key, None)
            self._set_phase(key, None)
            return Outcome(RESULT_GONE)
        try:
            proxy = parse_proxy(raw)
        except ModelError as exc:
            # The CRD should have refused it (an older, looser CRD may not). A
            # fixed spec enqueues a pass; a fixed status or metadata does not
            # (`needs_pass`), so the resync looks again.
            log.error("proxy does not fit the model", extra={"proxy": key, "error": str(exc)})
            return Outcome(RESULT_INVALID, after=self._settings.ready_resync)
        d = Draft.start(key, raw, proxy, now=self._wall_clock(), superseded=superseded)
        try:
            outcome = await self._drive(d)
        except kube_errors.Conflict:
            outcome = Outcome(RESULT_CONFLICT, after=self._settings.immediate_retry)
        except kube_errors.NotFound:
            return Outcome(RESULT_GONE)  # deleted under us; its delete event follows
        except (kube_errors.ApiError, kube_errors.ApiUnavailable) as exc:
            log.warning("API call failed, retrying", extra={"proxy": key, "error": str(exc)})
            outcome = Outcome(RESULT_ERROR, rate_limited=True)
        if d.superseded - superseded:
            self._own.wrote(key, frozenset(d.superseded), d.raw)
        self._set_phase(key, d.status.phase)
        return outcome

    async def _drive(self, d: Draft) -> Outcome:
        """The steps, then the health sync and the one status write, in that order."""
        managed = d.proxy.spec.mode is Mode.MANAGED
        try:
            if d.deleting:
                outcome = Outcome()
            elif managed:
                outcome = await self._managed.drive(d)
            else:
                outcome = self._external(d)
        except Stop as stop:
            outcome = stop.outcome
        sync_health(self._engine, d.key, d)
        await self._write_status(d)
        if managed and d.deleting:
            # Only after the Deleting status: once the finalizer goes, so does the object.
            return await self._managed.release(d)
        return outcome

    def _external(self, d: Draft) -> Outcome:
        """External: finalizer-free, Provisioned=True, host/port from the endpoint."""
        endpoint = d.proxy.spec.endpoint
        host = endpoint.host if endpoint is not None else None
        d.status = attrs.evolve(d.status, provider_id=None)
        d.address(ip=None, host=host, port=effective_port(d.proxy))
        d.provisioned(True, REASON_EXTERNAL, f"external proxy at {host}")
        return Outcome(after=self._settings.ready_resync)

    async def _write_status(self, d: Draft) -> None:
        """The pass's one status write: a merge patch, only if something changed."""
        d.status = attrs.evolve(d.status, observed_generation=d.generation, phase=compute_phase(
            d.status.conditions, generation=d.generation, deleting=d.deleting))
        if _comparable(d.status) == _comparable(d.observed):
            return
        wire = unstructure_status(d.status)
        del wire["cooldowns"]  # the lease layer's (docs/reference.md): never written here
        meta = d.proxy.metadata
        d.written(await self._client.patch_status(PROXIES, meta.name, {"status": wire},
                                                  namespace=meta.namespace))

    def _set_phase(self, key: str, phase: Phase | None) -> None:
        old = self._phases.get(key)
        if old is phase:
            return
        if old is not None:
            PROXIES_GAUGE.labels(phase=old.value).dec()
            del self._phases[key]
        if phase is not None:
            PROXIES_GAUGE.labels(phase=phase.value).inc()
            self._phases[key] = phase
