"""Server-side apply with field managers, and replace's resourceVersion rule.

As kube-apiserver: an apply owns exactly the fields of its configuration
(managedFields), drops the fields it no longer sets, and a field another
manager owns with another value is a 409 unless forced.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio
import yaml

from egressd.sandbox.apiserver import FakeApiServer
from tests.sandbox.apiserver.support import APPLY, MERGE, PROXIES, created, proxy


def config(**attributes: str) -> bytes:
    body = proxy("p")
    body["spec"]["attributes"] = attributes
    return yaml.safe_dump(body).encode()


async def apply(client: httpx.AsyncClient, body: bytes, manager: str, *,
                force: bool = False) -> httpx.Response:
    params = {"fieldManager": manager, **({"force": "true"} if force else {})}
    return await client.patch(f"{PROXIES}/p", headers=APPLY, params=params, content=body)


def owners(obj: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {(e["manager"], e["operation"]): e["fieldsV1"]
            for e in obj["metadata"]["managedFields"]}


async def test_apply_records_its_fields_and_removes_those_it_no_longer_sets(
        apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        first = await apply(api_client, config(team="crawl", env="prod"), "ci")
        assert first.status_code == 201, first.text
        fields = owners(first.json())[("ci", "Apply")]
        assert fields["f:spec"]["f:attributes"] == {"f:env": {}, "f:team": {}}
        assert fields["f:spec"]["f:endpoint"] == {"f:host": {}, "f:port": {}}
        entry = first.json()["metadata"]["managedFields"][0]
        assert (entry["fieldsType"], entry["apiVersion"]) == (
            "FieldsV1", "crawl.example.com/v1alpha1")

        second = await apply(api_client, config(team="crawl"), "ci")
        assert second.status_code == 200, second.text
        assert second.json()["spec"]["attributes"] == {"team": "crawl"}
        assert owners(second.json())[("ci", "Apply")]["f:spec"]["f:attributes"] == {
            "f:team": {}}
        stored = (await api_client.get(f"{PROXIES}/p")).json()
        assert stored["spec"]["attributes"] == {"team": "crawl"}


async def test_another_managers_field_is_a_409_unless_forced(
        apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await apply(api_client, config(team="crawl"), "ci")
        clash = await apply(api_client, config(team="search"), "alice")
        assert clash.status_code == 409, clash.text
        status = clash.json()
        assert status["reason"] == "Conflict"
        assert status["message"] == ('Apply failed with 1 conflict: conflict with "ci": '
                                     ".spec.attributes.team")
        assert status["details"]["causes"] == [{
            "reason": "FieldManagerConflict", "message": 'conflict with "ci"',
            "field": ".spec.attributes.team"}]
        assert (await api_client.get(f"{PROXIES}/p")).json()["spec"]["attributes"] == {
            "team": "crawl"}

        forced = await apply(api_client, config(team="search"), "alice", force=True)
        assert forced.status_code == 200, forced.text
        assert forced.json()["spec"]["attributes"] == {"team": "search"}
        fields = owners(forced.json())
        assert fields[("alice", "Apply")]["f:spec"]["f:attributes"] == {"f:team": {}}
        assert "f:attributes" not in fields[("ci", "Apply")]["f:spec"]


async def test_the_same_value_is_shared_and_outlives_one_owner(
        apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await apply(api_client, config(team="crawl", env="prod"), "ci")
        shared = await apply(api_client, config(team="crawl"), "alice")
        assert shared.status_code == 200, shared.text
        # ci stops setting team: alice still owns it, so it stays; env was ci's alone.
        body = proxy("p")
        body["spec"]["attributes"] = {"env": "prod"}
        left = await apply(api_client, yaml.safe_dump(body).encode(), "ci")
        assert left.status_code == 200, left.text
        assert left.json()["spec"]["attributes"] == {"team": "crawl", "env": "prod"}


async def test_an_update_takes_over_the_fields_it_changes(
        apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await apply(api_client, config(team="crawl"), "ci")
        edit = await api_client.patch(f"{PROXIES}/p", headers=MERGE,
                                      params={"fieldManager": "kubectl-edit"},
                                      json={"spec": {"attributes": {"team": "ops"}}})
        assert edit.status_code == 200, edit.text
        fields = owners(edit.json())
        assert fields[("kubectl-edit", "Update")]["f:spec"] == {
            "f:attributes": {"f:team": {}}}
        assert "f:attributes" not in fields[("ci", "Apply")]["f:spec"]
        clash = await apply(api_client, config(team="crawl"), "ci")
        assert clash.status_code == 409
        assert clash.json()["message"] == (
            'Apply failed with 1 conflict: conflict with "kubectl-edit" using '
            "crawl.example.com/v1alpha1: .spec.attributes.team")


async def test_a_writer_without_field_manager_is_named_by_its_user_agent(
        apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        response = await api_client.post(PROXIES, json=proxy("p"),
                                         headers={"User-Agent": "egressd/0.1.0 (linux)"})
        assert response.status_code == 201
        assert list(owners(response.json())) == [("egressd", "Update")]


async def test_replace_without_resource_version_is_422(
        apiserver: FakeApiServer, api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        body = await created(api_client, PROXIES, proxy("p"))
        body["metadata"].pop("resourceVersion")
        body["spec"]["endpoint"]["port"] = 1
        response = await api_client.put(f"{PROXIES}/p", json=body)
        assert response.status_code == 422, response.text
        assert response.json()["details"]["causes"][0]["field"] == "metadata.resourceVersion"
        stored = (await api_client.get(f"{PROXIES}/p")).json()
        assert stored["spec"]["endpoint"]["port"] == 3128
