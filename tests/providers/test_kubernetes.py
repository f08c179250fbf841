"""The kubernetes provider against the fake API server over real HTTPS.

Pods are marked Running the way a kubelet does it: a patch of the status
subresource with a phase and a Pod IP.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from egressd.kube.client import KubeClient
from egressd.kube.resources import NAMESPACES, PODS
from egressd.providers import (
    CreateRequest,
    InstanceState,
    NotConfigured,
    NotFound,
    Permanent,
    Placement,
    QuotaExceeded,
    Transient,
    gc_labels,
)
from egressd.providers.config import KubernetesConfig
from egressd.providers.kubernetes import (
    CONF_ENV,
    KubernetesProvider,
    instance_from_pod,
    instance_state,
    pod_manifest,
    squid_conf,
)

NS = "egressd-proxies"
CONFIG = KubernetesConfig(namespace=NS, image="ubuntu/squid:6.6-24.04_edge")
LABELS = gc_labels(cluster="dev", proxy_uid="1c1b-uid", namespace="crawl", name="p1")
NAME = "px-aaaabbbbccccdddd"


def request(name: str = NAME, **kw: Any) -> CreateRequest:
    return CreateRequest(name=name, port=3128, cloud_init="#cloud-config\n", labels=LABELS, **kw)


async def make_namespace(client: KubeClient, name: str) -> None:
    await client.create(NAMESPACES, {"metadata": {"name": name}})


async def kubelet_runs(client: KubeClient, name: str, ip: str | None, *,
                       namespace: str = NS) -> None:
    status: dict[str, Any] = {"phase": "Running"}
    if ip:
        status["podIP"] = ip
    await client.patch_status(PODS, name, {"status": status}, namespace=namespace)


@pytest.fixture
async def provider(kube_client: KubeClient) -> KubernetesProvider:
    await make_namespace(kube_client, NS)
    return KubernetesProvider(CONFIG, client=kube_client)


# --- pure parts --------------------------------------------------------------


def test_pod_manifest() -> None:
    pod = pod_manifest(CONFIG, request(placement=Placement(
        zone="europe-west1-b", region="europe-west1", machine_type="e2-small")))
    assert pod["metadata"] == {"name": NAME, "namespace": NS, "labels": {
        "app.kubernetes.io/name": "egressd-proxy", **LABELS}}
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"topology.kubernetes.io/zone": "europe-west1-b",
                                    "topology.kubernetes.io/region": "europe-west1",
                                    "node.kubernetes.io/instance-type": "e2-small"}
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    assert container["image"] == CONFIG.image
    assert container["command"][:2] == ["sh", "-c"]
    assert "/etc/squid/squid.conf" in container["command"][2]
    assert container["env"] == [{"name": CONF_ENV, "value": squid_conf(3128)}]
    assert container["ports"] == [{"name": "proxy", "containerPort": 3128, "protocol": "TCP"}]
    assert "nodeSelector" not in pod_manifest(CONFIG, request())["spec"]
    assert "cloud-config" not in repr(pod)


def test_squid_conf_lists_only_the_allowed_sources() -> None:
    conf = squid_conf(8080, allowed_sources=("10.0.0.0/8",), listen_address="127.0.0.7")
    assert "http_port 127.0.0.7:8080\n" in conf
    assert "acl egressd_clients src 10.0.0.0/8\n" in conf
    assert conf.index("http_access allow egressd_clients") < conf.index("http_access deny all")
    assert "allow all" not in conf
    config = KubernetesConfig(namespace=NS, image="i", allowed_sources=("192.0.2.0/24",))
    env = pod_manifest(config, request())["spec"]["containers"][0]["env"][0]["value"]
    assert "src 192.0.2.0/24\n" in env


@pytest.mark.parametrize(("req", "field"), [
    (request(name="PX_bad"), "name"),
    (request(placement=Placement(zone="not a zone!")), "placement.zone"),
    (request(placement=Placement(machine_type="")), "placement.machineType"),
])
def test_requests_a_pod_cannot_honour_are_permanent(req: CreateRequest, field: str) -> None:
    with pytest.raises(Permanent, match=rf"^{field}: "):
        pod_manifest(CONFIG, req)


@pytest.mark.parametrize(("pod", "state"), [
    ({"status": {"phase": "Pending"}}, InstanceState.PROVISIONING),
    ({"status": {}}, InstanceState.PROVISIONING),
    ({"status": {"phase": "Running"}}, InstanceState.PROVISIONING),
    ({"status": {"phase": "Running", "podIP": "10.0.0.9"}}, InstanceState.RUNNING),
    ({"status": {"phase": "Succeeded"}}, InstanceState.TERMINATED),
    ({"status": {"phase": "Failed", "podIP": "10.0.0.9"}}, InstanceState.TERMINATED),
    ({"status": {"phase": "Unknown"}}, InstanceState.TERMINATED),
    ({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"},
      "status": {"phase": "Running", "podIP": "10.0.0.9"}}, InstanceState.TERMINATED),
])
def test_phase_mapping(pod: dict[str, Any], state: InstanceState) -> None:
    assert instance_state(pod) is state


# --- against the fake API server ---------------------------------------------


async def test_create_get_run_list_delete(provider: KubernetesProvider,
                                          kube_client: KubeClient) -> None:
    with trio.fail_after(20):
        created = await provider.create(request())
        assert created.provider_id == f"{NS}/{NAME}"
        assert created.state is InstanceState.PROVISIONING
        assert created.labels["egressd-proxy-uid"] == "1c1b-uid"
        stored = await kube_client.get(PODS, NAME, namespace=NS)
        assert stored["spec"]["containers"][0]["env"][0]["name"] == CONF_ENV

        await kubelet_runs(kube_client, NAME, None)
        assert (await provider.get(created.provider_id)).state is InstanceState.PROVISIONING
        await kubelet_runs(kube_client, NAME, "10.244.1.7")
        running = await provider.get(created.provider_id)
        assert (running.state, running.ip) == (InstanceState.RUNNING, "10.244.1.7")

        listed = await provider.list_by_labels({"egressd-cluster": "dev",
                                                "egressd-managed-by": "egressd"})
        assert [i.provider_id for i in listed] == [created.provider_id]
        assert await provider.list_by_labels({"egressd-cluster": "prod"}) == []

        await provider.delete(created.provider_id)
        with pytest.raises(NotFound):
            await provider.get(created.provider_id)
        await provider.delete(created.provider_id)  # not found is success
        await provider.delete("project/europe-west1-b/px-a")  # not ours: nothing to delete
        with pytest.raises(NotFound):
            await provider.get("no-slash")


async def test_create_adopts_an_existing_pod(provider: KubernetesProvider,
                                             kube_client: KubeClient) -> None:
    with trio.fail_after(20):
        first = await provider.create(request())
        await kubelet_runs(kube_client, NAME, "10.244.1.8")
        again = await provider.create(request())
    assert again.provider_id == first.provider_id
    assert (again.state, again.ip) == (InstanceState.RUNNING, "10.244.1.8")


async def test_list_is_cluster_wide(provider: KubernetesProvider,
                                    kube_client: KubeClient) -> None:
    with trio.fail_after(20):
        await make_namespace(kube_client, "old-proxies")
        other = KubernetesProvider(KubernetesConfig(namespace="old-proxies", image="i"),
                                   client=kube_client)
        await provider.create(request("px-one"))
        await other.create(request("px-two"))
        await other.create(CreateRequest(name="px-three", labels={"egressd-cluster": "x"}))
        found = await provider.list_by_labels({"egressd-cluster": "dev"})
    assert sorted(i.provider_id for i in found) == [f"{NS}/px-one", "old-proxies/px-two"]


@pytest.mark.parametrize(("code", "message", "kind"), [
    (403, "pods is forbidden: User cannot create resource", NotConfigured),
    (403, 'pods "px" is forbidden: exceeded quota: compute, requested: pods=1', QuotaExceeded),
    (422, "Pod is invalid", Permanent),
    (400, "bad request", Permanent),
])
async def test_refusals_map_to_kinds(provider: KubernetesProvider, apiserver: Any,
                                     code: int, message: str, kind: type[Exception]) -> None:
    apiserver.faults.fail_next(code=code, method="POST", resource="pods", message=message)
    with trio.fail_after(20):
        with pytest.raises(kind) as info:
            await provider.create(request())
        assert (await provider.create(request())).name == NAME  # next time it works
    assert info.value.cause is not None


async def test_server_errors_are_transient(provider: KubernetesProvider, apiserver: Any) -> None:
    # More failures than the client's own retries (4 tries in the test fixture).
    apiserver.faults.fail_next(8, code=503, resource="pods")
    with trio.fail_after(20), pytest.raises(Transient):
        await provider.get(f"{NS}/{NAME}")


async def test_missing_namespace_is_transient(kube_client: KubeClient) -> None:
    provider = KubernetesProvider(KubernetesConfig(namespace="nowhere", image="i"),
                                  client=kube_client)
    with trio.fail_after(20), pytest.raises(Transient, match="namespace 'nowhere' not found"):
        await provider.create(request())


async def test_adopting_a_pod_that_vanishes_is_transient(provider: KubernetesProvider,
                                                         apiserver: Any) -> None:
    """A 409 says the Pod exists; if it is gone by the read, create is retried later
    (Transient), never reported as NotFound."""
    with trio.fail_after(20):
        await provider.create(request())
        apiserver.faults.fail_next(code=404, method="GET", resource="pods")
        with pytest.raises(Transient, match="vanished") as info:
            await provider.create(request())
    assert isinstance(info.value.cause, NotFound)


def test_an_empty_pod_ip_is_no_address() -> None:
    pod = {"metadata": {"name": NAME, "namespace": NS},
           "status": {"phase": "Running", "podIP": ""}}
    instance = instance_from_pod(pod)
    assert (instance.state, instance.ip) == (InstanceState.PROVISIONING, None)
