"""The real kubectl 1.32 against the fake API server: what a user of the sandbox types.

Each test runs /usr/bin/kubectl with a throwaway HOME (its discovery cache
cannot go stale) and a kubeconfig the server wrote.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
import trio

from egressd.sandbox.apiserver import FakeApiServer
from tests.sandbox.apiserver.support import MERGE, PROXIES, created, proxy

pytestmark = [
    pytest.mark.kubectl,
    pytest.mark.skipif(shutil.which("kubectl") is None,
                       reason="kubectl is not installed on this machine (kubectl 1.32 expected "
                              "at /usr/bin/kubectl)"),
]

PROXY_YAML = """\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata:
  name: {name}
  namespace: default
spec:
  mode: External
  endpoint: {{host: 192.0.2.1, port: {port}}}
"""


@pytest.fixture
def kube_env(apiserver: FakeApiServer, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    config = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "KUBECONFIG": config}


async def kubectl(env: Mapping[str, str], *args: str, stdin: bytes = b""
                  ) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(30):
        return await trio.run_process(["kubectl", *args], stdin=stdin, capture_stdout=True,
                                      capture_stderr=True, env=env, check=False)


def out(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stdout.decode() + result.stderr.decode()


async def test_get_shows_printer_columns(kube_env: dict[str, str],
                                         api_client: httpx.AsyncClient) -> None:
    await created(api_client, PROXIES, proxy("ext1"))
    response = await api_client.patch(f"{PROXIES}/ext1/status", headers=MERGE, json={"status": {
        "phase": "Ready", "host": "192.0.2.1", "port": 3128, "latencyMs": 42,
        "conditions": [{"type": "Healthy", "status": "True", "reason": "ProbeSucceeded",
                        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    assert response.status_code == 200
    result = await kubectl(kube_env, "get", "px", "-A")
    assert result.returncode == 0, out(result)
    header, row = result.stdout.decode().splitlines()
    assert header.split() == ["NAMESPACE", "NAME", "MODE", "PHASE", "HOST", "PORT", "HEALTHY",
                              "LATENCY", "AGE"]
    cells = row.split()
    assert cells[:8] == ["default", "ext1", "External", "Ready", "192.0.2.1", "3128", "True",
                         "42"]
    assert cells[8].endswith("s")  # Age, e.g. "0s"


async def test_apply_creates_then_updates_and_server_side(kube_env: dict[str, str],
                                                          apiserver: FakeApiServer,
                                                          tmp_path: Path) -> None:
    manifest = tmp_path / "px.yaml"
    manifest.write_text(PROXY_YAML.format(name="ext1", port=3128))
    result = await kubectl(kube_env, "apply", "-f", str(manifest))
    assert result.returncode == 0 and "created" in out(result), out(result)
    manifest.write_text(PROXY_YAML.format(name="ext1", port=8080))
    result = await kubectl(kube_env, "apply", "-f", str(manifest))
    assert result.returncode == 0 and "configured" in out(result), out(result)
    stored = apiserver.get("crawl.example.com/v1alpha1", "Proxy", "ext1", namespace="default")
    assert stored is not None
    assert stored["spec"]["endpoint"]["port"] == 8080
    assert stored["metadata"]["generation"] == 2

    manifest.write_text(PROXY_YAML.format(name="ssa1", port=3128))
    result = await kubectl(kube_env, "apply", "--server-side", "-f", str(manifest))
    assert result.returncode == 0 and "serverside-applied" in out(result), out(result)
    assert apiserver.get("crawl.example.com/v1alpha1", "Proxy", "ssa1",
                         namespace="default") is not None


async def test_apply_of_an_invalid_proxy_shows_the_cel_message(kube_env: dict[str, str],
                                                               tmp_path: Path) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(PROXY_YAML.format(name="bad1", port=3128) + "  provider: gcp-eu\n")
    result = await kubectl(kube_env, "apply", "-f", str(manifest))
    assert result.returncode != 0
    message = out(result)
    assert 'The Proxy "bad1" is invalid' in message
    # The CRD rule's own message (manifests/crd.yaml), evaluated by cel-python.
    assert "spec: Invalid value: \"object\": an External proxy must not set spec.provider" in (
        message), message


async def test_patch_status_then_wait_for_jsonpath(kube_env: dict[str, str],
                                                   api_client: httpx.AsyncClient) -> None:
    await created(api_client, PROXIES, proxy("ext1"))
    result = await kubectl(kube_env, "patch", "px", "ext1", "--subresource=status",
                           "--type=merge", "-p", '{"status":{"phase":"Ready"}}')
    assert result.returncode == 0, out(result)
    result = await kubectl(kube_env, "wait", "--for=jsonpath={.status.phase}=Ready",
                           "px/ext1", "--timeout=20s")
    assert result.returncode == 0 and "condition met" in out(result), out(result)


async def test_describe_lists_events(kube_env: dict[str, str],
                                     api_client: httpx.AsyncClient) -> None:
    obj = await created(api_client, PROXIES, proxy("ext1"))
    other = await created(api_client, PROXIES, proxy("ext2"))
    for target, reason in ((obj, "InstanceCreated"), (other, "SomethingElse")):
        await created(api_client, "/api/v1/namespaces/default/events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{target['metadata']['name']}.1"},
            "involvedObject": {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                               "name": target["metadata"]["name"], "namespace": "default",
                               "uid": target["metadata"]["uid"]},
            "reason": reason, "message": "instance px-0123 created", "type": "Normal",
            "source": {"component": "egressd"}, "count": 1,
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z"})
    result = await kubectl(kube_env, "describe", "px", "ext1")
    assert result.returncode == 0, out(result)
    text = result.stdout.decode()
    events = text[text.index("Events:"):]
    assert "InstanceCreated" in events and "instance px-0123 created" in events
    assert "SomethingElse" not in events


async def test_get_watch_sees_a_change(kube_env: dict[str, str], apiserver: FakeApiServer,
                                       api_client: httpx.AsyncClient) -> None:
    await created(api_client, PROXIES, proxy("ext1"))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            send, receive = trio.open_memory_channel[str](100)
            process = await nursery.start(functools.partial(
                trio.run_process, ["kubectl", "get", "px", "-w"], env=kube_env,
                stdout=subprocess.PIPE, check=False))

            async def lines() -> None:
                buffer = b""
                async with send:
                    while chunk := await process.stdout.receive_some():
                        buffer += chunk
                        *done, buffer = buffer.split(b"\n")
                        for line in done:
                            await send.send(line.decode())

            nursery.start_soon(lines)
            first = [await receive.receive(), await receive.receive()]
            assert first[0].split()[:3] == ["NAME", "MODE", "PHASE"]
            assert first[1].split()[:2] == ["ext1", "External"]
            await apiserver.wait_for_watchers("proxies")
            response = await api_client.patch(f"{PROXIES}/ext1/status", headers=MERGE,
                                              json={"status": {"phase": "Unhealthy"}})
            assert response.status_code == 200
            changed = await receive.receive()
            assert changed.split()[:3] == ["ext1", "External", "Unhealthy"]
            process.kill()


async def test_delete_with_a_finalizer_finishes_once_it_is_removed(
        kube_env: dict[str, str], apiserver: FakeApiServer,
        api_client: httpx.AsyncClient) -> None:
    body = proxy("ext1")
    body["metadata"]["finalizers"] = ["crawl.example.com/instance-cleanup"]
    await created(api_client, PROXIES, body)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            results: list[subprocess.CompletedProcess[bytes]] = []

            async def delete() -> None:
                results.append(await kubectl(kube_env, "delete", "px", "ext1",
                                             "--timeout=25s"))

            nursery.start_soon(delete)
            # kubectl deletes, then watches the object until it is gone.
            await apiserver.wait_for_watchers("proxies")
            stored = apiserver.get("crawl.example.com/v1alpha1", "Proxy", "ext1",
                                   namespace="default")
            assert stored is not None and stored["metadata"]["deletionTimestamp"]
            response = await api_client.patch(f"{PROXIES}/ext1", headers=MERGE,
                                              json={"metadata": {"finalizers": None}})
            assert response.status_code == 200
        assert results[0].returncode == 0, out(results[0])
        assert 'proxy.crawl.example.com "ext1" deleted' in out(results[0])
        assert apiserver.get("crawl.example.com/v1alpha1", "Proxy", "ext1",
                             namespace="default") is None


async def test_imperative_create_namespace_and_secret(kube_env: dict[str, str],
                                                      apiserver: FakeApiServer,
                                                      tmp_path: Path) -> None:
    # Both go through client-go's typed clients, which send protobuf bodies.
    result = await kubectl(kube_env, "create", "namespace", "team", "--save-config")
    assert result.returncode == 0 and "namespace/team created" in out(result), out(result)
    (tmp_path / "pw").write_bytes(b"hunter2")
    result = await kubectl(kube_env, "create", "secret", "generic", "creds", "-n", "team",
                           "--from-literal=user=bob", f"--from-file=pw={tmp_path / 'pw'}")
    assert result.returncode == 0 and "secret/creds created" in out(result), out(result)
    namespace = apiserver.get("v1", "Namespace", "team")
    assert namespace is not None
    assert "kubectl.kubernetes.io/last-applied-configuration" in namespace["metadata"][
        "annotations"]
    secret = apiserver.get("v1", "Secret", "creds", namespace="team")
    assert secret is not None
    assert secret["data"] == {"user": "Ym9i", "pw": "aHVudGVyMg=="}
    assert secret["type"] == "Opaque"
    result = await kubectl(kube_env, "create", "namespace", "team")
    assert result.returncode != 0 and "AlreadyExists" in out(result), out(result)


SSA_YAML = """\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: ssa, namespace: default}}
spec:
  mode: External
  endpoint: {{host: 192.0.2.1, port: 3128}}
  attributes: {attributes}
"""


async def test_server_side_apply_drops_unset_fields_and_refuses_conflicts_unless_forced(
        kube_env: dict[str, str], apiserver: FakeApiServer, tmp_path: Path) -> None:
    manifest = tmp_path / "ssa.yaml"
    manifest.write_text(SSA_YAML.format(attributes="{team: crawl, env: prod}"))
    result = await kubectl(kube_env, "apply", "--server-side", "-f", str(manifest))
    assert result.returncode == 0, out(result)
    manifest.write_text(SSA_YAML.format(attributes="{team: crawl}"))
    result = await kubectl(kube_env, "apply", "--server-side", "-f", str(manifest))
    assert result.returncode == 0, out(result)
    stored = apiserver.get("crawl.example.com/v1alpha1", "Proxy", "ssa", namespace="default")
    assert stored is not None and stored["spec"]["attributes"] == {"team": "crawl"}

    # Another manager sets team to another value: a conflict, then forced.
    manifest.write_text(SSA_YAML.format(attributes="{team: search}"))
    result = await kubectl(kube_env, "apply", "--server-side", "--field-manager", "alice",
                           "-f", str(manifest))
    assert result.returncode != 0
    assert 'conflict with "kubectl"' in out(result) and ".spec.attributes.team" in out(result)
    result = await kubectl(kube_env, "apply", "--server-side", "--field-manager", "alice",
                           "--force-conflicts", "-f", str(manifest))
    assert result.returncode == 0, out(result)
    stored = apiserver.get("crawl.example.com/v1alpha1", "Proxy", "ssa", namespace="default")
    assert stored is not None and stored["spec"]["attributes"] == {"team": "search"}
    result = await kubectl(kube_env, "get", "px", "ssa", "--show-managed-fields", "-o",
                           "jsonpath={.metadata.managedFields[*].manager}")
    assert result.returncode == 0, out(result)
    assert sorted(result.stdout.decode().split()) == ["alice", "kubectl"]


async def test_auth_whoami_and_can_i(kube_env: dict[str, str]) -> None:
    result = await kubectl(kube_env, "auth", "whoami")
    assert result.returncode == 0, out(result)
    assert "sandbox-admin" in result.stdout.decode()
    assert "system:masters" in result.stdout.decode()
    result = await kubectl(kube_env, "auth", "can-i", "patch", "proxies.crawl.example.com",
                           "-n", "default")
    assert result.returncode == 0, out(result)
    assert result.stdout.decode().strip() == "yes"
    result = await kubectl(kube_env, "auth", "can-i", "--list", "-n", "default")
    assert result.returncode == 0, out(result)
    assert "*.*" in result.stdout.decode()
