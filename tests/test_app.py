"""The daemon (`egressd run`) end to end on loopback: the fake API server, real HTTP,
a real tinyproxy and a trustme TLS probe target, real leader election.

Every daemon listens on port 0; waits are on watch events (an informer of the
test's own), never on sleeps.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trustme

from egressd.app import DaemonAddresses, Inputs, load_inputs, run_daemon
from egressd.errors import ConfigError
from egressd.kube.client import KubeClient
from egressd.kube.errors import NotFound
from egressd.kube.informer import Informer
from egressd.kube.resources import LEASES, PODS, PROXIES, SECRETS
from egressd.model.constants import CLOUD_INIT_LABEL
from egressd.sandbox.apiserver import FakeApiServer
from egressd.sandbox.apiserver.tls import kubeconfig as kubeconfig_text
from egressd.sandbox.apiserver.tls import write_private
from egressd.settings import parse_settings
from tests.health.peers import ProxyProcess, find_binary, run_tinyproxy, serve_target

TOKEN = "discovery-s3cret-token"

Obj = dict[str, Any]


def daemon_inputs(kubeconfig: str, *extra: str, environ: dict[str, str] | None = None
                  ) -> Inputs:
    settings = parse_settings(
        ["--kubeconfig", kubeconfig, "--discovery-addr", "127.0.0.1:0",
         "--metrics-addr", "127.0.0.1:0", "--shutdown-grace", "2s", *extra],
        environ={})
    return load_inputs(settings, environ or {})


@pytest.fixture
def kubeconfig(apiserver: FakeApiServer, tmp_path: Path) -> str:
    return apiserver.write_kubeconfig(tmp_path / "daemon-kubeconfig")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture(scope="module")
def tinyproxy() -> Iterator[ProxyProcess]:
    if find_binary("tinyproxy") is None:
        pytest.skip("tinyproxy is not installed (apt-get install tinyproxy)")
    with run_tinyproxy() as proc:
        yield proc


async def wait_for(informer: Informer, key: str, check: Callable[[Obj], bool]) -> Obj:
    """The first version of `key` (cached now, or delivered later) that passes `check`."""
    seen = trio.Event()
    found: list[Obj] = []

    def look(obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        if f"{meta.get('namespace')}/{meta.get('name')}" == key and check(obj):
            found.append(obj)
            seen.set()

    informer.add_handler(on_add=look, on_update=lambda _old, new: look(new))
    await seen.wait()
    return found[0]


async def watching(nursery: trio.Nursery, client: KubeClient, informer: Informer) -> Informer:
    await nursery.start(informer.run, client)
    return informer


def holder(lease: Obj) -> str:
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def condition(obj: Obj, kind: str) -> Obj:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def provisioned(obj: Obj) -> bool:
    return condition(obj, "Provisioned").get("status") == "True"


def external(namespace: str, name: str) -> Obj:
    return {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"mode": "External", "endpoint": {"host": "127.0.0.1", "port": 9}}}


def namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


class LogEvents(logging.Handler):
    """Keeps the daemon's log records and lets a test wait for a message (the daemon
    logs from the test's own thread, so a trio.Event can be set here)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._waiting: dict[str, trio.Event] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        event = self._waiting.get(record.getMessage())
        if event is not None:
            event.set()

    def with_message(self, message: str) -> list[logging.LogRecord]:
        return [r for r in self.records if r.getMessage() == message]

    async def wait(self, message: str) -> None:
        if not self.with_message(message):
            await self._waiting.setdefault(message, trio.Event()).wait()


@pytest.fixture
def log_events() -> Iterator[LogEvents]:
    logger = logging.getLogger("egressd")
    handler, level = LogEvents(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_daemon_serves_readyz_metrics_and_warns_once_without_a_token(
    kubeconfig: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="egressd")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            addrs: DaemonAddresses = await nursery.start(functools.partial(
                run_daemon, daemon_inputs(kubeconfig), environ={}))
            async with httpx.AsyncClient() as http:
                ready = await http.get(f"{addrs.metrics_url}/readyz")
                assert ready.status_code == 200
                metrics = await http.get(f"{addrs.metrics_url}/metrics")
                assert metrics.status_code == 200
                assert "egressd_leases_active" in metrics.text
                assert "egressd_workqueue_depth" in metrics.text
                # The loop watchdog runs in the daemon (issue 12 item 4).
                assert "egressd_loop_lag_max_seconds" in metrics.text
                listed = await http.get(f"{addrs.discovery_url}/v1/proxies")
                assert listed.status_code == 200
                assert listed.json() == {"items": []}
            nursery.cancel_scope.cancel()
    warnings = [r for r in caplog.records if "UNAUTHENTICATED" in r.getMessage()]
    assert len(warnings) == 1
    started = [r for r in caplog.records if r.getMessage() == "egressd started"]
    assert len(started) == 1
    assert started[0].__dict__["discovery"] == addrs.discovery_url


async def test_readyz_and_the_discovery_api_wait_for_the_caches(
    apiserver: FakeApiServer, kubeconfig: str, log_events: LogEvents,
) -> None:
    # The Proxy list is refused (403) until the test lets it through.
    refusal = apiserver.faults.fail_next(10**6, code=403, resource="proxies", watch=False)
    started = trio.Event()
    got: list[DaemonAddresses] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            async def start() -> None:
                got.append(await nursery.start(functools.partial(
                    run_daemon, daemon_inputs(kubeconfig), environ={})))
                started.set()

            nursery.start_soon(start)
            await log_events.wait("list failed, retrying")
            # Only the ops server listens yet: live, not ready.
            (ops,) = log_events.with_message("listening")
            ops_url = ops.__dict__["urls"]
            async with httpx.AsyncClient() as http:
                assert (await http.get(f"{ops_url}/healthz")).status_code == 200
                not_ready = await http.get(f"{ops_url}/readyz")
                assert not_ready.status_code == 503
                assert not_ready.json()["error"] == "not_ready"
                assert not started.is_set()
                refusal.remaining = 0
                await started.wait()
                (addrs,) = got
                assert addrs.metrics_url == ops_url
                assert [r.__dict__["urls"] for r in log_events.with_message("listening")] == [
                    ops_url, addrs.discovery_url]
                assert (await http.get(f"{ops_url}/readyz")).status_code == 200
            nursery.cancel_scope.cancel()


async def test_leader_election_is_on_by_default_outside_a_pod(
    apiserver: FakeApiServer, kubeconfig: str, kube_client: KubeClient, log_events: LogEvents,
) -> None:
    """A developer's `egressd run --kubeconfig` campaigns like a replica in a Pod."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            leases = await watching(nursery, kube_client, Informer(LEASES, namespace="default"))
            await nursery.start(functools.partial(
                run_daemon, daemon_inputs(kubeconfig), environ={}))
            await wait_for(leases, "default/egressd", lambda o: bool(holder(o)))
            await log_events.wait("became leader")
            nursery.cancel_scope.cancel()
    assert not [r for r in log_events.records if "leader election is off" in r.getMessage()]


@pytest.mark.parametrize("flag", [("--leader-elect=false",), ("--no-leader-elect",),
                                  ("--leader-elect", "false")])
async def test_election_off_is_explicit_and_warns(
    apiserver: FakeApiServer, kubeconfig: str, kube_client: KubeClient, log_events: LogEvents,
    flag: tuple[str, ...],
) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            proxies = await watching(nursery, kube_client, Informer(PROXIES))
            await nursery.start(functools.partial(
                run_daemon, daemon_inputs(kubeconfig, *flag), environ={}))
            apiserver.create(external("default", "solo"))
            # It reconciles (it leads) without ever writing a Lease.
            await wait_for(proxies, "default/solo", provisioned)
            assert (await kube_client.list(LEASES)).items == []
            nursery.cancel_scope.cancel()
    (warning,) = [r for r in log_events.records if "leader election is off" in r.getMessage()]
    assert warning.levelno == logging.WARNING


async def test_in_a_pod_election_is_on_in_the_context_namespace(
    apiserver: FakeApiServer, kube_client: KubeClient, tmp_path: Path,
) -> None:
    apiserver.create(namespace("ops"))
    path = str(tmp_path / "kubeconfig")
    write_private(path, kubeconfig_text(server=apiserver.url, ca_pem=apiserver.ca_pem,
                                        token=apiserver.token, context="c", namespace="ops"))
    pod_environment = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            leases = await watching(nursery, kube_client, Informer(LEASES))
            await nursery.start(functools.partial(
                run_daemon, daemon_inputs(path, "--leader-retry-period", "200ms"),
                environ=pod_environment))
            await wait_for(leases, "ops/egressd", lambda o: bool(holder(o)))
            nursery.cancel_scope.cancel()


async def test_a_namespace_restricted_daemon_sees_only_its_namespace(
    apiserver: FakeApiServer, kubeconfig: str, kube_client: KubeClient, tmp_path: Path,
) -> None:
    for name in ("team-a", "team-b", "pods"):
        apiserver.create(namespace(name))
    providers = tmp_path / "providers.yaml"
    providers.write_text("providers:\n  - name: pods\n    type: kubernetes\n"
                         "    kubernetes: {namespace: pods, image: squid}\n")
    apiserver.create(external("team-a", "mine"))
    apiserver.create(external("team-b", "theirs"))
    # A Secret without the cloud-init label is invisible to the daemon.
    apiserver.create({"apiVersion": "v1", "kind": "Secret",
                      "metadata": {"name": "boot", "namespace": "team-a"},
                      "stringData": {"user-data": "#cloud-config"}})
    apiserver.create({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "managed", "namespace": "team-a"},
        "spec": {"mode": "Managed", "provider": "pods",
                 "cloudInit": {"secretRef": {"name": "boot"}}}})
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            proxies = await watching(nursery, kube_client, Informer(PROXIES))
            addrs: DaemonAddresses = await nursery.start(functools.partial(
                run_daemon,
                daemon_inputs(kubeconfig, "--namespace", "team-a",
                              "--providers-config", str(providers), *ELECTION),
                environ={}))
            await wait_for(proxies, "team-a/mine", provisioned)
            async with httpx.AsyncClient() as http:
                listed = await http.get(f"{addrs.discovery_url}/v1/proxies")
            assert [(p["namespace"], p["name"]) for p in listed.json()["items"]] == [
                ("team-a", "managed"), ("team-a", "mine")]
            # Its own Lease: a daemon watching another namespace does not compete for it.
            lease = await kube_client.get(LEASES, "egressd-team-a", namespace="default")
            assert holder(lease)
            with pytest.raises(NotFound):
                await kube_client.get(LEASES, "egressd", namespace="default")

            await wait_for(proxies, "team-a/managed", lambda o: condition(
                o, "Provisioned").get("reason") == "CloudInitUnresolved")
            await kube_client.merge_patch(SECRETS, "boot", {"metadata": {"labels": {
                CLOUD_INIT_LABEL: "true"}}}, namespace="team-a")
            # Labelled, the Secret reaches the cache and the Proxy moves on to its instance.
            await wait_for(proxies, "team-a/managed",
                           lambda o: bool((o.get("status") or {}).get("providerID")))
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--default-lease-ttl", "2h"], "--default-lease-ttl 2h is longer than --max-lease-ttl 1h"),
        (["--leader-renew-deadline", "20s"],
         "need --leader-retry-period (2s) < --leader-renew-deadline (20s) < "
         "--leader-lease-duration (15s)"),
    ],
)
def test_inconsistent_flags_stop_the_start(flags: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_inputs(parse_settings(flags, environ={}), {})
    assert str(caught.value) == needle


async def test_external_proxy_through_tinyproxy_becomes_ready_and_is_leased(
    apiserver: FakeApiServer, kubeconfig: str, kube_client: KubeClient, ca: trustme.CA,
    ca_file: str, tinyproxy: ProxyProcess, tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ssl)
    with trio.fail_after(25):
        async with trio.open_nursery() as nursery:
            target = await nursery.start(serve_target, 204, server_ssl)
            proxies = await watching(nursery, kube_client, Informer(PROXIES))
            addrs: DaemonAddresses = await nursery.start(functools.partial(
                run_daemon,
                daemon_inputs(kubeconfig, "--probe-ca-file", ca_file,
                              "--discovery-token-file", str(token_file)),
                environ={}))
            apiserver.create({
                "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                "metadata": {"name": "ext", "namespace": "default"},
                "spec": {"mode": "External", "attributes": {"region": "eu"},
                         "endpoint": {"host": tinyproxy.host, "port": tinyproxy.port},
                         "healthCheck": {"probeURL": f"https://127.0.0.1:{target.port}/"}}})
            ready = await wait_for(proxies, "default/ext",
                                   lambda o: (o.get("status") or {}).get("phase") == "Ready")
            assert ready["status"]["host"] == tinyproxy.host
            assert target.requests, "the probe went through tinyproxy to the TLS target"
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                refused = await http.post(f"{addrs.discovery_url}/v1/leases", json={},
                                          headers={"Authorization": "Bearer wrong"})
                assert refused.status_code == 401
                granted = await http.post(f"{addrs.discovery_url}/v1/leases",
                                          json={"selector": {"region": "eu"}})
                assert granted.status_code == 201, granted.text
                body = granted.json()
                assert body["proxyUrl"] == f"http://{tinyproxy.host}:{tinyproxy.port}"
                assert body["proxy"]["name"] == "ext"
            nursery.cancel_scope.cancel()


async def test_proxy_error_reports_turn_a_proxy_unhealthy_through_the_leaders_engine(
    apiserver: FakeApiServer, kubeconfig: str, kube_client: KubeClient, ca: trustme.CA,
    ca_file: str, tinyproxy: ProxyProcess,
) -> None:
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ssl)
    with trio.fail_after(25):
        async with trio.open_nursery() as nursery:
            target = await nursery.start(serve_target, 204, server_ssl)
            proxies = await watching(nursery, kube_client, Informer(PROXIES))
            addrs: DaemonAddresses = await nursery.start(functools.partial(
                run_daemon, daemon_inputs(kubeconfig, "--probe-ca-file", ca_file),
                environ={}))
            apiserver.create({
                "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                "metadata": {"name": "flaky", "namespace": "default"},
                "spec": {"mode": "External",
                         "endpoint": {"host": tinyproxy.host, "port": tinyproxy.port},
                         # One probe now, the next one long after this test.
                         "healthCheck": {"probeURL": f"https://127.0.0.1:{target.port}/",
                                         "intervalSeconds": 3600, "failureThreshold": 2}}})
            await wait_for(proxies, "default/flaky",
                           lambda o: (o.get("status") or {}).get("phase") == "Ready")
            async with httpx.AsyncClient(base_url=addrs.discovery_url) as http:
                first = (await http.post("/v1/leases", json={})).json()["leaseId"]
                for _ in range(3):  # one lease counts once
                    r = await http.post(f"/v1/leases/{first}/report",
                                        json={"result": "proxy_error"})
                    assert r.status_code == 204
                await trio.sleep(0.3)
                assert condition(proxies.get("default/flaky") or {}, "Healthy")["status"] == "True"
                second = (await http.post("/v1/leases", json={})).json()["leaseId"]
                r = await http.post(f"/v1/leases/{second}/report",
                                    json={"result": "proxy_error"})
                assert r.status_code == 204
            unhealthy = await wait_for(
                proxies, "default/flaky",
                lambda o: (o.get("status") or {}).get("phase") == "Unhealthy")
            assert "proxy_error" in condition(unhealthy, "Healthy")["message"]
            assert (unhealthy["status"].get("cooldowns") or {}) == {}
            nursery.cancel_scope.cancel()


ELECTION = ("--leader-elect", "true", "--leader-lease-duration", "15s",
            "--leader-renew-deadline", "10s", "--leader-retry-period", "200ms")


async def test_two_daemons_one_leader_and_the_standby_takes_over_at_once(
    apiserver: FakeApiServer, kubeconfig: str, kube_client: KubeClient,
) -> None:
    # Takeover well inside the 15 s lease duration shows the leader released its Lease.
    with trio.fail_after(12):
        async with trio.open_nursery() as nursery:
            leases = await watching(nursery, kube_client, Informer(LEASES, namespace="default"))
            proxies = await watching(nursery, kube_client, Informer(PROXIES))
            first = trio.CancelScope()
            inputs = daemon_inputs(kubeconfig, *ELECTION)

            async def run_first(task_status: trio.TaskStatus[DaemonAddresses]) -> None:
                with first:
                    await run_daemon(inputs, environ={}, task_status=task_status)

            await nursery.start(run_first)
            lease = await wait_for(leases, "default/egressd", lambda o: bool(holder(o)))
            leader = holder(lease)
            await nursery.start(functools.partial(run_daemon, inputs, environ={}))
            # The standby campaigns every 200 ms and must find the Lease held.
            with trio.move_on_after(1):
                await wait_for(leases, "default/egressd", lambda o: holder(o) != leader)
                pytest.fail("the standby took a Lease that was held")
            first.cancel()
            taken = await wait_for(leases, "default/egressd",
                                   lambda o: holder(o) not in ("", leader))
            assert taken["spec"]["leaseTransitions"] >= 1
            # The new leader reconciles: an External proxy gets its Provisioned condition.
            apiserver.create(external("default", "after-takeover"))
            await wait_for(proxies, "default/after-takeover", provisioned)
            nursery.cancel_scope.cancel()


async def read_log(stream: trio.abc.ReceiveStream, log: bytearray, marker: bytes,
                   seen: trio.Event) -> None:
    """Collect a process's stderr into `log`; set `seen` once `marker` is in it."""
    async for chunk in stream:
        log.extend(chunk)
        if marker in log:
            seen.set()


async def test_run_command_stops_on_sigterm_and_releases_its_lease(
    kubeconfig: str, kube_client: KubeClient, tmp_path: Path,
) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "DISCOVERY_TOKEN": TOKEN}
    api_token = (await kube_client.config.credentials.header() or "").split()[-1]
    output = bytearray()
    leading = trio.Event()
    with trio.fail_after(25):
        async with trio.open_nursery() as nursery:
            leases = await watching(nursery, kube_client, Informer(LEASES, namespace="default"))
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "egressd", "run", "--kubeconfig", kubeconfig,
                 "--discovery-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
                 "--shutdown-grace", "2s", "--log-level", "debug", *ELECTION],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            assert proc.stderr is not None
            nursery.start_soon(read_log, proc.stderr, output, b"became leader", leading)
            try:
                # Its log, not the Lease: the Lease shows the holder as soon as the write
                # lands, before the process has read the answer and knows it leads.
                await leading.wait()
                await wait_for(leases, "default/egressd", lambda o: bool(holder(o)))
                proc.send_signal(signal.SIGTERM)
                # Grace 2 s plus one API call; the fail_after above is the hard bound.
                with trio.fail_after(8):
                    code = await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            # Released: an empty holder, so a standby need not wait out the duration.
            released = await wait_for(leases, "default/egressd", lambda o: not holder(o))
            assert released["spec"]["leaseDurationSeconds"] == 1
            nursery.cancel_scope.cancel()
    log = output.decode(errors="replace")
    assert code == 0, log
    assert "egressd started" in log
    assert "released the leader lease" in log, log
    assert TOKEN not in log
    assert api_token not in log


def test_a_provider_that_cannot_be_built_exits_2_with_one_line(tmp_path: Path) -> None:
    # The kubeconfig loads (nothing listens at its server; nothing connects before the
    # providers are built); the gcp provider's key file is not a key, which only the
    # build, inside the daemon's nursery, finds out.
    config = tmp_path / "kubeconfig"
    ca = trustme.CA()
    write_private(str(config), kubeconfig_text(server="https://127.0.0.1:1",
                                               ca_pem=ca.cert_pem.bytes(), token="t",
                                               context="c"))
    key = tmp_path / "key.json"
    key.write_text("{}")
    providers = tmp_path / "providers.yaml"
    providers.write_text(
        "providers:\n  - name: g\n    type: gcp\n"
        "    gcp: {project: my-project, zone: europe-west1-b, machineType: e2-micro, "
        f"image: debian-12, credentialsFile: {key}}}\n")
    out = subprocess.run(
        [sys.executable, "-m", "egressd", "run", "--kubeconfig", str(config),
         "--providers-config", str(providers)],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DISCOVERY_TOKEN": TOKEN})
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("egressd: error: provider 'g': no usable Google credentials")
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_run_without_any_kubeconfig_exits_2_with_one_line(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "egressd", "run", "--discovery-token-file", str(token)],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("egressd: error: kubeconfig ")
    assert len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr
    assert TOKEN not in out.stderr


async def test_the_daemon_replaces_a_deleted_pod_from_its_pod_watch(
    apiserver: FakeApiServer, kubeconfig: str, kube_client: KubeClient, tmp_path: Path,
) -> None:
    # The poll and resync are beyond the deadline: only the daemon's Pod informer
    # (by the GC labels, in the provider's namespace) can bring the pass.
    apiserver.create(namespace("pods"))
    providers = tmp_path / "providers.yaml"
    providers.write_text("providers:\n  - name: pods\n    type: kubernetes\n"
                         "    kubernetes: {namespace: pods, image: squid}\n")
    apiserver.create({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "managed", "namespace": "default"},
        "spec": {"mode": "Managed", "provider": "pods",
                 "cloudInit": {"inline": "#cloud-config"}}})
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            proxies = await watching(nursery, kube_client, Informer(PROXIES))
            pods = await watching(nursery, kube_client, Informer(PODS, namespace="pods"))
            await nursery.start(functools.partial(
                run_daemon, daemon_inputs(
                    kubeconfig, "--providers-config", str(providers),
                    "--provisioning-poll", "5m", "--ready-resync", "5m", *ELECTION),
                environ={}))
            proxy = await wait_for(proxies, "default/managed",
                                   lambda o: bool((o.get("status") or {}).get("providerID")))
            name = proxy["status"]["providerID"].partition("/")[2]
            first = await wait_for(pods, f"pods/{name}", lambda _o: True)
            await kube_client.delete(PODS, name, namespace="pods")
            await wait_for(pods, f"pods/{name}", lambda o: (
                o["metadata"]["uid"] != first["metadata"]["uid"]))
            nursery.cancel_scope.cancel()


def _listen_backlog(url: str) -> int:
    """The backlog the socket behind `url` listens with (`ss` shows it as Send-Q)."""
    port = url.rsplit(":", 1)[1]
    fields = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                            text=True, check=True, timeout=10).stdout.split()
    assert fields[0] == "LISTEN", fields
    return int(fields[2])


async def test_listen_backlog_reaches_the_discovery_and_metrics_sockets(
        kubeconfig: str) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            addrs: DaemonAddresses = await nursery.start(functools.partial(
                run_daemon, daemon_inputs(kubeconfig, "--listen-backlog", "77"), environ={}))
            assert _listen_backlog(addrs.discovery_url) == 77
            assert _listen_backlog(addrs.metrics_url) == 77
            nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            addrs = await nursery.start(functools.partial(
                run_daemon, daemon_inputs(kubeconfig), environ={}))
            # The default, 1024, unless the kernel's somaxconn is lower.
            assert _listen_backlog(addrs.discovery_url) == min(1024, _somaxconn())
            nursery.cancel_scope.cancel()


def _somaxconn() -> int:
    return int(Path("/proc/sys/net/core/somaxconn").read_text().strip())
