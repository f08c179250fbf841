"""The scale subresource of the ProxyPool CRD on the fake API server: the Scale
document, writes through the object's schema and CEL rules, and the real kubectl
(`kubectl scale pxp/NAME --replicas N`, `kubectl get pxp`)."""

from __future__ import annotations

import shutil

import httpx
import pytest

from tests.sandbox.apiserver.support import JSON_PATCH, MERGE, created
from tests.sandbox.apiserver.test_kubectl import kube_env, kubectl, out

__all__ = ["kube_env"]  # the fixture, imported for the kubectl tests here

POOLS = "/apis/crawl.example.com/v1alpha1/namespaces/default/proxypools"


def pool(name: str, replicas: int = 3) -> dict[str, object]:
    return {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": name},
            "spec": {"replicas": replicas,
                     "template": {"spec": {"mode": "Managed", "provider": "local"}}}}


async def test_scale_reads_and_writes_replicas(api_client: httpx.AsyncClient) -> None:
    await created(api_client, POOLS, pool("eu"))
    status = await api_client.patch(f"{POOLS}/eu/status", headers=MERGE, json={"status": {
        "replicas": 2, "labelSelector": "crawl.example.com/pool=eu"}})
    assert status.status_code == 200, status.text
    scale = (await api_client.get(f"{POOLS}/eu/scale")).json()
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 3}
    assert scale["status"] == {"replicas": 2, "selector": "crawl.example.com/pool=eu"}

    patched = await api_client.patch(f"{POOLS}/eu/scale", headers=MERGE,
                                     json={"spec": {"replicas": 5}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["spec"]["replicas"] == 5
    obj = (await api_client.get(f"{POOLS}/eu")).json()
    assert obj["spec"]["replicas"] == 5
    assert obj["metadata"]["generation"] == 2
    assert obj["status"]["replicas"] == 2  # status untouched

    scale = patched.json()
    scale["spec"]["replicas"] = 1
    put = await api_client.put(f"{POOLS}/eu/scale", json=scale)
    assert put.status_code == 200, put.text
    scale["spec"]["replicas"] = 2  # the resourceVersion is now stale
    stale = await api_client.put(f"{POOLS}/eu/scale", json=scale)
    assert stale.status_code == 409
    jp = await api_client.patch(f"{POOLS}/eu/scale", headers=JSON_PATCH, json=[
        {"op": "replace", "path": "/spec/replicas", "value": 4}])
    assert jp.json()["spec"]["replicas"] == 4


async def test_scale_is_held_to_the_schema(api_client: httpx.AsyncClient) -> None:
    await created(api_client, POOLS, pool("eu"))
    negative = await api_client.patch(f"{POOLS}/eu/scale", headers=MERGE,
                                      json={"spec": {"replicas": -1}})
    assert negative.status_code == 422
    assert "spec.replicas" in negative.json()["message"]
    external = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
                "metadata": {"name": "vendor"},
                "spec": {"template": {"spec": {"mode": "External"}},
                         "endpoints": [{"host": "203.0.113.9"}]}}
    await created(api_client, POOLS, external)
    refused = await api_client.patch(f"{POOLS}/vendor/scale", headers=MERGE,
                                     json={"spec": {"replicas": 3}})
    assert refused.status_code == 422
    assert "edit spec.endpoints, not spec.replicas" in refused.json()["message"]
    missing = await api_client.get(f"{POOLS}/nope/scale")
    assert missing.status_code == 404
    proxies = await api_client.get(
        "/apis/crawl.example.com/v1alpha1/namespaces/default/proxies/x/scale")
    assert proxies.status_code == 404  # the Proxy CRD has no scale subresource


async def test_discovery_lists_the_scale_subresource(api_client: httpx.AsyncClient) -> None:
    doc = (await api_client.get("/apis/crawl.example.com/v1alpha1")).json()
    entry = next(r for r in doc["resources"] if r["name"] == "proxypools/scale")
    assert (entry["group"], entry["version"], entry["kind"]) == ("autoscaling", "v1", "Scale")


@pytest.mark.kubectl
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_scale_and_get_pxp(kube_env: dict[str, str],
                                         api_client: httpx.AsyncClient) -> None:
    await created(api_client, POOLS, pool("eu"))
    result = await kubectl(kube_env, "scale", "pxp/eu", "--replicas", "7")
    assert result.returncode == 0, out(result)
    assert "scaled" in result.stdout.decode()
    obj = (await api_client.get(f"{POOLS}/eu")).json()
    assert obj["spec"]["replicas"] == 7
    await api_client.patch(f"{POOLS}/eu/status", headers=MERGE, json={"status": {
        "desiredReplicas": 7, "replicas": 6, "readyReplicas": 5, "activeLeases": 12}})
    table = await kubectl(kube_env, "get", "pxp")
    assert table.returncode == 0, out(table)
    header, row = table.stdout.decode().splitlines()
    assert header.split() == ["NAME", "DESIRED", "CURRENT", "READY", "LEASED", "AGE"]
    assert row.split()[:5] == ["eu", "7", "6", "5", "12"]
    bad = await kubectl(kube_env, "scale", "pxp/eu", "--replicas", "-3")
    assert bad.returncode != 0
