"""The steps of a pass over a Managed proxy (docs/architecture.md, steps 1-6), against its provider.

`ManagedSteps.drive` takes a Managed Proxy that is not being deleted one step
towards its spec: finalizer, cloud-init, spec hash, then create, replace or
poll the instance and publish its address. It changes only the pass's draft
and the Proxy's metadata (finalizer, spec-hash annotation); the reconciler
then syncs the health engine and writes the status once. `release` is step 1,
run after the `Deleting` status is written: delete the instance, then drop
the finalizer.

Provider errors end the pass (`Stop`) with an outcome by kind: the daemon's
own configuration (`NotConfigured`) is a condition re-evaluated on every pass,
never latched; the object's own permanent fault latches Failed until the
generation moves; quota waits `--quota-retry`; anything else backs off, never
sooner than the provider's `retry_after`. Deletes never latch.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TypeVar

from egressd.control.cloudinit import Unresolved, resolve_cloud_init
from egressd.control.draft import Draft, Stop
from egressd.control.spechash import spec_hash
from egressd.control.status import (
    REASON_CLOUD_INIT_UNRESOLVED,
    REASON_CREATING,
    REASON_INSTANCE_MISSING,
    REASON_INSTANCE_STOPPED,
    REASON_PERMANENT_FAILURE,
    REASON_PROVIDER_NOT_CONFIGURED,
    REASON_PROVISIONING,
    REASON_QUOTA_EXCEEDED,
    REASON_REPLACING,
    REASON_RUNNING,
    is_failed,
)
from egressd.control.worker import (
    RESULT_ERROR,
    RESULT_NOT_CONFIGURED,
    RESULT_PERMANENT,
    RESULT_QUOTA,
    Outcome,
)
from egressd.kube.client import KubeClient
from egressd.kube.events import NORMAL, WARNING, EventRecorder
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES
from egressd.model.constants import FINALIZER, SPEC_HASH_ANNOTATION
from egressd.providers import (
    CreateRequest,
    Instance,
    InstanceState,
    Provider,
    ProviderError,
    gc_labels,
    instance_name,
    is_not_configured,
    is_not_found,
    is_permanent,
    is_quota,
)
from egressd.providers import Placement as InstancePlacement
from egressd.providers.registry import ProviderRegistry
from egressd.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

# Event reasons (docs/architecture.md: created, replaced, deleted, failed).
EVENT_CREATED = "Created"
EVENT_REPLACED = "Replaced"
EVENT_DELETED = "Deleted"
EVENT_FAILED = "Failed"
EVENT_NOT_CONFIGURED = "ProviderNotConfigured"
EVENT_QUOTA = "QuotaExceeded"
EVENT_PROVIDER_ERROR = "ProviderError"
EVENT_DELETE_FAILED = "DeleteFailed"
EVENT_INSTANCE_MISSING = "InstanceMissing"
EVENT_INSTANCE_STOPPED = "InstanceStopped"
EVENT_CLOUD_INIT = "CloudInitUnresolved"

_GONE = (InstanceState.STOPPED, InstanceState.TERMINATED)


def retry_hint(exc: BaseException) -> float:
    """A provider error's `retry_after` in seconds (0 without one)."""
    hint = exc.retry_after if isinstance(exc, ProviderError) else None
    return float(hint) if hint is not None and hint > 0 else 0.0


class ManagedSteps:
    """Steps 1-6 for Managed proxies; one per Reconciler."""

    def __init__(self, *, client: KubeClient, secrets: Informer, providers: ProviderRegistry,
                 events: EventRecorder, settings: Settings) -> None:
        self._client = client
        self._secrets = secrets
        self._providers = providers
        self._events = events
        self._settings = settings

    async def drive(self, d: Draft) -> Outcome:
        """Steps 2-6 for a Managed Proxy that is not being deleted (may raise `Stop`)."""
        await self._ensure_finalizer(d)
        if is_failed(d.status.conditions, generation=d.generation):
            return Outcome(RESULT_PERMANENT)  # latched until the generation moves
        provider = await self._provider(d)
        cloud_init = await self._cloud_init(d)
        spec = d.proxy.spec
        wanted = spec_hash(provider=spec.provider or "", placement=spec.placement,
                           cloud_init=cloud_init, port=spec.port)
        current = d.status.provider_id
        if not current:  # 4. no instance yet
            await self._create(d, provider, wanted, cloud_init)
            return Outcome(after=self._settings.provisioning_poll)
        if d.proxy.metadata.annotations.get(SPEC_HASH_ANNOTATION) != wanted:
            return await self._spec_moved(d, provider, current, wanted, cloud_init)  # 5.
        instance = await self._get(d, provider, current)  # 6.
        if instance is None:
            d.clear_instance()
            d.provisioned(False, REASON_INSTANCE_MISSING, f"instance {current} not found")
            await self._event(d, WARNING, EVENT_INSTANCE_MISSING,
                              f"instance {current} not found; creating it again")
            return Outcome(after=self._settings.immediate_retry)
        return await self._instance_seen(d, provider, instance)

    # --- the steps ---------------------------------------------------------

    async def _ensure_finalizer(self, d: Draft) -> None:
        """2. The finalizer, before anything exists that it must clean up."""
        meta = d.proxy.metadata
        if FINALIZER not in meta.finalizers:
            d.seen(await self._client.merge_patch(PROXIES, meta.name, {"metadata": {
                "finalizers": [*meta.finalizers, FINALIZER],
                # A lost update of the list would drop someone else's finalizer.
                "resourceVersion": meta.resource_version}}, namespace=meta.namespace))

    async def _provider(self, d: Draft) -> Provider:
        try:
            return self._providers.get(d.proxy.spec.provider or "")
        except Exception as exc:  # UnknownProvider: this daemon's configuration
            raise Stop(await self._failure(d, "provider", exc)) from exc

    async def _cloud_init(self, d: Draft) -> str:
        """3. The resolved cloud-init; unresolved stops the pass and retries with backoff."""
        try:
            return resolve_cloud_init(d.proxy, self._secrets)
        except Unresolved as exc:
            d.provisioned(False, REASON_CLOUD_INIT_UNRESOLVED, str(exc))
            await self._event(d, WARNING, EVENT_CLOUD_INIT, str(exc))
            raise Stop(Outcome(RESULT_ERROR, rate_limited=True)) from exc

    async def _spec_moved(self, d: Draft, provider: Provider, old: str, wanted: str,
                          cloud_init: str) -> Outcome:
        """5. The spec hash differs from the annotation: replace the instance."""
        instance = await self._get(d, provider, old)
        if instance is not None and instance.name == instance_name(
                d.proxy.metadata.uid, wanted):
            # The annotation was removed or edited by hand, yet the instance
            # is the one this spec names (its name is made from the hash):
            # record the hash again rather than replace a good instance.
            await self._record_hash(d, wanted)
            return await self._instance_seen(d, provider, instance)
        await self._retire(d, provider, old, REASON_REPLACING,
                           f"spec changed: deleted instance {old}, creating a new one",
                           event=(NORMAL, EVENT_REPLACED))
        log.info("replacing instance", extra={"proxy": d.key, "instance": old})
        await self._create(d, provider, wanted, cloud_init)
        return Outcome(after=self._settings.provisioning_poll)

    async def _instance_seen(self, d: Draft, provider: Provider, instance: Instance) -> Outcome:
        """6. Where the recorded instance is: poll, replace, or publish its address."""
        pid = instance.provider_id
        if instance.state is InstanceState.PROVISIONING:
            d.clear_address()
            d.clear_health()
            d.provisioned(False, REASON_PROVISIONING, f"instance {pid} is provisioning")
            return Outcome(after=self._settings.provisioning_poll)
        if instance.state in _GONE:
            await self._retire(d, provider, pid, REASON_INSTANCE_STOPPED,
                               f"instance {pid} is {instance.state.value.lower()}; replacing it",
                               event=(WARNING, EVENT_INSTANCE_STOPPED))
            return Outcome(after=self._settings.immediate_retry)
        assert instance.ip  # a Running instance has one (contract invariant)
        if d.status.ip != instance.ip:
            d.clear_health()  # the verdict was about another address
        d.address(ip=instance.ip, host=instance.ip, port=d.proxy.spec.port)
        d.provisioned(True, REASON_RUNNING, f"instance {pid} running at {instance.ip}")
        return Outcome(after=self._settings.ready_resync)

    async def _retire(self, d: Draft, provider: Provider, provider_id: str, reason: str,
                      message: str, *, event: tuple[str, str]) -> None:
        """Delete the recorded instance and forget it: no providerID, address or verdict.

        A failed delete stops the pass (never latched) with the instance still recorded.
        """
        await self._provider_call(d, "delete", provider.delete(provider_id), latch=False)
        d.clear_instance()
        d.provisioned(False, reason, message)
        await self._event(d, *event, message)

    async def _create(self, d: Draft, provider: Provider, wanted: str, cloud_init: str) -> None:
        meta, spec = d.proxy.metadata, d.proxy.spec
        placement = spec.placement
        request = CreateRequest(
            name=instance_name(meta.uid, wanted),
            placement=InstancePlacement(
                zone=placement.zone, region=placement.region,
                machine_type=placement.machine_type) if placement else InstancePlacement(),
            cloud_init=cloud_init, port=spec.port,
            labels=gc_labels(cluster=self._settings.cluster_name, proxy_uid=meta.uid,
                             namespace=meta.namespace, name=meta.name))
        instance = await self._provider_call(d, "create", provider.create(request))
        pid = instance.provider_id
        if instance.state in _GONE:
            # Create adopted an instance of this name on its way out: the one a
            # pass just deleted (a Pod in its grace period, a VM still
            # stopping), or one that stopped before its providerID was
            # recorded. Recording it would only replace it again and again;
            # wait until the name is free, asking again that it go.
            await self._provider_call(d, "delete", provider.delete(pid), latch=False)
            state = instance.state.value.lower()
            d.provisioned(False, REASON_INSTANCE_STOPPED,
                          f"instance {pid} of that name is {state}; "
                          "creating it again once it is gone")
            log.info("instance name still taken by an instance going away",
                     extra={"proxy": d.key, "instance": pid, "state": state})
            raise Stop(Outcome(after=self._settings.provisioning_poll))
        # The annotation first: a status write that fails after it leaves no
        # providerID, and the next pass re-finds the instance by its name.
        await self._record_hash(d, wanted)
        d.record_instance(pid)
        d.provisioned(False, REASON_CREATING, f"created instance {pid}")
        log.info("instance created", extra={"proxy": d.key, "instance": pid})
        await self._event(d, NORMAL, EVENT_CREATED, f"created instance {pid}")

    async def _record_hash(self, d: Draft, wanted: str) -> None:
        """Write the spec-hash annotation, unless it already says `wanted`."""
        meta = d.proxy.metadata
        if meta.annotations.get(SPEC_HASH_ANNOTATION) != wanted:
            d.seen(await self._client.merge_patch(PROXIES, meta.name, {"metadata": {
                "annotations": {SPEC_HASH_ANNOTATION: wanted}}}, namespace=meta.namespace))

    # --- step 1: deletion ----------------------------------------------------

    async def release(self, d: Draft) -> Outcome:
        """Delete the instance, then remove the finalizer (the object then vanishes).

        Called after the `Deleting` status is written. A failed delete keeps the
        finalizer and retries with backoff: giving up would leak the instance.
        """
        meta = d.proxy.metadata
        if FINALIZER not in meta.finalizers:
            return Outcome()
        pid = d.status.provider_id
        if pid:
            try:
                await self._providers.get(d.proxy.spec.provider or "").delete(pid)
            except Exception as exc:
                log.warning("deleting instance failed, retrying",
                            extra={"proxy": d.key, "instance": pid, "error": str(exc)})
                await self._event(d, WARNING, EVENT_DELETE_FAILED,
                                  f"deleting instance {pid}: {exc}")
                return Outcome(RESULT_ERROR, rate_limited=True, at_least=retry_hint(exc))
            log.info("instance deleted", extra={"proxy": d.key, "instance": pid})
            await self._event(d, NORMAL, EVENT_DELETED, f"deleted instance {pid}")
        rest = [f for f in meta.finalizers if f != FINALIZER]
        await self._client.merge_patch(PROXIES, meta.name, {"metadata": {
            "finalizers": rest, "resourceVersion": meta.resource_version}},
            namespace=meta.namespace)
        return Outcome()

    # --- provider errors -----------------------------------------------------

    async def _get(self, d: Draft, provider: Provider, provider_id: str) -> Instance | None:
        """The instance, or None if the provider does not know it; other errors stop the pass."""
        try:
            return await provider.get(provider_id)
        except Exception as exc:
            if not is_not_found(exc):
                raise Stop(await self._failure(d, "get", exc)) from exc
            return None

    async def _provider_call(self, d: Draft, op: str, call: Awaitable[T], *,
                             latch: bool = True) -> T:
        try:
            return await call
        except Exception as exc:
            raise Stop(await self._failure(d, op, exc, latch=latch)) from exc

    async def _failure(self, d: Draft, op: str, exc: BaseException, *,
                       latch: bool = True) -> Outcome:
        """The outcome of a failed provider call, by kind; `latch=False` (deletes) never
        sets a Provisioned condition for a permanent error, only retries."""
        message = f"{op}: {exc}"
        fields = {"proxy": d.key, "op": op, "error": str(exc)}
        if latch and is_not_configured(exc):
            # Not the object's fault: re-evaluated at every pass (a daemon with the
            # right configuration clears it), looked at again after the resync
            # interval (RBAC can be fixed without a restart).
            d.provisioned(False, REASON_PROVIDER_NOT_CONFIGURED, message)
            log.warning("provider not configured for this proxy", extra=fields)
            await self._event(d, WARNING, EVENT_NOT_CONFIGURED, message)
            return Outcome(RESULT_NOT_CONFIGURED, after=self._settings.ready_resync)
        if latch and is_permanent(exc):
            d.provisioned(False, REASON_PERMANENT_FAILURE, message)
            log.warning("permanent failure", extra=fields)
            await self._event(d, WARNING, EVENT_FAILED, message)
            return Outcome(RESULT_PERMANENT)
        if is_quota(exc):
            if latch:
                d.provisioned(False, REASON_QUOTA_EXCEEDED, message)
            log.warning("provider quota exceeded", extra=fields)
            await self._event(d, WARNING, EVENT_QUOTA, message)
            return Outcome(RESULT_QUOTA, after=self._settings.quota_retry)
        log.warning("provider call failed, retrying", extra=fields)
        await self._event(d, WARNING, EVENT_PROVIDER_ERROR, message)
        return Outcome(RESULT_ERROR, rate_limited=True, at_least=retry_hint(exc))

    async def _event(self, d: Draft, type: str, reason: str, message: str) -> None:
        await self._events.record(d.raw, type=type, reason=reason, message=message)
