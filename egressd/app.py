"""The composition root of `egressd run`: what it reads at start and the one nursery.

`load_inputs` reads the files named by flags, once, so a mistake in any of
them stops the process at start with one line naming the flag and the path
(docs/providers.md, docs/reference.md), before a nursery or a connection exists.

`run_daemon` builds every part and runs them in one nursery (docs/architecture.md):
process-wide services on every replica (informers, work queue, lease stores,
discovery and ops servers) and, per leadership term, the health engine,
reconciler and orphan GC. Each starts with `nursery.start`, in an order where
nothing is used before it is ready: the discovery API listens only once both
caches have synced (it never answers from an empty cache), and `/readyz` says
ready only once everything has started. `run_until_signalled` is `egressd run`
under trio: SIGINT/SIGTERM cancel the root scope, the only stop.
"""

from __future__ import annotations

import functools
import logging
import secrets
import signal
import socket
import ssl
import time
from collections.abc import Iterable, Mapping

import attrs
import trio

from egressd.control.feed import feed_instances, feed_queue, instance_informers
from egressd.control.gc import run_orphan_gc
from egressd.control.queue import WorkQueue
from egressd.control.reconciler import Reconciler
from egressd.durations import format_duration
from egressd.errors import ConfigError
from egressd.gateway.fleet import SourceFleet
from egressd.gateway.server import Gateway, GatewayConfig, listen
from egressd.gateway.sessions import Sessions
from egressd.health.engine import HealthEngine
from egressd.health.probe import Prober, make_ssl_context
from egressd.http.auth import read_token
from egressd.http.discovery import create_discovery_app
from egressd.http.ops import create_ops_app
from egressd.http.serve import serve_app
from egressd.http.source import InformerProxySource
from egressd.kube.client import KubeClient, open_client
from egressd.kube.config import load_config
from egressd.kube.election import run_elected
from egressd.kube.events import EventRecorder
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES, SECRETS
from egressd.leases import LeaseStore
from egressd.leases.persist import CooldownWriter
from egressd.leases.store import MemoryLeaseStore
from egressd.metrics import LEADER
from egressd.model.constants import CLOUD_INIT_LABEL
from egressd.model.proxy import Proxy
from egressd.providers.config import ProvidersConfig, ProvidersConfigError, load_providers_config
from egressd.providers.registry import ProviderRegistry, build_registry
from egressd.settings import Settings
from egressd.watchdog import LoopWatchdog

log = logging.getLogger(__name__)

CONFIG_LOAD_TIMEOUT = 60.0
"""Seconds loading the Kubernetes config may take at start (it may run an exec plugin)."""

PROVIDERS_BUILD_TIMEOUT = 60.0
"""Seconds building the providers may take at start (GCP credentials may need the network)."""

LEADER_LEASE_NAME = "egressd"
"""The coordination.k8s.io/v1 Lease the replicas campaign for (see `leader_lease_name`)."""


def leader_lease_name(namespace: str) -> str:
    """The Lease of the daemons that watch `namespace` ("" = all namespaces).

    Leadership guards the set of Proxies a daemon reconciles: two deployments
    restricted to different namespaces must not take turns on one Lease (one
    of them would never reconcile), so a restricted daemon's Lease names its
    namespace.
    """
    return f"{LEADER_LEASE_NAME}-{namespace}" if namespace else LEADER_LEASE_NAME


@attrs.frozen
class Inputs:
    """What `egressd run` read at start: settings plus the contents of their files."""

    settings: Settings
    discovery_token: str | None = attrs.field(repr=False)
    providers: ProvidersConfig
    probe_ssl_context: ssl.SSLContext


def _check_readable(flag: str, path: str | None) -> None:
    if not path:
        return
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: {exc.strerror}") from None


def _check_consistent(settings: Settings, token: str | None) -> None:
    """Reject flag combinations that would fail (or silently misbehave) later."""
    if settings.gateway_addr is not None and not token:
        raise ConfigError("--gateway-addr needs a discovery token (DISCOVERY_TOKEN or "
                          "--discovery-token-file): the gateway is never an open proxy")
    if settings.default_lease_ttl > settings.max_lease_ttl:
        # A request without ttlSeconds would get a lease longer than the maximum.
        raise ConfigError(
            f"--default-lease-ttl {format_duration(settings.default_lease_ttl)} is longer "
            f"than --max-lease-ttl {format_duration(settings.max_lease_ttl)}")
    retry, renew, duration = (settings.leader_retry_period, settings.leader_renew_deadline,
                              settings.leader_lease_duration)
    if not retry < renew < duration:
        raise ConfigError(
            f"need --leader-retry-period ({format_duration(retry)}) < --leader-renew-deadline "
            f"({format_duration(renew)}) < --leader-lease-duration ({format_duration(duration)})")


def load_inputs(settings: Settings, environ: Mapping[str, str]) -> Inputs:
    """Read every file the settings name; raise ConfigError naming the first bad one
    (or an inconsistent pair of flags).

    A providers config with several mistakes raises `ProvidersConfigError`,
    whose `problems` lists them all.
    """
    token = read_token(settings.discovery_token_file, environ)
    _check_consistent(settings, token)
    _check_readable("--kubeconfig", settings.kubeconfig)
    providers = ProvidersConfig()
    if settings.providers_config:
        try:
            providers = load_providers_config(settings.providers_config)
        except ProvidersConfigError as exc:
            exc.problems = [f"--providers-config {settings.providers_config}: {p}"
                            for p in exc.problems]
            raise
    return Inputs(
        settings=settings,
        discovery_token=token,
        providers=providers,
        probe_ssl_context=make_ssl_context(settings.probe_ca_file),
    )


@attrs.frozen
class DaemonAddresses:
    """Where a running daemon serves: the discovery API, the ops endpoints, the gateway."""

    discovery_url: str
    metrics_url: str
    gateway_url: str | None = None


class HealthRelay:
    """Where a `proxy_error` report reaches the health engine (docs/reference.md).

    The engine lives on the leader only, one per term, while reports land on
    any replica: the current term's engine is set here while it runs. On a
    follower a report counts against nothing but the metric (see
    docs/decisions.md): the leader's own probes still judge the proxy.
    """

    REASON = "a client reported proxy_error"

    def __init__(self) -> None:
        self.engine: HealthEngine | None = None

    def proxy_error(self, key: str) -> None:
        if self.engine is not None:
            self.engine.count_failure(key, self.REASON)
        else:
            log.debug("proxy_error not counted: not the leader", extra={"proxy": key})


@attrs.frozen
class _Parts:
    """The process-wide parts a leadership term works with."""

    client: KubeClient
    proxies: Informer
    secrets: Informer
    providers: ProviderRegistry
    queue: WorkQueue[str]
    events: EventRecorder
    prober: Prober
    settings: Settings
    health: HealthRelay


async def _lead(parts: _Parts, *,
                task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """One leadership term: a fresh health engine, the reconciler and orphan GC.

    Cancelled when leadership is lost (or at shutdown); the next term starts
    afresh (docs/architecture.md), seeded from the statuses in the cache.
    """
    settings = parts.settings
    engine = HealthEngine(parts.prober.probe, on_change=parts.queue.add,
                          concurrency=settings.probe_concurrency)
    reconciler = Reconciler(
        client=parts.client, proxies=parts.proxies, secrets=parts.secrets,
        providers=parts.providers, engine=engine, queue=parts.queue, events=parts.events,
        settings=settings)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            parts.health.engine = engine
            await nursery.start(reconciler.run)
            await nursery.start(functools.partial(
                run_orphan_gc, providers=parts.providers, proxies=parts.proxies,
                cluster_name=settings.cluster_name, interval=settings.gc_interval,
                min_age=settings.orphan_min_age))
            task_status.started()
    finally:
        parts.health.engine = None


async def _lead_unelected(parts: _Parts, *,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                          ) -> None:
    """Leader election off: this process is the only leader for its whole life."""
    LEADER.set(1)
    try:
        await _lead(parts, task_status=task_status)
    finally:
        LEADER.set(0)


async def run_daemon(
    inputs: Inputs,
    *,
    environ: Mapping[str, str],
    task_status: trio.TaskStatus[DaemonAddresses] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run egressd until cancelled (docs/architecture.md); cancellation is the only stop.

    `task_status.started` gets the bound addresses once both servers listen
    and both caches have synced. Raises ConfigError, before anything runs,
    when the Kubernetes config or a provider cannot be loaded.
    """
    settings = inputs.settings
    try:
        with trio.fail_after(CONFIG_LOAD_TIMEOUT):
            config = await load_config(kubeconfig=settings.kubeconfig,
                                       context=settings.context, environ=environ)
    except trio.TooSlowError:
        raise ConfigError(f"loading the Kubernetes config took longer than "
                          f"{CONFIG_LOAD_TIMEOUT:g} s") from None
    async with open_client(config) as client:
        try:
            with trio.fail_after(PROVIDERS_BUILD_TIMEOUT):
                # Blocking: a gcp provider reads Google credentials (maybe from the
                # metadata server). Abandoned on cancel; the thread ends on its own.
                registry = await trio.to_thread.run_sync(
                    functools.partial(build_registry, inputs.providers, kube_client=client),
                    abandon_on_cancel=True)
        except trio.TooSlowError:
            raise ConfigError(f"building the providers took longer than "
                              f"{PROVIDERS_BUILD_TIMEOUT:g} s") from None
        try:
            await _run_parts(inputs, client=client, registry=registry,
                             leader_namespace=settings.leader_election_namespace
                             or config.namespace or "default",
                             task_status=task_status)
        finally:
            registry.close()


class _Readiness:
    """What `/readyz` reads: the Proxy source, ready once the whole daemon has started.

    The Proxy cache alone is not enough: the Secret cache and the discovery
    server come after it, and a replica must not get traffic before they do.
    """

    def __init__(self, source: InformerProxySource) -> None:
        self._source = source
        self.synced = trio.Event()

    def proxies(self) -> Iterable[Proxy]:
        return self._source.proxies()

    def get(self, key: str) -> Proxy | None:
        return self._source.get(key)


async def _run_parts(
    inputs: Inputs,
    *,
    client: KubeClient,
    registry: ProviderRegistry,
    leader_namespace: str,
    task_status: trio.TaskStatus[DaemonAddresses],
) -> None:
    settings = inputs.settings
    namespace = settings.namespace or None
    proxies = Informer(PROXIES, namespace=namespace)
    # Secrets are read only where Proxies are watched: a secretRef names a
    # Secret in the Proxy's own namespace.
    cloud_init = Informer(SECRETS, namespace=namespace,
                          label_selector=f"{CLOUD_INIT_LABEL}=true")
    queue: WorkQueue[str] = WorkQueue()
    # Every handler is registered before the informers run, so none misses the first list.
    feed_queue(queue, proxies=proxies, secrets=cloud_init)
    # The kubernetes providers' Pods, so a Pod that fails or goes is replaced at once.
    instances = instance_informers(inputs.providers, cluster_name=settings.cluster_name)
    feed_instances(queue, proxies=proxies, instances=instances)
    source = InformerProxySource(proxies)
    health = HealthRelay()
    writer = CooldownWriter(client=client, lookup=proxies.get, clock=time.time,
                            cap=settings.max_cooldowns_per_proxy)
    store = MemoryLeaseStore.from_settings(
        settings, clock=time.time, on_cooldown=writer.cooldown_started,
        on_proxy_error=health.proxy_error)
    writer.attach(proxies, store)
    discovery = create_discovery_app(
        source, store=store, default_ttl=settings.default_lease_ttl,
        max_ttl=settings.max_lease_ttl, token=inputs.discovery_token)
    readiness = _Readiness(source)
    ops = create_ops_app(readiness)
    hostname = socket.gethostname()
    parts = _Parts(
        client=client, proxies=proxies, secrets=cloud_init, providers=registry, queue=queue,
        events=EventRecorder(client, host=hostname),
        prober=Prober(ssl_context=inputs.probe_ssl_context), settings=settings,
        health=health)
    leader_elect = settings.leader_elect
    lease_name = leader_lease_name(settings.namespace)

    async with trio.open_nursery() as nursery:
        # The ops server first, so /healthz answers (and /readyz says 503) while a
        # slow first list is in flight: that must not fail the liveness probe.
        metrics_url: str = (await nursery.start(functools.partial(
            serve_app, ops, settings.metrics_addr, grace=settings.shutdown_grace,
            backlog=settings.listen_backlog)))[0]
        await nursery.start(LoopWatchdog().run)  # egressd_loop_lag_*: stalls become a number
        await nursery.start(queue.run)
        await nursery.start(store.run)  # the lease sweeper
        await nursery.start(writer.run)
        await nursery.start(proxies.run, client)  # returns once the first list is in
        await nursery.start(cloud_init.run, client)
        # Only now the discovery API: an unsynced cache would answer an empty list
        # (200) or no_proxy_available (409), both untrue.
        discovery_url: str = (await nursery.start(functools.partial(
            serve_app, discovery, settings.discovery_addr, grace=settings.shutdown_grace,
            backlog=settings.listen_backlog)))[0]
        gateway_url = await _start_gateway(nursery, inputs, source=source, store=store)
        for informer in instances:  # only the reconciler reads them: after the servers
            await nursery.start(informer.run, client)
        if leader_elect:
            identity = f"{hostname}_{secrets.token_hex(4)}"
            await nursery.start(functools.partial(
                run_elected, client, name=lease_name, namespace=leader_namespace,
                identity=identity, lead=functools.partial(_lead, parts),
                lease_duration=settings.leader_lease_duration,
                renew_deadline=settings.leader_renew_deadline,
                retry_period=settings.leader_retry_period,
                # Within the stop's grace even with the API server down (issue 19).
                release_timeout=min(settings.leader_renew_deadline, settings.shutdown_grace)))
        else:
            # Off only on request: a second daemon against the same cluster (another
            # replica, a developer's `egressd run`) would reconcile the same Proxies
            # with its own providers config and undo this one's work.
            log.warning("leader election is off (--leader-elect=false): this process "
                        "reconciles whatever any other egressd does; run no other against "
                        "this cluster")
            await nursery.start(_lead_unelected, parts)
        readiness.synced.set()
        log.info("egressd started", extra={
            "discovery": discovery_url, "metrics": metrics_url,
            "gateway": gateway_url or "off",
            "namespace": settings.namespace or "(all)",
            "auth": "token" if inputs.discovery_token is not None else "none",
            "leader_election": (f"{leader_namespace}/{lease_name}" if leader_elect
                                else "off"),
            "providers": len(registry)})
        task_status.started(DaemonAddresses(discovery_url=discovery_url,
                                            metrics_url=metrics_url, gateway_url=gateway_url))


async def _start_gateway(nursery: trio.Nursery, inputs: Inputs, *,
                         source: InformerProxySource, store: LeaseStore) -> str | None:
    """The gateway on every replica (issue 15), like the discovery API after the caches."""
    settings = inputs.settings
    if settings.gateway_addr is None:
        return None
    assert inputs.discovery_token is not None  # load_inputs refuses a gateway without one
    gateway = Gateway(fleet=SourceFleet(source), store=store, token=inputs.discovery_token,
                      config=GatewayConfig.from_settings(settings),
                      sessions=Sessions(idle=settings.gateway_session_idle))
    url: str = await nursery.start(
        gateway.serve, listen(settings.gateway_addr, backlog=settings.listen_backlog))
    return url


async def run_until_signalled(inputs: Inputs, *, environ: Mapping[str, str]) -> None:
    """`egressd run` under trio: the daemon until SIGINT or SIGTERM cancels it.

    A ConfigError at start is raised bare (not in an exception group) so the
    command can print it as one line.
    """
    failure: ConfigError | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with trio.open_nursery() as nursery:
                async def stop_on_signal() -> None:
                    async for signum in signals:
                        log.info("stopping", extra={"signal": signal.Signals(signum).name})
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(stop_on_signal)
                await run_daemon(inputs, environ=environ)
                nursery.cancel_scope.cancel()  # not reached: the daemon runs until cancelled
        except* ConfigError as group:
            failure = _first_leaf(group)
    if failure is not None:
        raise failure


def _first_leaf(group: BaseExceptionGroup[ConfigError]) -> ConfigError:
    first = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first
