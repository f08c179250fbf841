"""`egressd sandbox`: the whole system on one machine, no cluster, no internet (docs/reference.md).

The full sandbox runs, in this one process and one nursery: the fake API
server (HTTPS, with the CRD), the local kubelet (Pods of the kubernetes
provider become Squid / tinyproxy processes on 127.0.0.x), a TLS probe
target, one extra local proxy for the External sample (restarted when it
dies: `egressd.sandbox.external`), the sample Proxies,
and the daemon itself (`run_daemon`, the same code as `egressd run`). Once
every sample is Ready it writes `--ready-file` and prints a short guide.

`--api-only` serves just the fake API server with the CRD.

Ctrl-C, SIGTERM or SIGHUP (the terminal closed) cancels the root scope: the
proxy processes are stopped (each in a shielded stop) and the temp files,
kubeconfig and ready file removed before the process exits. A SIGKILLed
sandbox's proxies die with it (their watchdogs) and the next start removes
the temp dirs it left (`egressd.sandbox.orphans`). The daemon's discovery API
and metrics listen on 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import secrets
import signal
import socket
import sys
import urllib.parse
from collections.abc import Sequence
from typing import Any

import attrs
import trio
import yaml

from egressd import logs
from egressd.app import load_inputs, run_daemon
from egressd.backoff import Backoff
from egressd.errors import ConfigError, EgressdError
from egressd.kube.client import KubeClient, open_client
from egressd.kube.config import load_config
from egressd.kube.informer import Informer
from egressd.kube.resources import NAMESPACES, PROXIES
from egressd.providers.config import KUBERNETES
from egressd.sandbox.apiserver import FakeApiServer
from egressd.sandbox.apiserver.tls import write_private
from egressd.sandbox.external import run_external_proxy
from egressd.sandbox.kubelet import AddressPool, LocalKubelet
from egressd.sandbox.localproxy import ProxySoftware, ProxySoftwareMissing, find_proxy_software
from egressd.sandbox.orphans import claimed_temp_dir, remove_stale_temp_dirs
from egressd.sandbox.probe_target import ProbeTargetServer
from egressd.settings import Settings

PROVIDER_NAME = "local"
PROVIDER_NAMESPACE = "egressd-proxies"
"""Where the kubernetes provider makes its Pods (the local kubelet watches it)."""
SAMPLE_NAMESPACE = "default"
PROXY_PORT = 3128
PROBE_INTERVAL = 5
"""Seconds between probes of a sample proxy: Ready within seconds, failures seen soon."""
PROBE_TIMEOUT = 3
READY_WARNING = 60.0
"""After this many seconds without every sample Ready, say which are not (and keep waiting)."""
SHUTDOWN_GRACE = 1.0
"""HTTP grace at stop: a sandbox has no in-flight work worth 10 s of a user's Ctrl-C."""


def _api_only_guide(kubeconfig: str, server: str) -> str:
    return (
        "egressd sandbox (API server only) is running.\n"
        f"  server:     {server}\n"
        f"  kubeconfig: {kubeconfig}\n"
        "Try:\n"
        f"  export KUBECONFIG={kubeconfig}\n"
        "  kubectl get px -A\n"
        "  kubectl apply -f my-proxy.yaml\n"
        "Stop with Ctrl-C.\n"
    )


def _write_ready(ready_file: str | None, ready: dict[str, str]) -> None:
    if ready_file:
        # Write then rename: a script polling for the file never reads half of it.
        partial = ready_file + ".tmp"
        write_private(partial, json.dumps(ready) + "\n")
        os.replace(partial, ready_file)


async def serve_api_only(*, ready_file: str | None, workdir: str,
                         task_status: trio.TaskStatus[dict[str, str]] = trio.TASK_STATUS_IGNORED
                         ) -> None:
    """Serve the fake API server until cancelled; reports {"kubeconfig", "server"}."""
    server = FakeApiServer()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        kubeconfig = server.write_kubeconfig(os.path.join(workdir, "kubeconfig"))
        ready = {"kubeconfig": kubeconfig, "server": url}
        _write_ready(ready_file, ready)
        print(_api_only_guide(kubeconfig, url), flush=True)
        task_status.started(ready)


# --- the full sandbox ---------------------------------------------------------


@attrs.frozen(kw_only=True)
class SandboxInfo:
    """What a running sandbox offers its user (the ready file holds the first four)."""

    discovery_url: str
    metrics_url: str
    token: str = attrs.field(repr=False)
    kubeconfig: str
    probe_url: str
    probe_ca_file: str
    proxies: tuple[str, ...]
    """The sample Proxies, `namespace/name`."""
    gateway_url: str = ""
    """The gateway, `http://HOST:PORT` (no credentials: the token is the password)."""

    def ready_file(self) -> dict[str, str]:
        return {"discoveryUrl": self.discovery_url, "metricsUrl": self.metrics_url,
                "token": self.token, "kubeconfig": self.kubeconfig,
                "probeUrl": self.probe_url, "probeCaFile": self.probe_ca_file,
                "gatewayUrl": self.gateway_url}


def providers_config() -> dict[str, Any]:
    """One kubernetes provider, `local`; its Pods are run by the local kubelet."""
    return {"providers": [{"name": PROVIDER_NAME, "type": KUBERNETES, KUBERNETES: {
        "namespace": PROVIDER_NAMESPACE,
        # Never pulled: the local kubelet runs the proxy on this machine.
        "image": "ubuntu/squid:6.6-24.04_edge"}}]}


def sample_proxies(count: int, *, probe_url: str, external: tuple[str, int]
                   ) -> list[dict[str, Any]]:
    """`count` Managed samples on the local provider plus one External one."""
    health = {"probeURL": probe_url, "intervalSeconds": PROBE_INTERVAL,
              "timeoutSeconds": PROBE_TIMEOUT}

    def proxy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": PROXIES.api_version, "kind": PROXIES.kind,
                "metadata": {"name": name, "namespace": SAMPLE_NAMESPACE},
                "spec": {**spec, "healthCheck": health}}

    samples = [proxy(f"sample-{i}", {
        "mode": "Managed", "provider": PROVIDER_NAME, "port": PROXY_PORT,
        "attributes": {"sandbox": "true", "kind": "managed"}}) for i in range(1, count + 1)]
    host, port = external
    samples.append(proxy("external-1", {
        "mode": "External", "endpoint": {"host": host, "port": port},
        "attributes": {"sandbox": "true", "kind": "external"}}))
    return samples


def check_listen_address(flag: str, addr: str) -> None:
    """Raise ConfigError, naming the flag, when nothing could listen on `addr` now.

    The daemon's servers bind once the whole sandbox is up; checking first
    turns a taken port (another sandbox on :8090) into one clear line at
    start, before any proxy process runs.
    """
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - ":8090" is every interface, as the daemon binds it
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As Hypercorn binds: SO_REUSEADDR, so a port in TIME_WAIT counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except socket.gaierror:
            raise ConfigError(f"{flag} {addr}: unknown host {host!r}") from None
        except OSError as exc:
            hint = ""
            if exc.errno == errno.EADDRINUSE:
                hint = (f" (another egressd sandbox? pick another address, e.g. {flag} "
                        "127.0.0.1:0 for any free port)")
            raise ConfigError(f"{flag} {addr}: cannot listen there: {exc.strerror}{hint}"
                              ) from None


def local_url(url: str) -> str:
    """A URL a local curl can use: a wildcard bind address becomes loopback."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname in ("0.0.0.0", "::", None):  # noqa: S104 - comparing, not binding
        return parts._replace(netloc=f"127.0.0.1:{parts.port}").geturl()
    return url


def guide(info: SandboxInfo) -> str:
    """The short printed guide: where things are and the curl commands to try."""
    api = info.discovery_url
    auth = '-H "Authorization: Bearer $TOKEN"'
    return "\n".join([
        "egressd sandbox is ready: every sample proxy is Ready.",
        f"  kubeconfig:   {info.kubeconfig}",
        f"  discovery:    {api}",
        f"  token:        {info.token}",
        f"  metrics:      {info.metrics_url}/metrics",
        f"  probe target: {info.probe_url} (CA: {info.probe_ca_file})",
        f"  proxies:      {', '.join(info.proxies)}",
        "",
        "Try:",
        f"  export KUBECONFIG={info.kubeconfig} TOKEN={info.token}",
        "  kubectl get px -A                     # or -w to watch, describe, apply -f, delete",
        f"  curl {auth} '{api}/v1/proxies?selector=sandbox=true&healthy=true'",
        f"  curl {auth} -X POST {api}/v1/leases -d '{{\"target\": \"example.org\", "
        '"ttlSeconds": 300}\'',
        f"  curl --proxy PROXY_URL --cacert {info.probe_ca_file} {info.probe_url}",
        f"  curl {auth} -X POST {api}/v1/leases/LEASE_ID/report -d "
        "'{\"result\": \"rate_limited\", \"retryAfterSeconds\": 60}'",
        f"  curl {auth} -X DELETE {api}/v1/leases/LEASE_ID",
        "  (PROXY_URL and LEASE_ID are the proxyUrl and leaseId the lease answer gives.)",
        f"  curl -x http://egressd:$TOKEN@{info.gateway_url.removeprefix('http://')} "
        f"--cacert {info.probe_ca_file} {info.probe_url}",
        "  (the gateway: no lease call at all, one lease per tunnel; docs/gateway.md)",
        "",
        "A Proxy of your own, ready to paste (it probes the local target: the default "
        "probe URL needs internet):",
        own_proxy_command(info.probe_url),
        "Stop with Ctrl-C.",
        "",
    ])


def own_proxy_command(probe_url: str) -> str:
    """`kubectl apply` of a Managed Proxy on the sandbox's provider, as a shell here-document.

    Its probe URL is the sandbox's own target: a Proxy written from the docs
    alone would probe the internet by default, which a sandbox may not reach.
    """
    return "\n".join([
        "kubectl apply -f - <<'EOF'",
        f"apiVersion: {PROXIES.api_version}",
        f"kind: {PROXIES.kind}",
        "metadata:",
        "  name: mine",
        f"  namespace: {SAMPLE_NAMESPACE}",
        "spec:",
        "  mode: Managed",
        f"  provider: {PROVIDER_NAME}",
        "  attributes: {team: me}",
        "  healthCheck:",
        f"    probeURL: {probe_url}",
        f"    intervalSeconds: {PROBE_INTERVAL}",
        f"    timeoutSeconds: {PROBE_TIMEOUT}",
        "EOF",
    ])


async def wait_ready(client: KubeClient, keys: Sequence[str], *,
                     warn_after: float = READY_WARNING) -> None:
    """Return once every Proxy in `keys` has phase Ready (a watch, not a poll).

    After `warn_after` seconds, print which are not Ready yet (once) and keep waiting.
    """
    namespaces = {key.partition("/")[0] for key in keys}
    informer = Informer(PROXIES, namespace=namespaces.pop() if len(namespaces) == 1 else None)
    changed = trio.Event()

    def on_change(*_: object) -> None:
        changed.set()

    def pending() -> list[str]:
        return [key for key in keys
                if ((informer.get(key) or {}).get("status") or {}).get("phase") != "Ready"]

    informer.add_handler(on_add=on_change, on_update=on_change, on_delete=on_change)
    async with trio.open_nursery() as nursery:
        await nursery.start(informer.run, client)
        deadline = trio.current_time() + warn_after
        while pending():
            with trio.move_on_at(deadline) as waiting:
                await changed.wait()
                changed = trio.Event()
            if not waiting.cancelled_caught:
                continue
            deadline = float("inf")  # said once is enough
            states = ", ".join(
                f"{key} ({((informer.get(key) or {}).get('status') or {}).get('phase', '?')})"
                for key in pending())
            print(f"egressd sandbox: still waiting for {states}; "
                  "see `kubectl describe px` for why", file=sys.stderr, flush=True)
        nursery.cancel_scope.cancel()


async def serve_sandbox(
    *,
    proxies: int,
    discovery_addr: str,
    metrics_addr: str,
    ready_file: str | None,
    workdir: str,
    software: ProxySoftware,
    log_level: str = "info",
    external_backoff: Backoff | None = None,
    gateway_addr: str = "127.0.0.1:0",
    task_status: trio.TaskStatus[SandboxInfo] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the full sandbox until cancelled; `started(SandboxInfo)` once every sample is Ready.

    `external_backoff` paces restarts of the External sample's proxy (default:
    `egressd.sandbox.external`'s).
    """
    server = FakeApiServer()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        kubeconfig = server.write_kubeconfig(os.path.join(workdir, "kubeconfig"))
        config = await load_config(kubeconfig=kubeconfig, context=None)
        async with open_client(config) as client:
            await client.create(NAMESPACES, {"metadata": {"name": PROVIDER_NAMESPACE}})
            target = ProbeTargetServer()
            probe_url = await nursery.start(target.serve)
            probe_ca = target.write_ca(os.path.join(workdir, "probe-ca.pem"))
            addresses = AddressPool()
            external = await nursery.start(functools.partial(
                run_external_proxy, software, addresses=addresses, port=PROXY_PORT,
                backoff=external_backoff))
            kubelet = LocalKubelet(client, namespace=PROVIDER_NAMESPACE, software=software,
                                   addresses=addresses)
            await nursery.start(kubelet.run)

            providers_file = os.path.join(workdir, "providers.yaml")
            await trio.Path(providers_file).write_text(
                yaml.safe_dump(providers_config(), sort_keys=False))
            keys = []
            for sample in sample_proxies(proxies, probe_url=probe_url, external=external):
                created = await client.create(PROXIES, sample, namespace=SAMPLE_NAMESPACE)
                keys.append(f"{SAMPLE_NAMESPACE}/{created['metadata']['name']}")

            token = secrets.token_urlsafe(24)
            environ = {"DISCOVERY_TOKEN": token}
            inputs = await trio.to_thread.run_sync(load_inputs, Settings(
                kubeconfig=kubeconfig, providers_config=providers_file, probe_ca_file=probe_ca,
                discovery_addr=discovery_addr, metrics_addr=metrics_addr,
                gateway_addr=gateway_addr,
                provisioning_poll=1.0, cluster_name="sandbox", shutdown_grace=SHUTDOWN_GRACE,
                log_level=log_level), environ)
            daemon = await nursery.start(functools.partial(run_daemon, inputs, environ=environ))
            await wait_ready(client, keys)
            info = SandboxInfo(
                discovery_url=local_url(daemon.discovery_url),
                metrics_url=local_url(daemon.metrics_url), token=token, kubeconfig=kubeconfig,
                probe_url=probe_url, probe_ca_file=probe_ca, proxies=tuple(keys),
                gateway_url=local_url(daemon.gateway_url or ""))
            _write_ready(ready_file, info.ready_file())
            print(guide(info), flush=True)
            task_status.started(info)
            await trio.sleep_forever()


# --- entry point --------------------------------------------------------------


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, a stop, and a closed terminal: each stops the sandbox and all it started."""


async def _until_signalled(service: functools.partial[Any]) -> None:
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:
            async def stop_on_signal() -> None:
                # Watching from the start: a signal while the sandbox is still
                # coming up (samples not Ready yet) must stop it too.
                async for _ in signals:
                    print("stopping", file=sys.stderr, flush=True)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            await nursery.start(service)


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    """The errors of a group, nested groups (one per nursery they crossed) flattened."""
    return [leaf for error in group.exceptions
            for leaf in (_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])]


DISCOVERY_ADDR = "127.0.0.1:8090"
"""The sandbox's default discovery address: loopback, as it prints a token-protected
API for this machine's user, not a service for the network (`egressd run`: :8090)."""
METRICS_ADDR = "127.0.0.1:8080"
GATEWAY_ADDR = "127.0.0.1:3129"
"""The sandbox gateway's default address (not 3128: a system Squid may hold *:3128)."""


def sandbox_main(*, api_only: bool, ready_file: str | None, proxies: int, log_level: str,
                 discovery_addr: str = DISCOVERY_ADDR, metrics_addr: str = METRICS_ADDR,
                 gateway_addr: str = GATEWAY_ADDR) -> int:
    """Entry point of `egressd sandbox`; returns the exit code."""
    logs.setup(log_level)
    if api_only:
        service_factory = functools.partial(serve_api_only, ready_file=ready_file)
    else:
        if proxies < 0:
            print("egressd sandbox: --proxies must be 0 or more", file=sys.stderr)
            return 2
        try:
            software = find_proxy_software()
            check_listen_address("--discovery-addr", discovery_addr)
            check_listen_address("--metrics-addr", metrics_addr)
            check_listen_address("--gateway-addr", gateway_addr)
        except ProxySoftwareMissing as exc:
            print(f"egressd sandbox: {exc}", file=sys.stderr)
            return 1
        except ConfigError as exc:
            print(f"egressd sandbox: {exc}", file=sys.stderr)
            return 2
        service_factory = functools.partial(
            serve_sandbox, proxies=proxies, discovery_addr=discovery_addr,
            metrics_addr=metrics_addr, ready_file=ready_file, software=software,
            log_level=log_level, gateway_addr=gateway_addr)
    code = 0
    remove_stale_temp_dirs()  # what a killed sandbox left (its proxies died with it)
    with claimed_temp_dir("egressd-sandbox-") as workdir:
        try:
            trio.run(_until_signalled, functools.partial(service_factory, workdir=workdir))
        except* ConfigError as group:
            for error in _leaves(group):
                print(f"egressd sandbox: {error}", file=sys.stderr)
            code = 2
        except* EgressdError as failures:
            # A situation we name (a proxy that cannot start, no address free
            # for one): its message says it all, a traceback would bury it.
            for failure in _leaves(failures):
                print(f"egressd sandbox: {failure}", file=sys.stderr)
            code = 1
        finally:
            if ready_file and os.path.exists(ready_file):
                os.unlink(ready_file)
    return code
