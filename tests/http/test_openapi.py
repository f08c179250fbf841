"""`/openapi.json` lists exactly the app's routes and methods, and is what the app serves."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema_rs
import trio

from egressd.http.discovery import create_discovery_app
from egressd.http.openapi import document
from tests.http.support import MemorySource, discovery, make_proxy, make_store

IMPLICIT = {"HEAD", "OPTIONS"}  # added by the framework to every route


def _template(rule: str) -> str:
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", "{}", rule)


def test_every_route_is_documented_and_nothing_else() -> None:
    app = create_discovery_app(
        MemorySource(), store=make_store(), default_ttl=300, max_ttl=3600, token="t")
    routes = {
        (_template(rule.rule), method)
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static"
        for method in (rule.methods or set()) - IMPLICIT
    }
    doc = document(max_ttl=3600, default_ttl=300)
    documented = {
        (re.sub(r"\{[^}]+\}", "{}", path), method.upper())
        for path, ops in doc["paths"].items()
        for method in ops
    }
    assert routes == documented
    # Path parameters are declared for every templated path.
    for path, ops in doc["paths"].items():
        names = set(re.findall(r"\{([^}]+)\}", path))
        for op in ops.values():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == names, path


async def test_served_document_matches() -> None:
    with trio.fail_after(10):
        async with discovery(MemorySource(), max_ttl=1200, default_ttl=60) as client:
            r = await client.get("/openapi.json")
    assert r.status_code == 200
    assert r.json() == document(max_ttl=1200, default_ttl=60)
    schema = r.json()["components"]["schemas"]["LeaseRequest"]["properties"]["ttlSeconds"]
    assert (schema["maximum"], schema["default"]) == (1200, 60)


# --- the document and the API agree on the edge of every request field -------------------

LEASE_PROBES: list[Any] = [
    {}, {"ttlSeconds": None}, {"ttlSeconds": 0}, {"ttlSeconds": 0.5}, {"ttlSeconds": 3600},
    {"ttlSeconds": 3600.5}, {"ttlSeconds": "300"}, {"ttlSeconds": True}, {"ttlSeconds": -1},
    {"target": None}, {"target": "*"}, {"target": ""}, {"target": "a" * 253},
    {"target": "a" * 254}, {"target": 5}, {"target": "**"}, {"selector": None},
    {"selector": {}}, {"selector": {"region": "eu"}}, {"selector": {"region": 1}},
    {"selector": ["region"]}, {"selector": "region=eu"}, {"extra": 1}, [], "x", None,
]
REPORT_PROBES: list[Any] = [
    {"result": "ok"}, {"result": "banned", "target": "t.example"}, {"result": None},
    {"result": "meh"}, {}, {"result": "proxy_error"}, {"result": "ok", "target": None},
    {"result": "ok", "target": "*"}, {"result": "rate_limited", "retryAfterSeconds": None},
    {"result": "rate_limited", "retryAfterSeconds": 0},
    {"result": "rate_limited", "retryAfterSeconds": -0.5},
    {"result": "rate_limited", "retryAfterSeconds": "30"}, {"result": "ok", "x": 1},
]
SELECTOR_PROBES = [
    "", " ", "region=eu", "region=eu,tier=dc", "region=", " region = eu ", "region",
    "=eu", "a=1,,b=2", ",", "a=b=c", "\u00a0=1", "\t=1", "a=1,", "region=eu,region=eu",
]


def _valid(schema: dict[str, Any], value: Any) -> bool:
    # jsonschema_rs (schemathesis's validator): ECMA regex semantics, as a client reads it.
    return bool(jsonschema_rs.validator_for(schema).is_valid(value))


async def test_the_document_and_the_api_agree_on_edge_values() -> None:
    """Each probe the document accepts the API accepts, and each it refuses is a 400:
    `null` where a number or string is optional, `"*"` as a target, the selector's
    grammar (which a schemathesis run with bounded examples may not happen to try)."""
    doc = document(max_ttl=3600, default_ttl=300)
    schemas = doc["components"]["schemas"]
    source = MemorySource([make_proxy("a", attributes={"region": "eu"}, max_leases=10_000)])
    selector_schema = next(
        p["schema"] for p in doc["paths"]["/v1/proxies"]["get"]["parameters"]
        if p["name"] == "selector")
    disagreements = []
    with trio.fail_after(30):
        async with discovery(source, max_ttl=3600, default_ttl=300) as client:
            for body in LEASE_PROBES:
                r = await client.post("/v1/leases", content=json.dumps(body),
                                      headers={"content-type": "application/json"})
                if _valid(schemas["LeaseRequest"], body) != (r.status_code == 201):
                    disagreements.append(("lease", body, r.status_code))
            lease_id = (await client.post("/v1/leases", json={})).json()["leaseId"]
            for body in REPORT_PROBES:
                r = await client.post(f"/v1/leases/{lease_id}/report", content=json.dumps(body),
                                      headers={"content-type": "application/json"})
                if _valid(schemas["Report"], body) != (r.status_code == 204):
                    disagreements.append(("report", body, r.status_code))
            for text in SELECTOR_PROBES:
                r = await client.get("/v1/proxies", params={"selector": text})
                if _valid(selector_schema, text) != (r.status_code == 200):
                    disagreements.append(("selector", text, r.status_code))
    # Not probed: a key named twice with two values (`a=1,a=2`), refused though the
    # grammar allows it; the document's description says so.
    assert disagreements == []
