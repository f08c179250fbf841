"""The gateway in a running daemon, used as a user would: curl and Python `requests`
with nothing but a proxy URL (issue 15 items 1 and 9).

The daemon runs against the project's fake API server with an External Proxy
on a real tinyproxy and a trustme TLS target; the clients are real programs.
"""

from __future__ import annotations

import functools
import socket
import ssl
from pathlib import Path

import pytest
import requests
import trio
import trustme

from egressd.app import DaemonAddresses, load_inputs, run_daemon, run_until_signalled
from egressd.errors import ConfigError
from egressd.kube.client import KubeClient
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES
from egressd.sandbox.apiserver import FakeApiServer
from egressd.settings import parse_settings
from tests.gateway.support import TOKEN
from tests.health.peers import ProxyProcess, serve_target


def daemon_settings(kubeconfig: str, ca_file: str, token_file: Path | None) -> list[str]:
    args = ["--kubeconfig", kubeconfig, "--discovery-addr", "127.0.0.1:0",
            "--metrics-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0",
            "--shutdown-grace", "1s", "--probe-ca-file", ca_file]
    if token_file is not None:
        args += ["--discovery-token-file", str(token_file)]
    return args


def test_a_gateway_without_a_token_does_not_start(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")
    settings = parse_settings(daemon_settings(str(kubeconfig), "", None), environ={})
    with pytest.raises(ConfigError, match="never an open proxy"):
        load_inputs(settings, {})


async def test_curl_and_requests_through_the_daemons_gateway(
        apiserver: FakeApiServer, kube_client: KubeClient, ca: trustme.CA,
        server_ssl: ssl.SSLContext, tinyproxy: ProxyProcess, tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    inputs = load_inputs(parse_settings(
        daemon_settings(kubeconfig, str(ca_file), token_file), environ={}), {})
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            target = await nursery.start(serve_target, 204, server_ssl)
            url = f"https://127.0.0.1:{target.port}/"
            ready = trio.Event()
            proxies = Informer(PROXIES)

            def on_update(_old: dict[str, object], new: dict[str, object]) -> None:
                if (new.get("status") or {}).get("phase") == "Ready":  # type: ignore[union-attr]
                    ready.set()

            proxies.add_handler(on_update=on_update)
            await nursery.start(proxies.run, kube_client)
            addrs: DaemonAddresses = await nursery.start(functools.partial(
                run_daemon, inputs, environ={}))
            assert addrs.gateway_url is not None
            apiserver.create({
                "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                "metadata": {"name": "tiny", "namespace": "default"},
                "spec": {"mode": "External", "attributes": {"region": "eu"},
                         "endpoint": {"host": tinyproxy.host, "port": tinyproxy.port},
                         "healthCheck": {"probeURL": url}}})
            await ready.wait()
            hostport = addrs.gateway_url.removeprefix("http://")
            proxy_url = f"http://session=e2e,region=eu:{TOKEN}@{hostport}"

            # curl: a proxy URL, nothing else. -w prints the tunnel's status and ours.
            done = await trio.run_process(
                ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_connect} %{http_code}",
                 "-x", proxy_url, "--cacert", str(ca_file), url],
                capture_stdout=True, capture_stderr=True, check=False)
            assert done.returncode == 0, done.stderr
            assert done.stdout.decode() == "200 204"
            # A wrong token is a 407 from the gateway, and curl says so.
            done = await trio.run_process(
                ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_connect}",
                 "-x", f"http://egressd:nope@{hostport}", "--cacert", str(ca_file), url],
                capture_stdout=True, capture_stderr=True, check=False)
            assert done.returncode != 0 and done.stdout.decode() == "407"

            # requests (blocking, so in a thread): https via CONNECT, and plain http.
            def with_requests() -> tuple[int, int]:
                with requests.Session() as session:
                    session.proxies = {"https": proxy_url, "http": proxy_url}
                    tls = session.get(url, verify=str(ca_file), timeout=10)
                    plain = session.get(f"http://127.0.0.1:{plain_port}/", timeout=10)
                    return tls.status_code, plain.status_code

            plain_target = await nursery.start(serve_target, 200)
            plain_port = plain_target.port
            assert await trio.to_thread.run_sync(with_requests) == (204, 200)
            assert plain_target.requests, "the plain request went through the gateway"
            nursery.cancel_scope.cancel()


async def test_a_taken_gateway_port_stops_the_start_with_one_line(
        apiserver: FakeApiServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = daemon_settings(kubeconfig, "", token_file)
        args[args.index("--gateway-addr") + 1] = f"127.0.0.1:{port}"
        args = [a for a in args if a not in ("--probe-ca-file", "")]
        inputs = load_inputs(parse_settings(args, environ={}), {})
        with trio.fail_after(20), pytest.raises(ConfigError) as caught:
            await run_until_signalled(inputs, environ={})
    assert str(caught.value) == (f"--gateway-addr 127.0.0.1:{port}: cannot listen: "
                                 "Address already in use")
