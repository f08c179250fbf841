"""RBAC in the fake API server, and the manifests' RBAC checked against the daemon.

With RBAC on, Roles, ClusterRoles and bindings are stored like any object and
decide every request of a service account; 403s are worded as upstream's. The
daemon then runs as the manifests' ServiceAccount, bound to exactly the
manifests' rules: it must never get a 403, and the test lists every granted
rule nothing used.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml

from egressd.app import load_inputs, run_daemon
from egressd.kube.client import open_client
from egressd.kube.config import load_config
from egressd.kube.resources import PROXIES as PROXIES_RESOURCE
from egressd.sandbox.apiserver import FakeApiServer
from egressd.sandbox.apiserver.tls import kubeconfig as kubeconfig_text
from egressd.sandbox.apiserver.tls import write_private
from egressd.sandbox.kubelet import AddressPool, LocalKubelet
from egressd.sandbox.probe_target import ProbeTargetServer
from egressd.settings import parse_settings
from tests.fixtures.apiserver import make_client
from tests.sandbox.apiserver.support import ALL_PROXIES, PROXIES, proxy
from tests.sandbox.test_localproxy import installed

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"
RBAC_GROUP = "/apis/rbac.authorization.k8s.io/v1"
PROVIDER_NAMESPACE = "egressd-proxies"  # manifests/config.yaml's kubernetes provider


def role(name: str, namespace: str | None, rules: list[dict[str, Any]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role" if namespace else "ClusterRole", "metadata": meta, "rules": rules}


def binding(name: str, namespace: str | None, role_kind: str, sa: tuple[str, str]
            ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding" if namespace else "ClusterRoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                        "name": name},
            "subjects": [{"kind": "ServiceAccount", "namespace": sa[0], "name": sa[1]}]}


READ_PROXIES = [{"apiGroups": ["crawl.example.com"], "resources": ["proxies"],
                 "verbs": ["get", "list"]}]


async def test_a_service_account_may_only_what_its_roles_grant(
        apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    apiserver.enable_rbac()
    token = apiserver.service_account_token("default", "reader")
    with trio.fail_after(10):
        async with make_client(apiserver, token=token) as reader:
            denied = await reader.get(ALL_PROXIES)
            assert denied.status_code == 403
            assert denied.json()["message"] == (
                'proxies.crawl.example.com is forbidden: User '
                '"system:serviceaccount:default:reader" cannot list resource "proxies" in '
                'API group "crawl.example.com" at the cluster scope')
            # Discovery stays open to every authenticated caller.
            assert (await reader.get("/apis")).status_code == 200

            for obj in (role("reader", "default", READ_PROXIES),
                        binding("reader", "default", "Role", ("default", "reader"))):
                plural = "roles" if obj["kind"] == "Role" else "rolebindings"
                response = await api_client.post(
                    f"{RBAC_GROUP}/namespaces/default/{plural}", json=obj)
                assert response.status_code == 201, response.text
            assert (await reader.get(PROXIES)).status_code == 200
            assert (await reader.get(ALL_PROXIES)).status_code == 403  # not cluster-wide
            created = await reader.post(PROXIES, json=proxy("a"))
            assert created.status_code == 403
            assert 'cannot create resource "proxies"' in created.json()["message"]
            assert 'in the namespace "default"' in created.json()["message"]
            status = await reader.patch(f"{PROXIES}/a/status", json={},
                                        headers={"Content-Type": "application/merge-patch+json"})
            assert status.status_code == 403
            assert 'subresource "status"' in status.json()["message"]

            review = await reader.post(
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                json={"spec": {"resourceAttributes": {"verb": "delete", "namespace": "default",
                                                      "group": "crawl.example.com",
                                                      "resource": "proxies"}}})
            assert review.json()["status"]["allowed"] is False
            whoami = await reader.post("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                       json={})
            assert whoami.json()["status"]["userInfo"]["username"] == (
                "system:serviceaccount:default:reader")

        # The server's own token is a cluster admin, RBAC or not.
        assert (await api_client.post(PROXIES, json=proxy("a"))).status_code == 201


async def test_a_cluster_role_binding_grants_everywhere_and_resource_names_narrow(
        apiserver: FakeApiServer) -> None:
    rbac = apiserver.enable_rbac()
    apiserver.create(role("one", None, [{"apiGroups": ["crawl.example.com"],
                                         "resources": ["proxies"], "verbs": ["get"],
                                         "resourceNames": ["a"]},
                                        {"apiGroups": ["crawl.example.com"],
                                         "resources": ["proxies"], "verbs": ["list"]}]))
    apiserver.create(binding("one", None, "ClusterRole", ("default", "one")))
    apiserver.create(proxy("a"))
    apiserver.create(proxy("b"))
    token = apiserver.service_account_token("default", "one")
    with trio.fail_after(10):
        async with make_client(apiserver, token=token) as client:
            assert (await client.get(ALL_PROXIES)).status_code == 200
            assert (await client.get(f"{PROXIES}/a")).status_code == 200
            assert (await client.get(f"{PROXIES}/b")).status_code == 403
    assert [str(g) for g in rbac.unused()] == []


def _load(server: FakeApiServer, path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            server.create(doc)


@pytest.fixture
def daemon_kubeconfig(apiserver: FakeApiServer, tmp_path: Path) -> str:
    """The manifests' namespaces and RBAC loaded, RBAC on, a kubeconfig for their SA."""
    _load(apiserver, MANIFESTS / "namespace.yaml")
    _load(apiserver, MANIFESTS / "rbac.yaml")
    apiserver.enable_rbac()
    token = apiserver.service_account_token("egressd", "egressd")
    path = str(tmp_path / "sa-kubeconfig")
    write_private(path, kubeconfig_text(server=apiserver.url, ca_pem=apiserver.ca_pem,
                                        token=token, context="egressd", namespace="egressd"))
    return path


async def _wait_for(server: FakeApiServer, name: str, done: Callable[[Any], bool],
                    forbidden: list[str]) -> None:
    """Until `done(the Proxy)`; a 403 fails at once (the daemon reports it on the Proxy,
    which is a change), not at the deadline."""
    while not done(server.get("crawl.example.com/v1alpha1", "Proxy", name,
                              namespace="default")):
        assert forbidden == []
        await server.store.wait_changed()


def _phase(obj: Any) -> str | None:
    return ((obj or {}).get("status") or {}).get("phase")


async def test_the_daemon_as_the_manifests_service_account_never_gets_a_403(
        apiserver: FakeApiServer, daemon_kubeconfig: str, tmp_path: Path) -> None:
    """One External and one Managed proxy (a kubernetes-provider Pod run by the local
    kubelet) reach their states and the Managed one is deleted, all as the manifests'
    ServiceAccount: no 403, and every rule the manifests grant is used or named below."""
    software = installed("tinyproxy")
    forbidden: list[str] = []
    handle = apiserver.app.handle

    async def spy(request: Any) -> Any:
        reply = await handle(request)
        if getattr(reply, "status", 0) == 403:
            forbidden.append(f"{request.method} {request.path}")
        return reply

    apiserver.app.handle = spy  # type: ignore[method-assign]
    token_file = tmp_path / "token"
    token_file.write_text("discovery-token-of-the-test\n")
    providers_file = tmp_path / "providers.yaml"
    providers_file.write_text(yaml.safe_dump({"providers": [{
        "name": "local", "type": "kubernetes",
        "kubernetes": {"namespace": PROVIDER_NAMESPACE, "image": "ubuntu/squid:6.6-24.04_edge"}}]}))
    target = ProbeTargetServer()
    admin = await load_config(kubeconfig=apiserver.write_kubeconfig(str(tmp_path / "admin")),
                              context=None)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery, open_client(admin) as admin_client:
            probe_url = await nursery.start(target.serve)
            settings = parse_settings(
                ["--kubeconfig", daemon_kubeconfig, "--discovery-addr", "127.0.0.1:0",
                 "--metrics-addr", "127.0.0.1:0", "--shutdown-grace", "1s",
                 "--discovery-token-file", str(token_file),
                 "--providers-config", str(providers_file), "--cluster-name", "rbac",
                 "--provisioning-poll", "1s",
                 "--probe-ca-file", target.write_ca(str(tmp_path / "ca.pem"))], environ={})
            inputs = load_inputs(settings, {})
            # The kubelet is the cluster's, not egressd's: it runs with the admin token.
            kubelet = LocalKubelet(admin_client, namespace=PROVIDER_NAMESPACE,
                                   software=software, addresses=AddressPool())
            await nursery.start(kubelet.run)
            await nursery.start(functools.partial(run_daemon, inputs, environ={}))
            health = {"probeURL": probe_url, "intervalSeconds": 5, "timeoutSeconds": 2}
            apiserver.create(proxy("ext", healthCheck={"probeURL": "https://127.0.0.1:9/",
                                                       "intervalSeconds": 5,
                                                       "timeoutSeconds": 1}))
            managed = proxy("managed", mode="Managed", provider="local", port=3128,
                            healthCheck=health)
            del managed["spec"]["endpoint"]
            apiserver.create(managed)
            await _wait_for(apiserver, "ext", lambda obj: bool((obj or {}).get("status")),
                            forbidden)
            await _wait_for(apiserver, "managed", lambda obj: _phase(obj) == "Ready", forbidden)
            await admin_client.delete(PROXIES_RESOURCE, "managed", namespace="default")
            await _wait_for(apiserver, "managed", lambda obj: obj is None, forbidden)
            nursery.cancel_scope.cancel()
    assert forbidden == []
    rbac = apiserver.app.rbac
    assert rbac is not None
    unused = {str(g) for g in rbac.unused()}
    print("granted but unused:", *sorted(unused), sep="\n  ")
    # Every grant this run did not need, each for a path it does not take. A grant
    # that goes unused and is not named here fails: either the daemon stopped needing
    # it (narrow manifests/rbac.yaml) or add the reason.
    assert unused <= NOT_EXERCISED, sorted(unused - NOT_EXERCISED)


NOT_EXERCISED = {
    # A repeated Event (same object, reason and message) patches the first one's count;
    # this run emits each Event once.
    "ClusterRole/egressd: patch events",
}
