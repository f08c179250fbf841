"""The reconciler (SPEC §5): one level-based pass per Proxy key, run by N workers.

`feed_queue` turns Proxy and Secret events into work-queue keys (once per
process); a `Reconciler` (one per leadership term) runs workers that take a
key, read the Proxy from the informer cache and drive it one step towards its
spec: finalizer, cloud-init, instance (create / replace / poll), address,
health verdict. Each pass builds the status it wants as a value and writes it
with at most one merge patch of the status subresource, only if it differs
from what the object shows, and never touches `status.cooldowns` (the lease
layer owns it). Metadata (finalizer, spec-hash annotation) is written with
merge patches before the status, and the status draft is kept apart from the
objects those patches return, so a metadata write can never clobber a staged
status change (the Go prototype's bug, seeds Step 4).

Re-adds: every pass schedules its own follow-up on the queue (provisioning
poll, ready resync, immediate retry, quota retry, per-key backoff), and a
permanent failure schedules none until the generation moves.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import attrs
import trio

from egressd.control.queue import QueueShutDown, WorkQueue
from egressd.control.spechash import spec_hash
from egressd.control.status import (
    REASON_CLOUD_INIT_UNRESOLVED,
    REASON_CREATING,
    REASON_EXTERNAL,
    REASON_INSTANCE_MISSING,
    REASON_INSTANCE_STOPPED,
    REASON_INVALID_HEALTH_CHECK,
    REASON_PERMANENT_FAILURE,
    REASON_PROBE_FAILED,
    REASON_PROBE_SUCCEEDED,
    REASON_PROVISIONING,
    REASON_QUOTA_EXCEEDED,
    REASON_REPLACING,
    REASON_RUNNING,
    compute_phase,
    is_failed,
    remove_condition,
    set_condition,
)
from egressd.health.engine import HealthEngine, Verdict
from egressd.health.probe import ProbeTarget
from egressd.kube import errors as kube_errors
from egressd.kube.client import KubeClient
from egressd.kube.events import NORMAL, WARNING, EventRecorder
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES, object_key
from egressd.metrics import PROXIES as PROXIES_GAUGE
from egressd.metrics import RECONCILE_DURATION, RECONCILES
from egressd.model.constants import (
    CLOUD_INIT_LABEL,
    COND_HEALTHY,
    COND_PROVISIONED,
    FINALIZER,
    SPEC_HASH_ANNOTATION,
    STATUS_FALSE,
    STATUS_TRUE,
    Mode,
    Phase,
)
from egressd.model.convert import ModelError, parse_proxy, unstructure_status
from egressd.model.helpers import effective_port
from egressd.model.proxy import Condition, Proxy, ProxyStatus
from egressd.providers import (
    CreateRequest,
    Instance,
    InstanceState,
    Provider,
    gc_labels,
    instance_name,
    is_not_found,
    is_permanent,
    is_quota,
)
from egressd.providers import Placement as InstancePlacement
from egressd.providers.registry import ProviderRegistry
from egressd.settings import Settings

log = logging.getLogger(__name__)

Obj = dict[str, Any]
T = TypeVar("T")

# RECONCILES{result} values.
RESULT_OK = "ok"
RESULT_ERROR = "error"
RESULT_PERMANENT = "permanent"
RESULT_QUOTA = "quota"
RESULT_CONFLICT = "conflict"
RESULT_INVALID = "invalid"
RESULT_GONE = "gone"

# Event reasons (SPEC §5: created, replaced, deleted, failed).
EVENT_CREATED = "Created"
EVENT_REPLACED = "Replaced"
EVENT_DELETED = "Deleted"
EVENT_FAILED = "Failed"
EVENT_QUOTA = "QuotaExceeded"
EVENT_PROVIDER_ERROR = "ProviderError"
EVENT_DELETE_FAILED = "DeleteFailed"
EVENT_INSTANCE_MISSING = "InstanceMissing"
EVENT_INSTANCE_STOPPED = "InstanceStopped"
EVENT_CLOUD_INIT = "CloudInitUnresolved"


def _utcnow() -> datetime:
    return datetime.now(UTC)


# --- feeding the queue -------------------------------------------------------


def secret_ref_key(obj: Obj) -> str | None:
    """`namespace/name` of the Secret a raw Proxy takes its cloud-init from, if any."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    cloud_init = spec.get("cloudInit") if isinstance(spec, dict) else None
    ref = cloud_init.get("secretRef") if isinstance(cloud_init, dict) else None
    name = ref.get("name") if isinstance(ref, dict) else None
    if not isinstance(name, str) or not name:
        return None
    return f"{meta.get('namespace') or ''}/{name}"


class SecretRefIndex:
    """Secret key → the Proxy keys whose cloud-init names it, kept from Proxy events.

    A Secret event then costs O(its referrers), never a scan of the fleet.
    """

    def __init__(self) -> None:
        self._by_secret: dict[str, set[str]] = {}
        self._by_proxy: dict[str, str] = {}

    def set(self, proxy_key: str, secret_key: str | None) -> None:
        """Record that `proxy_key` refers to `secret_key` (None: to no Secret)."""
        old = self._by_proxy.get(proxy_key)
        if old == secret_key:
            return
        if old is not None:
            referrers = self._by_secret[old]
            referrers.discard(proxy_key)
            if not referrers:
                del self._by_secret[old]
            del self._by_proxy[proxy_key]
        if secret_key is not None:
            self._by_proxy[proxy_key] = secret_key
            self._by_secret.setdefault(secret_key, set()).add(proxy_key)

    def referrers(self, secret_key: str) -> frozenset[str]:
        """The Proxy keys that take their cloud-init from `secret_key`."""
        return frozenset(self._by_secret.get(secret_key, ()))


def _generation(obj: Obj) -> object:
    return (obj.get("metadata") or {}).get("generation")


def _deletion(obj: Obj) -> object:
    return (obj.get("metadata") or {}).get("deletionTimestamp")


def needs_pass(old: Obj, new: Obj) -> bool:
    """Whether an update needs a pass now: the spec (generation) moved, or deletion began.

    Every other update is the reconciler's own write (finalizer, annotation,
    status), a health verdict it wrote or the lease layer's cooldowns. Reacting
    to them would undo the delay a pass scheduled (a quota retry in 5 min
    would become immediate, its own finalizer patch re-queuing the key); what
    else a user edits is seen at the next scheduled pass or resync.
    """
    return _generation(old) != _generation(new) or _deletion(old) != _deletion(new)


def feed_queue(queue: WorkQueue[str], *, proxies: Informer, secrets: Informer) -> None:
    """Register the informer handlers that enqueue Proxy keys (once per process).

    Proxy add/delete enqueue the Proxy, and so does an update that moves the
    generation or starts the deletion (`needs_pass`);
    a Secret event enqueues every Proxy whose `spec.cloudInit.secretRef`
    names that Secret.
    """
    index = SecretRefIndex()

    def proxy_seen(obj: Obj) -> None:
        key = object_key(obj)
        index.set(key, secret_ref_key(obj))
        queue.add(key)

    def proxy_gone(obj: Obj) -> None:
        key = object_key(obj)
        index.set(key, None)
        queue.add(key)

    def secret_changed(secret_key: str) -> None:
        for key in index.referrers(secret_key):
            queue.add(key)

    def proxy_updated(old: Obj, new: Obj) -> None:
        if needs_pass(old, new):
            proxy_seen(new)

    proxies.add_handler(on_add=proxy_seen, on_update=proxy_updated, on_delete=proxy_gone)
    secrets.add_key_handler(secret_changed)


# --- one pass ----------------------------------------------------------------


@attrs.frozen
class _Next:
    """How a pass ends: its metric result and the follow-up it schedules."""

    result: str = RESULT_OK
    after: float | None = None
    rate_limited: bool = False


class _Stop(Exception):
    """Ends a pass early with an outcome; the status draft is still written."""

    def __init__(self, outcome: _Next) -> None:
        super().__init__(outcome.result)
        self.outcome = outcome


class _Unresolved(Exception):
    """The cloud-init's Secret or key is missing or unreadable (message says which)."""


@attrs.define
class _Pass:
    """The state of one pass: the latest object seen and the status being built.

    `draft` is built from the status the pass started with and is never
    replaced by what a metadata patch returns; `observed` is the newest status
    the server showed, what the draft is compared against before writing.
    """

    key: str
    raw: Obj
    proxy: Proxy
    draft: ProxyStatus
    observed: ProxyStatus
    now: datetime
    # Versions of the object this pass's writes replaced (see Reconciler._fresh).
    superseded: set[str] = attrs.field(factory=set)

    @property
    def generation(self) -> int:
        return self.proxy.metadata.generation

    def seen(self, raw: Obj) -> None:
        """A newer object came back from a write: keep its metadata, never its status
        over the draft."""
        self.superseded.add(self.proxy.metadata.resource_version)
        self.raw = raw
        self.proxy = parse_proxy(raw)
        self.observed = self.proxy.status

    def condition(self, type: str, status: str, reason: str, message: str = "") -> None:
        self.draft = _with_conditions(self.draft, set_condition(
            self.draft.conditions, type, status=status, reason=reason, message=message,
            generation=self.generation, now=self.now))

    def provisioned(self, ok: bool, reason: str, message: str = "") -> None:
        self.condition(COND_PROVISIONED, STATUS_TRUE if ok else STATUS_FALSE, reason, message)

    def clear_health(self) -> None:
        """Forget the verdict: a new or missing instance must not wear the old one's."""
        self.draft = attrs.evolve(
            _with_conditions(self.draft, remove_condition(self.draft.conditions, COND_HEALTHY)),
            latency_ms=None, last_health_check_time=None)

    def clear_address(self) -> None:
        self.draft = attrs.evolve(self.draft, ip=None, host=None, port=None)

    def clear_instance(self) -> None:
        self.draft = attrs.evolve(self.draft, provider_id=None)
        self.clear_address()
        self.clear_health()


def _with_conditions(status: ProxyStatus, conditions: tuple[Condition, ...]) -> ProxyStatus:
    # attrs' evolve() signature takes the converter's input type, which mypy
    # cannot spell for `converter=tuple`.
    changes: dict[str, Any] = {"conditions": conditions}
    return attrs.evolve(status, **changes)


def _comparable(status: ProxyStatus) -> ProxyStatus:
    return attrs.evolve(status, cooldowns={})


def _seed(status: ProxyStatus) -> Verdict | None:
    """The verdict a status already shows, to seed the health engine after a restart."""
    cond = status.condition(COND_HEALTHY)
    if cond is None or cond.status not in (STATUS_TRUE, STATUS_FALSE):
        return None
    if cond.reason == REASON_INVALID_HEALTH_CHECK:
        return None
    return Verdict(healthy=cond.status == STATUS_TRUE,
                   latency_ms=status.latency_ms if cond.status == STATUS_TRUE else None,
                   checked_at=status.last_health_check_time or cond.last_transition_time,
                   reason=cond.message)


class Reconciler:
    """Drives Proxies to their spec; one per leadership term (SPEC §5)."""

    def __init__(
        self, *, client: KubeClient, proxies: Informer, secrets: Informer,
        providers: ProviderRegistry, engine: HealthEngine, queue: WorkQueue[str],
        events: EventRecorder, settings: Settings,
        wall_clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        """`wall_clock` stamps condition transition times (UTC)."""
        self._client = client
        self._proxies = proxies
        self._secrets = secrets
        self._providers = providers
        self._engine = engine
        self._queue = queue
        self._events = events
        self._settings = settings
        self._wall_clock = wall_clock
        # The phase each key counts under in the PROXIES gauge (kept per key,
        # so the gauge never needs a scan of the fleet).
        self._phases: dict[str, Phase] = {}
        # Key -> (versions our writes replaced, the object the last write
        # returned), until the cache shows something newer.
        self._ahead: dict[str, tuple[frozenset[str], Obj]] = {}

    # --- workers ---------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run `settings.workers` workers until cancelled; enqueue every cached key at start."""
        try:
            async with trio.open_nursery() as nursery:
                for i in range(self._settings.workers):
                    nursery.start_soon(self._worker, name=f"reconcile worker {i}")
                await self._proxies.synced.wait()
                for key in self._proxies.keys():  # noqa: SIM118 - no __iter__
                    self._queue.add(key)
                task_status.started()
        finally:
            # The gauge is process-wide; a lost term must not leave its counts.
            for phase in self._phases.values():
                PROXIES_GAUGE.labels(phase=phase.value).dec()
            self._phases.clear()

    async def _worker(self) -> None:
        while True:
            try:
                key = await self._queue.get()
            except QueueShutDown:
                return
            finished = False
            try:
                await self.reconcile(key)
                finished = True
            finally:
                if not finished:
                    # Cancelled mid-key (leadership lost): the next term redoes it.
                    self._queue.add(key)
                self._queue.done(key)

    # --- one pass --------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        """One pass over `key`; schedules its own follow-up on the queue. Never raises
        (except Cancelled): an unexpected error is logged and retried with backoff."""
        start = trio.current_time()
        try:
            outcome = await self._reconcile(key)
        except Exception:
            log.exception("reconcile failed", extra={"proxy": key})
            outcome = _Next(RESULT_ERROR, rate_limited=True)
        if outcome.rate_limited:
            self._queue.add_rate_limited(key)
        else:
            self._queue.forget(key)
            if outcome.after is not None:
                self._queue.add_after(key, outcome.after)
        RECONCILES.labels(result=outcome.result).inc()
        RECONCILE_DURATION.observe(trio.current_time() - start)

    async def _reconcile(self, key: str) -> _Next:
        raw, superseded = self._fresh(key, self._proxies.get(key))
        if raw is None:
            self._engine.remove(key)
            self._set_phase(key, None)
            return _Next(RESULT_GONE)
        try:
            proxy = parse_proxy(raw)
        except ModelError as exc:
            # The CRD should have refused it (an older, looser CRD may not). A
            # fixed spec enqueues a pass; a fixed status or metadata does not
            # (`needs_pass`), so the resync looks again.
            log.error("proxy does not fit the model", extra={"proxy": key, "error": str(exc)})
            return _Next(RESULT_INVALID, after=self._settings.ready_resync)
        p = _Pass(key=key, raw=raw, proxy=proxy, draft=proxy.status, observed=proxy.status,
                  now=self._wall_clock(), superseded=set(superseded))
        written = False
        try:
            try:
                if proxy.spec.mode is Mode.EXTERNAL:
                    outcome = await self._external(p)
                elif proxy.metadata.deletion_timestamp is not None:
                    written = True  # the deletion path writes first: the object then vanishes
                    outcome = await self._delete(p)
                else:
                    outcome = await self._managed(p)
            except _Stop as stop:
                outcome = stop.outcome
            if not written:
                await self._write_status(p)
        except kube_errors.Conflict:
            outcome = _Next(RESULT_CONFLICT, after=self._settings.immediate_retry)
        except kube_errors.NotFound:
            return _Next(RESULT_GONE)  # deleted under us; its delete event follows
        except (kube_errors.ApiError, kube_errors.ApiUnavailable) as exc:
            log.warning("API call failed, retrying",
                        extra={"proxy": key, "error": str(exc)})
            outcome = _Next(RESULT_ERROR, rate_limited=True)
        if p.superseded - superseded:
            self._ahead[key] = (frozenset(p.superseded), p.raw)
        self._set_phase(key, p.draft.phase)
        return outcome

    def _fresh(self, key: str, cached: Obj | None) -> tuple[Obj | None, frozenset[str]]:
        """The newest known version of `key`: the cache's, unless it is one our own
        writes already replaced (the watch has not delivered them yet).

        Without this a pass right after a write (a poll, a Secret event) would act
        on the old version, e.g. see the replaced instance's providerID, find it
        gone and clear the new one. Versions are only compared for equality.
        """
        ahead = self._ahead.get(key)
        if ahead is None:
            return cached, frozenset()
        superseded, mine = ahead
        if cached is None:
            del self._ahead[key]
            return None, frozenset()
        if str((cached.get("metadata") or {}).get("resourceVersion") or "") in superseded:
            return mine, superseded
        del self._ahead[key]  # the cache caught up, or someone else wrote since
        return cached, frozenset()

    # --- Managed ---------------------------------------------------------

    async def _managed(self, p: _Pass) -> _Next:
        # 2. the finalizer, before anything exists that it must clean up
        if FINALIZER not in p.proxy.metadata.finalizers:
            meta = p.proxy.metadata
            p.seen(await self._client.merge_patch(PROXIES, meta.name, {"metadata": {
                "finalizers": [*meta.finalizers, FINALIZER],
                # A lost update of the list would drop someone else's finalizer.
                "resourceVersion": meta.resource_version}}, namespace=meta.namespace))
        if is_failed(p.draft.conditions, generation=p.generation):
            return _Next(RESULT_PERMANENT)  # latched until the generation moves
        provider = await self._provider(p)
        # 3. cloud-init
        try:
            cloud_init = self._cloud_init(p.proxy)
        except _Unresolved as exc:
            p.provisioned(False, REASON_CLOUD_INIT_UNRESOLVED, str(exc))
            await self._event(p, WARNING, EVENT_CLOUD_INIT, str(exc))
            return _Next(RESULT_ERROR, rate_limited=True)
        spec = p.proxy.spec
        wanted = spec_hash(provider=spec.provider or "", placement=spec.placement,
                           cloud_init=cloud_init, port=spec.port)
        # 4. no instance yet
        if not p.draft.provider_id:
            await self._create(p, provider, wanted, cloud_init)
            return _Next(after=self._settings.provisioning_poll)
        # 5. the spec moved: replace
        old = p.draft.provider_id
        if p.proxy.metadata.annotations.get(SPEC_HASH_ANNOTATION) != wanted:
            instance = await self._get(p, provider, old)
            if instance is not None and instance.name == instance_name(
                    p.proxy.metadata.uid, wanted):
                # The annotation was removed or edited by hand, yet the instance
                # is the one this spec names (its name is made from the hash):
                # record the hash again rather than replace a good instance.
                await self._record_hash(p, wanted)
                return await self._instance_seen(p, provider, instance)
            self._engine.remove(p.key)
            await self._provider_call(p, "delete", provider.delete(old), latch=False)
            p.clear_instance()
            message = f"spec changed: deleted instance {old}, creating a new one"
            p.provisioned(False, REASON_REPLACING, message)
            await self._event(p, NORMAL, EVENT_REPLACED, message)
            log.info("replacing instance", extra={"proxy": p.key, "instance": old})
            await self._create(p, provider, wanted, cloud_init)
            return _Next(after=self._settings.provisioning_poll)
        # 6. where the instance is
        instance = await self._get(p, provider, old)
        if instance is None:
            self._engine.remove(p.key)
            p.clear_instance()
            p.provisioned(False, REASON_INSTANCE_MISSING, f"instance {old} not found")
            await self._event(p, WARNING, EVENT_INSTANCE_MISSING,
                              f"instance {old} not found; creating it again")
            return _Next(after=self._settings.immediate_retry)
        return await self._instance_seen(p, provider, instance)

    async def _get(self, p: _Pass, provider: Provider, provider_id: str) -> Instance | None:
        """The instance, or None if the provider does not know it; other errors stop the pass."""
        try:
            return await provider.get(provider_id)
        except Exception as exc:
            if not is_not_found(exc):
                raise _Stop(await self._provider_failure(p, "get", exc)) from exc
            return None

    async def _instance_seen(self, p: _Pass, provider: Provider, instance: Instance) -> _Next:
        pid = instance.provider_id
        if instance.state is InstanceState.PROVISIONING:
            self._engine.remove(p.key)
            p.clear_address()
            p.clear_health()
            p.provisioned(False, REASON_PROVISIONING, f"instance {pid} is provisioning")
            return _Next(after=self._settings.provisioning_poll)
        if instance.state in (InstanceState.STOPPED, InstanceState.TERMINATED):
            self._engine.remove(p.key)
            await self._provider_call(p, "delete", provider.delete(pid), latch=False)
            p.clear_instance()
            message = f"instance {pid} is {instance.state.value.lower()}; replacing it"
            p.provisioned(False, REASON_INSTANCE_STOPPED, message)
            await self._event(p, WARNING, EVENT_INSTANCE_STOPPED, message)
            return _Next(after=self._settings.immediate_retry)
        assert instance.ip  # a Running instance has one (contract invariant)
        if p.draft.ip != instance.ip:
            p.clear_health()  # the verdict was about another address
        p.draft = attrs.evolve(p.draft, ip=instance.ip, host=instance.ip,
                               port=p.proxy.spec.port)
        p.provisioned(True, REASON_RUNNING, f"instance {pid} running at {instance.ip}")
        self._health(p)
        return _Next(after=self._settings.ready_resync)

    async def _create(self, p: _Pass, provider: Provider, wanted: str, cloud_init: str) -> None:
        meta, spec = p.proxy.metadata, p.proxy.spec
        placement = spec.placement
        request = CreateRequest(
            name=instance_name(meta.uid, wanted),
            placement=InstancePlacement(
                zone=placement.zone, region=placement.region,
                machine_type=placement.machine_type) if placement else InstancePlacement(),
            cloud_init=cloud_init, port=spec.port,
            labels=gc_labels(cluster=self._settings.cluster_name, proxy_uid=meta.uid,
                             namespace=meta.namespace, name=meta.name))
        self._engine.remove(p.key)
        instance = await self._provider_call(p, "create", provider.create(request))
        if instance.state in (InstanceState.STOPPED, InstanceState.TERMINATED):
            # Create adopted an instance of this name on its way out: the one a
            # pass just deleted (a Pod in its grace period, a VM still
            # stopping), or one that stopped before its providerID was
            # recorded. Recording it would only replace it again and again;
            # wait until the name is free, asking again that it go.
            pid = instance.provider_id
            await self._provider_call(p, "delete", provider.delete(pid), latch=False)
            state = instance.state.value.lower()
            p.provisioned(False, REASON_INSTANCE_STOPPED,
                          f"instance {pid} of that name is {state}; "
                          "creating it again once it is gone")
            log.info("instance name still taken by an instance going away",
                     extra={"proxy": p.key, "instance": pid, "state": state})
            raise _Stop(_Next(after=self._settings.provisioning_poll))
        # The annotation first: a status write that fails after it leaves no
        # providerID, and the next pass re-finds the instance by its name.
        await self._record_hash(p, wanted)
        p.clear_instance()
        p.draft = attrs.evolve(p.draft, provider_id=instance.provider_id)
        p.provisioned(False, REASON_CREATING, f"created instance {instance.provider_id}")
        log.info("instance created", extra={"proxy": p.key, "instance": instance.provider_id})
        await self._event(p, NORMAL, EVENT_CREATED, f"created instance {instance.provider_id}")

    async def _record_hash(self, p: _Pass, wanted: str) -> None:
        """Write the spec-hash annotation, unless it already says `wanted`."""
        meta = p.proxy.metadata
        if meta.annotations.get(SPEC_HASH_ANNOTATION) != wanted:
            p.seen(await self._client.merge_patch(PROXIES, meta.name, {"metadata": {
                "annotations": {SPEC_HASH_ANNOTATION: wanted}}}, namespace=meta.namespace))

    # --- deletion (step 1) -----------------------------------------------

    async def _delete(self, p: _Pass) -> _Next:
        self._engine.remove(p.key)
        # Written first: once the finalizer goes, so does the object.
        await self._write_status(p)
        meta = p.proxy.metadata  # the status write moved the resourceVersion
        if FINALIZER not in meta.finalizers:
            return _Next()
        pid = p.draft.provider_id
        if pid:
            try:
                await self._providers.get(p.proxy.spec.provider or "").delete(pid)
            except Exception as exc:
                # Never latched: a deletion that gives up would leak the instance.
                log.warning("deleting instance failed, retrying",
                            extra={"proxy": p.key, "instance": pid, "error": str(exc)})
                await self._event(p, WARNING, EVENT_DELETE_FAILED,
                                  f"deleting instance {pid}: {exc}")
                return _Next(RESULT_ERROR, rate_limited=True)
            log.info("instance deleted", extra={"proxy": p.key, "instance": pid})
            await self._event(p, NORMAL, EVENT_DELETED, f"deleted instance {pid}")
        rest = [f for f in meta.finalizers if f != FINALIZER]
        await self._client.merge_patch(PROXIES, meta.name, {"metadata": {
            "finalizers": rest, "resourceVersion": meta.resource_version}},
            namespace=meta.namespace)
        return _Next()

    # --- External --------------------------------------------------------

    async def _external(self, p: _Pass) -> _Next:
        if p.proxy.metadata.deletion_timestamp is not None:
            self._engine.remove(p.key)
            return _Next()
        endpoint = p.proxy.spec.endpoint
        host = endpoint.host if endpoint is not None else None
        p.draft = attrs.evolve(p.draft, provider_id=None, ip=None, host=host,
                               port=effective_port(p.proxy))
        p.provisioned(True, REASON_EXTERNAL, f"external proxy at {host}")
        self._health(p)
        return _Next(after=self._settings.ready_resync)

    # --- step 7: health --------------------------------------------------

    def _health(self, p: _Pass) -> None:
        host, port = p.draft.host, p.draft.port
        if not host or port is None:
            self._engine.remove(p.key)
            return
        check = p.proxy.spec.health_check
        try:
            target = ProbeTarget(
                key=p.key, host=host, port=port, url=check.probe_url,
                interval=float(check.interval_seconds), timeout=float(check.timeout_seconds),
                success_threshold=check.success_threshold,
                failure_threshold=check.failure_threshold)
        except ValueError as exc:
            self._engine.remove(p.key)
            p.draft = attrs.evolve(p.draft, latency_ms=None)
            p.condition(COND_HEALTHY, STATUS_FALSE, REASON_INVALID_HEALTH_CHECK,
                        f"spec.healthCheck: {exc}")
            return
        self._engine.upsert(target, seed=_seed(p.draft))
        verdict = self._engine.snapshot(p.key)
        if verdict is None:
            return
        p.condition(COND_HEALTHY, STATUS_TRUE if verdict.healthy else STATUS_FALSE,
                    REASON_PROBE_SUCCEEDED if verdict.healthy else REASON_PROBE_FAILED,
                    verdict.reason)
        p.draft = attrs.evolve(p.draft, latency_ms=verdict.latency_ms,
                               last_health_check_time=verdict.checked_at)

    # --- helpers ---------------------------------------------------------

    async def _provider(self, p: _Pass) -> Provider:
        try:
            return self._providers.get(p.proxy.spec.provider or "")
        except Exception as exc:
            raise _Stop(await self._provider_failure(p, "provider", exc)) from exc

    def _cloud_init(self, proxy: Proxy) -> str:
        """Step 3: the inline text, or the Secret key's decoded value; raises `_Unresolved`."""
        cloud_init = proxy.spec.cloud_init
        if cloud_init is None:
            return ""
        if cloud_init.inline is not None:
            return cloud_init.inline
        ref = cloud_init.secret_ref
        assert ref is not None  # the CRD requires exactly one of the two
        secret_key = f"{proxy.metadata.namespace}/{ref.name}"
        secret = self._secrets.get(secret_key)
        if secret is None:
            raise _Unresolved(f"Secret {secret_key} not found (it must be labelled "
                              f"{CLOUD_INIT_LABEL}=true)")
        value = (secret.get("data") or {}).get(ref.key)
        if not isinstance(value, str):
            raise _Unresolved(f"Secret {secret_key} has no key {ref.key!r}")
        try:
            return base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise _Unresolved(
                f"Secret {secret_key} key {ref.key!r} is not base64 UTF-8 text") from None

    async def _provider_call(self, p: _Pass, op: str, call: Awaitable[T], *,
                             latch: bool = True) -> T:
        try:
            return await call
        except Exception as exc:
            raise _Stop(await self._provider_failure(p, op, exc, latch=latch)) from exc

    def _permanent(self, p: _Pass, op: str, exc: BaseException) -> _Next:
        p.provisioned(False, REASON_PERMANENT_FAILURE, f"{op}: {exc}")
        log.warning("permanent failure", extra={"proxy": p.key, "op": op, "error": str(exc)})
        return _Next(RESULT_PERMANENT)

    async def _provider_failure(self, p: _Pass, op: str, exc: BaseException, *,
                                latch: bool = True) -> _Next:
        message = f"{op}: {exc}"
        if latch and is_permanent(exc):
            outcome = self._permanent(p, op, exc)
            await self._event(p, WARNING, EVENT_FAILED, message)
            return outcome
        if is_quota(exc):
            if latch:
                p.provisioned(False, REASON_QUOTA_EXCEEDED, message)
            log.warning("provider quota exceeded",
                        extra={"proxy": p.key, "op": op, "error": str(exc)})
            await self._event(p, WARNING, EVENT_QUOTA, message)
            return _Next(RESULT_QUOTA, after=self._settings.quota_retry)
        log.warning("provider call failed, retrying",
                    extra={"proxy": p.key, "op": op, "error": str(exc)})
        await self._event(p, WARNING, EVENT_PROVIDER_ERROR, message)
        return _Next(RESULT_ERROR, rate_limited=True)

    async def _event(self, p: _Pass, type: str, reason: str, message: str) -> None:
        await self._events.record(p.raw, type=type, reason=reason, message=message)

    async def _write_status(self, p: _Pass) -> None:
        """The pass's one status write: a merge patch, only if something changed."""
        p.draft = attrs.evolve(p.draft, observed_generation=p.generation, phase=compute_phase(
            p.draft.conditions, generation=p.generation,
            deleting=p.proxy.metadata.deletion_timestamp is not None))
        if _comparable(p.draft) == _comparable(p.observed):
            return
        wire = unstructure_status(p.draft)
        del wire["cooldowns"]  # the lease layer's (SPEC §7): never written here
        meta = p.proxy.metadata
        answer = await self._client.patch_status(PROXIES, meta.name, {"status": wire},
                                                 namespace=meta.namespace)
        p.superseded.add(meta.resource_version)
        p.raw = answer
        p.proxy = attrs.evolve(p.proxy, metadata=parse_proxy(answer).metadata)
        p.observed = parse_proxy(answer).status

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


