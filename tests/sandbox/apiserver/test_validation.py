"""The Proxy CRD enforced on every write path: defaults, pruning, structural and CEL rules."""

from __future__ import annotations

import httpx
import trio

from tests.sandbox.apiserver.support import APPLY, JSON_PATCH, MERGE, PROXIES, created, proxy


async def test_defaults_are_applied_on_create(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, PROXIES, proxy("a"))
        assert obj["spec"]["port"] == 3128
        assert obj["spec"]["healthCheck"]["intervalSeconds"] == 30


async def test_cel_rule_refusal_is_a_422_naming_the_field(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        response = await api_client.post(PROXIES, json=proxy("bad", provider="gcp-eu"))
        assert response.status_code == 422
        status = response.json()
        assert status["kind"] == "Status" and status["reason"] == "Invalid"
        assert status["message"].startswith('Proxy.crawl.example.com "bad" is invalid: ')
        assert "an External proxy must not set spec.provider" in status["message"]
        assert status["details"]["name"] == "bad" and status["details"]["kind"] == "Proxy"
        assert status["details"]["group"] == "crawl.example.com"
        causes = status["details"]["causes"]
        assert causes and all({"reason", "message", "field"} <= set(c) for c in causes)
        assert any(c["field"].startswith("spec") for c in causes)


async def test_structural_errors_on_every_write_path(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, PROXIES, proxy("a"))
        obj["spec"]["port"] = 70000
        put = await api_client.put(f"{PROXIES}/a", json=obj)
        merge = await api_client.patch(f"{PROXIES}/a", headers=MERGE,
                                       json={"spec": {"port": 0}})
        json_patch = await api_client.patch(f"{PROXIES}/a", headers=JSON_PATCH, json=[
            {"op": "replace", "path": "/spec/port", "value": -1}])
        apply = await api_client.patch(
            f"{PROXIES}/a", headers=APPLY, params={"fieldManager": "t"},
            content=b"apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
                    b"metadata: {name: a}\nspec: {port: 99999}\n")
        for response in (put, merge, json_patch, apply):
            assert response.status_code == 422, response.text
            assert any(c["field"] == "spec.port" for c in response.json()["details"]["causes"])
        assert (await api_client.get(f"{PROXIES}/a")).json()["spec"]["port"] == 3128


async def test_transition_rule_mode_is_immutable(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        response = await api_client.patch(f"{PROXIES}/a", headers=MERGE, json={"spec": {
            "mode": "Managed", "provider": "p", "endpoint": None}})
        assert response.status_code == 422
        assert "spec.mode is immutable" in response.json()["message"]


async def test_status_writes_are_validated_against_the_status_schema(
        api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        await created(api_client, PROXIES, proxy("a"))
        bad = await api_client.patch(f"{PROXIES}/a/status", headers=MERGE,
                                     json={"status": {"phase": "Dancing"}})
        assert bad.status_code == 422
        assert any(c["field"] == "status.phase" for c in bad.json()["details"]["causes"])
        good = await api_client.patch(f"{PROXIES}/a/status", headers=MERGE,
                                      json={"status": {"phase": "Ready"}})
        assert good.status_code == 200


async def test_unknown_fields_are_pruned_warned_or_refused(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        body = proxy("a", colour="blue")
        warned = await api_client.post(PROXIES, json=body)
        assert warned.status_code == 201
        assert "colour" not in warned.json()["spec"]
        assert 'unknown field \\"spec.colour\\"' in warned.headers["Warning"]
        body["metadata"]["name"] = "b"
        strict = await api_client.post(PROXIES, json=body, params={"fieldValidation": "Strict"})
        assert strict.status_code == 400
        assert "strict decoding error" in strict.json()["message"]
        body["metadata"]["name"] = "c"
        ignored = await api_client.post(PROXIES, json=body, params={"fieldValidation": "Ignore"})
        assert ignored.status_code == 201 and "Warning" not in ignored.headers


async def test_put_needs_a_resource_version_for_custom_resources(
        api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        obj = await created(api_client, PROXIES, proxy("a"))
        del obj["metadata"]["resourceVersion"]
        response = await api_client.put(f"{PROXIES}/a", json=obj)
        assert response.status_code == 422
        assert response.json()["details"]["causes"][0]["field"] == "metadata.resourceVersion"


async def test_invalid_names_are_422(api_client: httpx.AsyncClient) -> None:
    with trio.fail_after(10):
        response = await api_client.post(PROXIES, json=proxy("Not_A_Name"))
        assert response.status_code == 422
        assert response.json()["details"]["causes"][0]["field"] == "metadata.name"
        unnamed = proxy("x")
        del unnamed["metadata"]["name"]
        assert (await api_client.post(PROXIES, json=unnamed)).status_code == 422
        unnamed["metadata"]["generateName"] = "px-"
        generated = await created(api_client, PROXIES, unnamed)
        assert generated["metadata"]["name"].startswith("px-")
