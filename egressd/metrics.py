"""Every Prometheus metric egressd exports (docs/reference.md), on one registry.

Metrics are module-level because a metric is process-global by nature; they
live on `REGISTRY` rather than prometheus-client's default registry so the
ops app exports exactly these and tests can read them back with
`REGISTRY.get_sample_value(...)`.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

_FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

PROXIES = Gauge("egressd_proxies", "Proxies by phase.", ["phase"], registry=REGISTRY)
RECONCILES = Counter(
    "egressd_reconciles_total", "Reconcile passes by result.", ["result"], registry=REGISTRY)
RECONCILE_DURATION = Histogram(
    "egressd_reconcile_duration_seconds", "Duration of one reconcile pass.",
    buckets=_FAST, registry=REGISTRY)
WORKQUEUE_DEPTH = Gauge(
    "egressd_workqueue_depth", "Keys waiting in the work queue.", registry=REGISTRY)
WORKQUEUE_RETRIES = Counter(
    "egressd_workqueue_retries_total", "Keys re-added with backoff.", registry=REGISTRY)
WATCH_RESTARTS = Counter(
    "egressd_watch_restarts_total", "Watch streams restarted, by resource and reason.",
    ["resource", "reason"], registry=REGISTRY)
PROVIDER_CALLS = Counter(
    "egressd_provider_calls_total", "Provider calls by provider, operation and result.",
    ["provider", "op", "result"], registry=REGISTRY)
PROVIDER_CALL_DURATION = Histogram(
    "egressd_provider_call_duration_seconds", "Duration of provider calls.",
    ["provider", "op"], buckets=_FAST, registry=REGISTRY)
PROBES = Counter("egressd_probes_total", "Probes by result.", ["result"], registry=REGISTRY)
PROBE_DURATION = Histogram(
    "egressd_probe_duration_seconds", "Duration of one probe.", buckets=_FAST, registry=REGISTRY)
LEASES_ACTIVE = Gauge("egressd_leases_active", "Leases not yet expired.", registry=REGISTRY)
LEASES_GRANTED = Counter("egressd_leases_granted_total", "Leases granted.", registry=REGISTRY)
LEASES_REFUSED = Counter(
    "egressd_leases_refused_total", "Lease requests refused, by reason.", ["reason"],
    registry=REGISTRY)
REPORTS = Counter("egressd_reports_total", "Lease reports by result.", ["result"],
                  registry=REGISTRY)
COOLDOWNS_ACTIVE = Gauge(
    "egressd_cooldowns_active", "Cooldowns in force.", registry=REGISTRY)
COOLDOWNS_EVICTED = Counter(
    "egressd_cooldowns_evicted_total",
    "Cooldowns dropped because their proxy had --max-cooldowns-per-proxy others.",
    registry=REGISTRY)
ORPHANS_DELETED = Counter(
    "egressd_orphans_deleted_total", "Orphaned instances deleted, by provider.", ["provider"],
    registry=REGISTRY)
LEADER = Gauge("egressd_leader", "1 while this replica is the leader.", registry=REGISTRY)
LOOP_LAG = Histogram(
    "egressd_loop_lag_seconds", "How late the event loop woke a 10 ms sleep (egressd.watchdog).",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=REGISTRY)
LOOP_LAG_P99 = Gauge(
    "egressd_loop_lag_p99_seconds", "99th percentile of the loop lag over the last 10 s.",
    registry=REGISTRY)
LOOP_LAG_MAX = Gauge(
    "egressd_loop_lag_max_seconds", "Largest loop lag over the last 10 s.", registry=REGISTRY)


GATEWAY_TUNNELS_ACTIVE = Gauge(
    "egressd_gateway_tunnels_active", "Gateway tunnels relaying now.", registry=REGISTRY)
GATEWAY_TUNNELS_OPENED = Counter(
    "egressd_gateway_tunnels_opened_total", "Gateway tunnels opened, by kind (connect, http).",
    ["kind"], registry=REGISTRY)
GATEWAY_TUNNELS_REFUSED = Counter(
    "egressd_gateway_tunnels_refused_total", "Gateway requests refused, by reason.",
    ["reason"], registry=REGISTRY)
GATEWAY_UPSTREAM_RETRIES = Counter(
    "egressd_gateway_upstream_retries_total",
    "Gateway tunnels retried on another proxy after an upstream failure.", registry=REGISTRY)
GATEWAY_BYTES = Counter(
    "egressd_gateway_bytes_total",
    "Bytes relayed by the gateway, by direction (upstream = client to proxy).",
    ["direction"], registry=REGISTRY)
GATEWAY_SETUP_DURATION = Histogram(
    "egressd_gateway_setup_duration_seconds",
    "From a gateway client's request head to its tunnel relaying.",
    buckets=(0.0005, 0.001, 0.0025, *_FAST), registry=REGISTRY)
