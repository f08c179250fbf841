"""Finalizers and deletion, namespaces, CRDs, selectors, pagination, leases, dry runs."""

from __future__ import annotations

import httpx
import pytest
import trio

from egressd.sandbox.apiserver import FakeApiServer
from tests.sandbox.apiserver.support import (
    ALL_PROXIES,
    LEASES,
    MERGE,
    PROXIES,
    SECRETS,
    created,
    proxy,
    watch,
)

FINALIZER = "crawl.example.com/instance-cleanup"


async def test_delete_with_finalizers_is_202_until_the_last_one_goes(
        apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        body = proxy("a")
        body["metadata"]["finalizers"] = [FINALIZER, "other/one"]
        await created(api_client, PROXIES, body)
        async with watch(api_client, ALL_PROXIES, resourceVersion="0") as events:
            assert (await events.next())["type"] == "ADDED"
            response = await api_client.delete(f"{PROXIES}/a")
            assert response.status_code == 202
            marked = response.json()
            assert marked["metadata"]["deletionTimestamp"]
            assert marked["metadata"]["generation"] == 2
            assert (await events.next())["type"] == "MODIFIED"
            again = await api_client.delete(f"{PROXIES}/a")
            assert again.status_code == 202
            added = await api_client.patch(f"{PROXIES}/a", headers=MERGE, json={
                "metadata": {"finalizers": [FINALIZER, "other/one", "new/one"]}})
            assert added.status_code == 422
            one_left = await api_client.patch(f"{PROXIES}/a", headers=MERGE, json={
                "metadata": {"finalizers": ["other/one"]}})
            assert one_left.status_code == 200
            assert (await events.next())["type"] == "MODIFIED"
            last = await api_client.patch(f"{PROXIES}/a", headers=MERGE, json={
                "metadata": {"finalizers": []}})
            assert last.status_code == 200
            gone = await events.next()
        assert gone["type"] == "DELETED"
        assert (await api_client.get(f"{PROXIES}/a")).status_code == 404


async def test_delete_without_finalizers_is_200_and_preconditions(
        api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, PROXIES, proxy("a"))
        wrong = await api_client.request("DELETE", f"{PROXIES}/a", json={
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"resourceVersion": "1"}})
        assert wrong.status_code == 409
        response = await api_client.request("DELETE", f"{PROXIES}/a", json={
            "preconditions": {"uid": obj["metadata"]["uid"]}})
        assert response.status_code == 200
        assert (await api_client.delete(f"{PROXIES}/a")).status_code == 404


async def test_noop_write_keeps_the_resource_version(apiserver: FakeApiServer,
                                                     api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, PROXIES, proxy("a"))
        before = apiserver.resource_version
        same = await api_client.patch(f"{PROXIES}/a", headers=MERGE,
                                      json={"spec": {"mode": "External"}})
        assert same.json()["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
        assert apiserver.resource_version == before


async def test_namespaces_must_exist_and_deleting_one_empties_it(
        api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        path = "/apis/crawl.example.com/v1alpha1/namespaces/team/proxies"
        missing = await api_client.post(path, json=proxy("a"))
        assert missing.status_code == 404
        assert missing.json()["message"] == 'namespaces "team" not found'
        ns = await created(api_client, "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
        assert ns["status"]["phase"] == "Active"
        await created(api_client, path, proxy("a"))
        assert (await api_client.delete("/api/v1/namespaces/team")).status_code == 200
        assert (await api_client.get(f"{path}/a")).status_code == 404


async def test_creating_a_crd_serves_its_resource(apiserver: FakeApiServer,
                                                  api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": "widgets.example.org"},
               "spec": {"group": "example.org", "scope": "Cluster",
                        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                        "versions": [{"name": "v1", "served": True, "storage": True,
                                      "schema": {"openAPIV3Schema": {
                                          "type": "object", "properties": {"spec": {
                                              "type": "object", "properties": {
                                                  "size": {"type": "integer",
                                                           "default": 3}}}}}}}]}}
        stored = await created(api_client,
                               "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        conditions = {c["type"]: c["status"] for c in stored["status"]["conditions"]}
        assert conditions["Established"] == "True"
        widget = await created(api_client, "/apis/example.org/v1/widgets", {
            "apiVersion": "example.org/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {}})
        assert widget["spec"]["size"] == 3
        discovery = (await api_client.get("/apis/example.org/v1")).json()
        assert [r["name"] for r in discovery["resources"]] == ["widgets"]
        assert (await api_client.delete(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.org")
        ).status_code == 200
        assert (await api_client.get("/apis/example.org/v1/widgets")).status_code == 404
        bad = dict(crd, metadata={"name": "wrong.example.org"})
        response = await api_client.post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=bad)
        assert response.status_code == 422


@pytest.mark.parametrize(("selector", "expected"), [
    ("tier=gold", ["a"]), ("tier==gold", ["a"]), ("tier!=gold", ["b", "c"]),
    ("tier in (gold,iron)", ["a", "b"]), ("tier notin (gold)", ["b", "c"]),
    ("tier", ["a", "b"]), ("!tier", ["c"]), ("tier=gold,region=eu", ["a"]),
    ("tier,region notin (us)", ["a", "b"]),
])
async def test_label_selectors(api_client: httpx.AsyncClient, selector: str,
                               expected: list[str]) -> None:
    with trio.fail_after(10):
        for name, labels in (("a", {"tier": "gold", "region": "eu"}), ("b", {"tier": "iron"}),
                             ("c", {})):
            body = proxy(name)
            body["metadata"]["labels"] = labels
            await created(api_client, PROXIES, body)
        response = await api_client.get(ALL_PROXIES, params={"labelSelector": selector})
        assert [o["metadata"]["name"] for o in response.json()["items"]] == expected


@pytest.mark.parametrize(("param", "value"), [
    ("labelSelector", "tier in (gold"), ("labelSelector", "Bad Key=x"),
    ("fieldSelector", "spec.mode=External"), ("fieldSelector", "metadata.name"),
])
async def test_bad_selectors_are_400(api_client: httpx.AsyncClient, param: str,
                                     value: str) -> None:
    with trio.fail_after(10):
        response = await api_client.get(ALL_PROXIES, params={param: value})
        assert response.status_code == 400 and response.json()["kind"] == "Status"


async def test_field_selectors_on_name_and_namespace(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        await created(api_client, PROXIES, proxy("b"))
        response = await api_client.get(ALL_PROXIES, params={
            "fieldSelector": "metadata.namespace=default,metadata.name!=a"})
        assert [o["metadata"]["name"] for o in response.json()["items"]] == ["b"]


async def test_list_pagination(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        for i in range(5):
            await created(api_client, PROXIES, proxy(f"p{i}"))
        names: list[str] = []
        token = ""
        while True:
            params = {"limit": "2", **({"continue": token} if token else {})}
            page = (await api_client.get(ALL_PROXIES, params=params)).json()
            names += [o["metadata"]["name"] for o in page["items"]]
            token = page["metadata"].get("continue", "")
            if not token:
                break
        assert names == [f"p{i}" for i in range(5)]
        for params in ({"continue": "garbage"}, {"limit": "-1"}, {"limit": "ten"}):
            bad = await api_client.get(ALL_PROXIES, params=params)
            assert bad.status_code == 400, params


async def test_leases_and_secrets_crud(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        lease = await created(api_client, LEASES, {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "egressd-leader"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}})
        lease["spec"]["holderIdentity"] = "b"
        updated = await api_client.put(f"{LEASES}/egressd-leader", json=lease)
        assert updated.json()["spec"]["holderIdentity"] == "b"
        stale = await api_client.put(f"{LEASES}/egressd-leader", json=lease)
        assert stale.status_code == 409
        listed = (await api_client.get(SECRETS)).json()
        assert listed["kind"] == "SecretList" and listed["items"] == []


async def test_dry_run_stores_nothing(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        response = await api_client.post(PROXIES, json=proxy("a"), params={"dryRun": "All"})
        assert response.status_code == 201
        assert (await api_client.get(f"{PROXIES}/a")).status_code == 404


async def test_direct_access_helpers(apiserver: FakeApiServer) -> None:
    obj = apiserver.create({"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                            "metadata": {"name": "d"},
                            "spec": {"mode": "External", "endpoint": {"host": "h", "port": 1}}})
    assert obj["metadata"]["namespace"] == "default"
    assert [o["metadata"]["name"] for o in apiserver.list("crawl.example.com/v1alpha1",
                                                          "Proxy")] == ["d"]
    apiserver.delete("crawl.example.com/v1alpha1", "Proxy", "d", namespace="default")
    assert apiserver.get("crawl.example.com/v1alpha1", "Proxy", "d", namespace="default") is None


def _widget_crd(**version: object) -> dict[str, object]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.org"},
            "spec": {"group": "example.org", "scope": "Namespaced",
                     "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": True, "storage": True, **version}]}}


def _schema(**spec_schema: object) -> dict[str, object]:
    return {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", **spec_schema}}}}


@pytest.mark.parametrize(("crd", "field"), [
    (_widget_crd(schema="x"), "spec.versions[0].schema"),
    (_widget_crd(schema=_schema(properties=["size"])), "spec.versions[0].schema.openAPIV3Schema"),
    (_widget_crd(schema=_schema(properties={"size": {"type": "integer", "minimum": "1"}})),
     "spec.versions[0].schema.openAPIV3Schema"),
    (_widget_crd(schema=_schema(properties={"n": {"type": "string", "pattern": "("}})),
     "spec.versions[0].schema.openAPIV3Schema"),
    (_widget_crd(schema=_schema(**{"x-kubernetes-validations": [{"rule": "self.a =="}]})),
     "spec.versions[0].schema.openAPIV3Schema"),
    (_widget_crd(schema=_schema(type="dict")), "spec.versions[0].schema.openAPIV3Schema"),
    (_widget_crd(additionalPrinterColumns=[1]), "spec.versions[0].additionalPrinterColumns"),
    (_widget_crd(storage="yes"), "spec.versions[0].storage"),
    (dict(_widget_crd(), spec={"group": "example.org", "names": "widgets",
                               "versions": [{"name": "v1", "storage": True}]}), "spec.names"),
    (dict(_widget_crd(), spec={"group": "example.org", "scope": "Galaxy",
                               "names": {"plural": "widgets", "kind": "Widget"},
                               "versions": [{"name": "v1", "storage": True}]}), "spec.scope"),
    (dict(_widget_crd(), spec={"group": "example.org",
                               "names": {"plural": "widgets", "kind": "Widget"},
                               "versions": "v1"}), "spec.versions"),
])
async def test_a_crd_that_cannot_be_served_is_422_and_not_stored(
        api_client: httpx.AsyncClient, crd: dict[str, object], field: str) -> None:
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    with trio.fail_after(10):
        response = await api_client.post(crds, json=crd)
        assert response.status_code == 422, response.text
        assert field in [c["field"] for c in response.json()["details"]["causes"]]
        assert (await api_client.get(f"{crds}/widgets.example.org")).status_code == 404
        assert (await api_client.get("/apis/example.org/v1/widgets")).status_code == 404
        # The installed Proxy CRD is untouched by a bad replacement either.
        proxies = await api_client.get(f"{crds}/proxies.crawl.example.com")
        replaced = dict(proxies.json(), spec=dict(proxies.json()["spec"], versions="v1"))
        assert (await api_client.put(f"{crds}/proxies.crawl.example.com",
                                     json=replaced)).status_code == 422
        await created(api_client, PROXIES, proxy("still-served"))
