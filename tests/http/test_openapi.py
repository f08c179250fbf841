"""`/openapi.json` lists exactly the app's routes and methods, and is what the app serves."""

from __future__ import annotations

import re

import trio

from egressd.http.discovery import create_discovery_app
from egressd.http.openapi import document
from tests.http.support import MemorySource, discovery, make_store

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
