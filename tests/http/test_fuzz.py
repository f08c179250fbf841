"""Property: whatever method, path, query and body a client sends, the API never answers 5xx.

The server runs on the test's trio loop; hypothesis drives a synchronous httpx
client from a worker thread, so each example is a real HTTP round trip. Every
4xx must carry the error shape and leave the lease store as it was.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egressd.leases.store import MemoryLeaseStore
from tests.http.support import EPOCH, TOKEN, MemorySource, discovery, make_proxy

FIELDS = ["selector", "target", "ttlSeconds", "result", "retryAfterSeconds"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4).map(
        lambda v: json.dumps(v).encode()),
    st.sampled_from([b"", b"{}", b'{"result": "banned"}', b'{"ttlSeconds": 1}']),
)
segments = st.text(min_size=1, max_size=12).map(lambda s: quote(s, safe=""))
LEASE = "{lease}"  # replaced by the id of a real lease at run time
# Mostly the API's own routes with the right method, so bodies reach the parsers.
routes = st.one_of(
    st.just(("GET", "/v1/proxies")),
    st.just(("POST", "/v1/leases")),
    st.tuples(st.just("POST"), (st.just(LEASE) | segments).map(
        lambda s: f"/v1/leases/{s}/report")),
    st.tuples(st.just("DELETE"), (st.just(LEASE) | segments).map(lambda s: f"/v1/leases/{s}")),
)
any_routes = st.tuples(
    st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH"]),
    st.one_of(
        st.sampled_from(["/v1/proxies", "/v1/leases", "/healthz", "/openapi.json", "/"]),
        segments.map(lambda s: f"/v1/leases/{s}"),
        segments.map(lambda s: f"/v1/leases/{s}/report"),
        st.lists(segments, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts)),
    ),
)
queries = st.dictionaries(
    st.sampled_from(["selector", "healthy", "x"]), st.text(max_size=20), max_size=3)


async def test_no_5xx_and_4xx_changes_nothing() -> None:
    source = MemorySource([
        make_proxy("a", attributes={"region": "eu"}, max_leases=3),
        make_proxy("b", attributes={"region": "us"}, healthy=False),
    ])
    # The store's clock stands still, so leases granted by earlier examples cannot expire
    # between the before/after snapshots: any change is the request's doing.
    store = MemoryLeaseStore(cooldown=600, ban_cooldown=3600, max_cooldown=3600,
                             clock=lambda: EPOCH)

    async def state() -> Any:
        usage = await store.usage(["crawl/a", "crawl/b"])
        return store.remembered(), usage

    with trio.fail_after(100):
        async with discovery(source, store) as client:
            base = str(client.base_url)
            lease_id = (await client.post("/v1/leases", json={})).json()["leaseId"]

            @settings(max_examples=150, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow])
            @given(route=routes | routes | routes | any_routes, query=queries, body=bodies,
                   auth=st.sampled_from([True, True, True, True, False]))
            def one_request(route: tuple[str, str], query: dict[str, str], body: bytes,
                            auth: bool) -> None:
                method, path = route[0], route[1].replace(LEASE, lease_id)
                before = trio.from_thread.run(state)
                headers = {"Authorization": f"Bearer {TOKEN}"} if auth else {}
                r = http.request(method, base.rstrip("/") + path, params=query, content=body,
                                 headers=headers)
                assert r.status_code < 500, (method, path, query, body, r.text)
                if r.status_code >= 400:
                    payload = r.json()
                    assert isinstance(payload.get("error"), str), r.text
                    assert isinstance(payload.get("message"), str), r.text
                    assert trio.from_thread.run(state) == before, (method, path, body)

            with httpx.Client(timeout=10) as http:
                await trio.to_thread.run_sync(one_request)
