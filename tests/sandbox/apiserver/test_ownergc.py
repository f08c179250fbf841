"""ownerReference garbage collection in the fake API server: background (default),
foreground and orphan propagation, as kube-controller-manager does it, and the real
kubectl's `--cascade=orphan|foreground`."""

from __future__ import annotations

import shutil
from typing import Any

import httpx
import pytest

from tests.sandbox.apiserver.support import MERGE, PROXIES, created, proxy
from tests.sandbox.apiserver.test_kubectl import kube_env, kubectl, out

__all__ = ["kube_env"]

POOLS = "/apis/crawl.example.com/v1alpha1/namespaces/default/proxypools"


async def owner_and_children(client: httpx.AsyncClient, *, finalizer: bool = False
                             ) -> tuple[dict[str, Any], list[str]]:
    owner = await created(client, POOLS, {
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "eu"},
        "spec": {"replicas": 2, "template": {"spec": {"mode": "Managed", "provider": "p"}}}})
    ref = {"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool", "name": "eu",
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    names = ["eu-aaaaa", "eu-bbbbb"]
    for name in names:
        body = proxy(name)
        body["metadata"]["ownerReferences"] = [ref]
        if finalizer:
            body["metadata"]["finalizers"] = ["crawl.example.com/instance-cleanup"]
        await created(client, PROXIES, body)
    await created(client, PROXIES, proxy("unowned"))
    return owner, names


async def names_of(client: httpx.AsyncClient) -> list[str]:
    items = (await client.get(PROXIES)).json()["items"]
    return sorted(i["metadata"]["name"] for i in items)


async def test_background_deletes_dependents(api_client: httpx.AsyncClient) -> None:
    await owner_and_children(api_client)
    response = await api_client.delete(f"{POOLS}/eu")
    assert response.status_code == 200
    assert (await api_client.get(f"{POOLS}/eu")).status_code == 404
    assert await names_of(api_client) == ["unowned"]


async def test_dependents_with_finalizers_are_marked_then_go(
        api_client: httpx.AsyncClient) -> None:
    _, names = await owner_and_children(api_client, finalizer=True)
    await api_client.delete(f"{POOLS}/eu")
    for name in names:
        obj = (await api_client.get(f"{PROXIES}/{name}")).json()
        assert obj["metadata"]["deletionTimestamp"]
        await api_client.patch(f"{PROXIES}/{name}", headers=MERGE,
                               json={"metadata": {"finalizers": None}})
    assert await names_of(api_client) == ["unowned"]


async def test_foreground_waits_for_dependents(api_client: httpx.AsyncClient) -> None:
    _, names = await owner_and_children(api_client, finalizer=True)
    response = await api_client.request(
        "DELETE", f"{POOLS}/eu", json={"propagationPolicy": "Foreground"})
    assert response.status_code == 202
    owner = (await api_client.get(f"{POOLS}/eu")).json()
    assert "foregroundDeletion" in owner["metadata"]["finalizers"]
    assert owner["metadata"]["deletionTimestamp"]
    await api_client.patch(f"{PROXIES}/{names[0]}", headers=MERGE,
                           json={"metadata": {"finalizers": None}})
    assert (await api_client.get(f"{POOLS}/eu")).status_code == 200  # one still left
    await api_client.patch(f"{PROXIES}/{names[1]}", headers=MERGE,
                           json={"metadata": {"finalizers": None}})
    assert (await api_client.get(f"{POOLS}/eu")).status_code == 404
    assert await names_of(api_client) == ["unowned"]


async def test_orphan_keeps_dependents_without_the_reference(
        api_client: httpx.AsyncClient) -> None:
    await owner_and_children(api_client)
    response = await api_client.request("DELETE", f"{POOLS}/eu",
                                        json={"propagationPolicy": "Orphan"})
    assert response.status_code == 200
    assert await names_of(api_client) == ["eu-aaaaa", "eu-bbbbb", "unowned"]
    child = (await api_client.get(f"{PROXIES}/eu-aaaaa")).json()
    assert "ownerReferences" not in child["metadata"]


async def test_a_bad_policy_is_a_400(api_client: httpx.AsyncClient) -> None:
    await owner_and_children(api_client)
    response = await api_client.request("DELETE", f"{POOLS}/eu",
                                        json={"propagationPolicy": "Sometimes"})
    assert response.status_code == 400
    assert "propagationPolicy" in response.json()["message"]


@pytest.mark.kubectl
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_cascade_orphan_and_default(kube_env: dict[str, str],
                                                  api_client: httpx.AsyncClient) -> None:
    await owner_and_children(api_client)
    result = await kubectl(kube_env, "delete", "pxp/eu", "--cascade=orphan")
    assert result.returncode == 0, out(result)
    assert await names_of(api_client) == ["eu-aaaaa", "eu-bbbbb", "unowned"]
    for name in ("eu-aaaaa", "eu-bbbbb", "unowned"):
        await api_client.delete(f"{PROXIES}/{name}")
    await owner_and_children(api_client)
    result = await kubectl(kube_env, "delete", "pxp/eu")
    assert result.returncode == 0, out(result)
    assert await names_of(api_client) == ["unowned"]
