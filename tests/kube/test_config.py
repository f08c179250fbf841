"""Config loading: kubeconfig (token, client cert, exec plugin), in-cluster, bad input."""

from __future__ import annotations

import functools
import json
import re
import ssl
import sys
from pathlib import Path

import pytest
import trio
import trustme

from egressd.errors import ConfigError
from egressd.kube.client import open_client
from egressd.kube.config import load_config, load_incluster_config
from egressd.kube.resources import Resource
from tests.fixtures.kube import FAST_RETRY, b64, write_kubeconfig

WHOAMI = Resource("test.example.com", "v1", "whoamis", "WhoAmI")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


async def test_token_kubeconfig(ca: trustme.CA, tmp_path: Path) -> None:
    path = write_kubeconfig(
        tmp_path / "config", server="https://127.0.0.1:6443/", ca_pem=ca.cert_pem.bytes(),
        user={"token": "s3cret-token"}, namespace="crawl")
    cfg = await load_config(kubeconfig=str(path), context=None)
    assert cfg.server == "https://127.0.0.1:6443"
    assert cfg.ca_data == ca.cert_pem.bytes().decode()
    assert cfg.verify is True
    assert cfg.client_cert_file is None
    assert cfg.namespace == "crawl"
    assert str(path) in cfg.source
    assert await cfg.credentials.header() == "Bearer s3cret-token"
    assert "s3cret" not in repr(cfg)


async def test_context_selects_and_kubeconfig_env_is_default(
    ca: trustme.CA, tmp_path: Path
) -> None:
    path = write_kubeconfig(
        tmp_path / "config", server="https://127.0.0.1:6443", ca_pem=ca.cert_pem.bytes(),
        user={"token": "t"}, context="one", extra_contexts=("two",))
    cfg = await load_config(kubeconfig=None, context="two", environ={"KUBECONFIG": str(path)})
    assert "(context two)" in cfg.source
    with pytest.raises(ConfigError, match="three"):
        await load_config(kubeconfig=str(path), context="three")


async def test_missing_kubeconfig_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=re.escape(str(missing))):
        await load_config(kubeconfig=str(missing), context=None)
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        await load_config(kubeconfig=None, context=None, environ={"KUBECONFIG": str(missing)})


@pytest.mark.parametrize("text", ["", "clusters: [\n", "just a string", "kind: Config\n"])
async def test_malformed_kubeconfig_names_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"broken\.yaml"):
        await load_config(kubeconfig=str(path), context=None)


async def test_context_with_a_missing_user_is_refused(ca: trustme.CA, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", server="https://127.0.0.1:6443",
                            ca_pem=ca.cert_pem.bytes(), user={"token": "t"})
    path.write_text(path.read_text().replace("user: u", "user: ghost"))
    with pytest.raises(ConfigError, match=r'config.*user "ghost" was not found'):
        await load_config(kubeconfig=str(path), context=None)


async def test_exec_plugin_that_cannot_run_is_refused(ca: trustme.CA, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-plugin"
    path = write_kubeconfig(
        tmp_path / "config", server="https://127.0.0.1:6443", ca_pem=ca.cert_pem.bytes(),
        user={"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                       "command": str(missing)}})
    expected = rf"config.*{re.escape(str(missing))}.*no credentials"
    with trio.fail_after(10), pytest.raises(ConfigError, match=expected):
        await load_config(kubeconfig=str(path), context=None)


async def _mtls_server(
    ca: trustme.CA, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """An HTTPS server that requires a client certificate and answers with its subject."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    ca.configure_trust(ctx)
    ctx.verify_mode = ssl.CERT_REQUIRED

    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some()
            if not chunk:
                return
            data += chunk
        peer = stream.getpeercert() or {}
        subject = dict(item[0] for item in peer.get("subject", ()))
        body = json.dumps({"apiVersion": "test.example.com/v1", "kind": "WhoAmI",
                           "metadata": {"name": subject.get("commonName", "")},
                           "auth": "authorization" in data.decode().lower()}).encode()
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_ssl_over_tcp, handle, 0, ctx, host="127.0.0.1"))
        task_status.started(listeners[0].transport_listener.socket.getsockname()[1])


async def test_client_certificate_kubeconfig(ca: trustme.CA, tmp_path: Path) -> None:
    client_cert = ca.issue_cert("egressd-client", common_name="egressd-client")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(_mtls_server, ca)
            path = write_kubeconfig(
                tmp_path / "config", server=f"https://127.0.0.1:{port}",
                ca_pem=ca.cert_pem.bytes(),
                user={"client-certificate-data": b64(client_cert.cert_chain_pems[0].bytes()),
                      "client-key-data": b64(client_cert.private_key_pem.bytes())})
            cfg = await load_config(kubeconfig=str(path), context=None)
            assert cfg.client_cert_file and cfg.client_key_file
            assert await cfg.credentials.header() is None
            async with open_client(cfg, retry=FAST_RETRY) as client:
                obj = await client.get(WHOAMI, "me")
            # The server saw our certificate (it required one), and no token.
            assert obj["metadata"]["name"] == "egressd-client"
            assert obj["auth"] is False
            nursery.cancel_scope.cancel()


EXEC_PLUGIN = """
import datetime, json, pathlib, sys
counter = pathlib.Path(sys.argv[1])
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
# Expiring in 4 minutes: inside the kubernetes loader's 5-minute skew, so it
# considers the token expired at once and would re-run the plugin every time.
exp = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=4)
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1",
                  "kind": "ExecCredential",
                  "status": {"token": f"exec-{n}",
                             "expirationTimestamp": exp.strftime("%Y-%m-%dT%H:%M:%SZ")}}))
"""


async def test_exec_plugin_kubeconfig(ca: trustme.CA, tmp_path: Path) -> None:
    script = tmp_path / "plugin.py"
    script.write_text(EXEC_PLUGIN)
    counter = tmp_path / "runs"
    path = write_kubeconfig(
        tmp_path / "config", server="https://127.0.0.1:6443", ca_pem=ca.cert_pem.bytes(),
        user={"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                       "command": sys.executable, "args": [str(script), str(counter)]}})
    with trio.fail_after(10):  # runs a plugin process
        cfg = await load_config(kubeconfig=str(path), context=None)
        first = await cfg.credentials.header()
        assert first is not None and first.startswith("Bearer exec-")
        runs = int(counter.read_text())
        # Cached: a near-expiry token does not re-run the plugin on every request.
        for _ in range(5):
            assert await cfg.credentials.header() == first
        assert int(counter.read_text()) == runs
        # A 401 reloads: the plugin runs again and hands out a new token.
        generation = cfg.credentials.generation
        renewed = await cfg.credentials.reload(seen_generation=generation)
        assert renewed != first and renewed is not None and renewed.startswith("Bearer exec-")
        assert int(counter.read_text()) > runs
        # A second request that saw the same old generation reuses that reload.
        runs = int(counter.read_text())
        assert await cfg.credentials.reload(seen_generation=generation) == renewed
        assert int(counter.read_text()) == runs


HANGING_PLUGIN = """
import json, pathlib, sys, time
state = pathlib.Path(sys.argv[1])
runs = state / "runs"
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
if (state / "hang").exists():  # like a plugin waiting on an unreachable token service
    deadline = time.monotonic() + 20
    while not (state / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    (state / "finished").write_text(str(n))
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1",
                  "kind": "ExecCredential", "status": {"token": f"exec-{n}"}}))
"""


async def test_a_hung_exec_plugin_never_holds_up_requests_or_shutdown(
    ca: trustme.CA, tmp_path: Path
) -> None:
    script = tmp_path / "plugin.py"
    script.write_text(HANGING_PLUGIN)
    path = write_kubeconfig(
        tmp_path / "config", server="https://127.0.0.1:6443", ca_pem=ca.cert_pem.bytes(),
        user={"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                       "command": sys.executable, "args": [str(script), str(tmp_path)]}})
    with trio.fail_after(10):
        cfg = await load_config(kubeconfig=str(path), context=None, refresh_timeout=0.5)
        credentials = cfg.credentials
        first = await credentials.header()
    assert first == "Bearer exec-1"
    (tmp_path / "hang").touch()
    try:
        with trio.fail_after(10):
            # A 401's reload: the plugin hangs, the reload gives up and the
            # last token stays in use.
            assert await credentials.reload(seen_generation=credentials.generation) == first
            assert not (tmp_path / "finished").exists()
            # A cancelled caller (shutdown) does not wait for the plugin either.
            with trio.move_on_after(0.1) as cancelled:
                await credentials.reload(seen_generation=credentials.generation)
            assert cancelled.cancelled_caught
            assert not (tmp_path / "finished").exists()
    finally:
        (tmp_path / "release").touch()
    (tmp_path / "hang").unlink()
    with trio.fail_after(10):
        # Once the plugin answers, a reload gets a fresh token (the first may
        # still time out waiting for the abandoned run to finish).
        renewed = first
        while renewed == first:
            renewed = await credentials.reload(seen_generation=credentials.generation)
    assert renewed is not None and renewed.startswith("Bearer exec-")


def _incluster_files(tmp_path: Path, ca: trustme.CA, token: str) -> tuple[Path, Path, Path]:
    token_file = tmp_path / "token"
    token_file.write_text(token)
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem.bytes())
    ns_file = tmp_path / "namespace"
    ns_file.write_text("egressd\n")
    return token_file, ca_file, ns_file


async def test_incluster_config_and_rotated_token(ca: trustme.CA, tmp_path: Path) -> None:
    token_file, ca_file, ns_file = _incluster_files(tmp_path, ca, "first-token")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    cfg = await load_incluster_config(
        environ=env, token_file=str(token_file), ca_file=str(ca_file),
        namespace_file=str(ns_file))
    assert cfg.server == "https://127.0.0.1:6443"
    assert cfg.namespace == "egressd"
    assert cfg.source == "in-cluster config"
    # The in-cluster loader says "bearer": the header is normalised.
    assert await cfg.credentials.header() == "Bearer first-token"
    token_file.write_text("second-token")
    header = await cfg.credentials.reload(seen_generation=cfg.credentials.generation)
    assert header == "Bearer second-token"
    # Caught mid-rotation (no file): the last token stays in use, nothing raises.
    token_file.unlink()
    generation = cfg.credentials.generation
    assert await cfg.credentials.reload(seen_generation=generation) == "Bearer second-token"
    assert cfg.credentials.generation == generation


async def test_incluster_chosen_without_kubeconfig(ca: trustme.CA, tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    # The standard service-account paths do not exist here: the error names them.
    with pytest.raises(ConfigError, match=r"in-cluster.*serviceaccount/token"):
        await load_config(kubeconfig=None, context=None, environ=env)
    with pytest.raises(ConfigError, match="in-cluster"):
        await load_incluster_config(environ={}, token_file="/nonexistent", ca_file="/x")
