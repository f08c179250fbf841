"""The discovery API over real HTTP on 127.0.0.1 (SPEC §7, issue 6 item 4).

Every response is also checked against the OpenAPI document's schema for its
route and status, so the document and the wire shapes cannot drift apart.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from egressd.http.discovery import create_discovery_app
from egressd.http.openapi import document
from tests.http.schema_check import check_response
from tests.http.support import (
    TOKEN,
    MemorySource,
    discovery,
    make_proxy,
    make_store,
    running,
    trio_wall,
)

DOC = document(max_ttl=3600.0, default_ttl=300.0)


async def call(client: httpx.AsyncClient, method: str, template: str, path: str | None = None,
               **kw: Any) -> httpx.Response:
    """One request; the response must match the document for `template`."""
    response = await client.request(method, path or template, **kw)
    body = response.json() if response.content else None
    check_response(DOC, path=template, method=method, status=response.status_code, body=body,
                   content_type=response.headers.get("content-type"))
    return response


async def lease(client: httpx.AsyncClient, body: Any = None, **kw: Any) -> httpx.Response:
    return await call(client, "POST", "/v1/leases", json=body, **kw)


async def report(client: httpx.AsyncClient, lease_id: str, body: Any) -> httpx.Response:
    return await call(client, "POST", "/v1/leases/{leaseId}/report",
                      f"/v1/leases/{lease_id}/report", json=body)


def error_of(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) >= {"error", "message"} and isinstance(body["message"], str), body
    return str(body["error"])


async def jump(clock: trio.testing.MockClock, seconds: float) -> None:
    clock.jump(seconds)
    await trio.testing.wait_all_tasks_blocked()


# --- auth -------------------------------------------------------------------------------

async def test_auth_required_wrong_and_exempt() -> None:
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a")]), token=TOKEN) as client:
            assert (await call(client, "GET", "/v1/proxies")).status_code == 200
            for headers in ({"Authorization": ""}, {"Authorization": "Bearer nope"},
                            {"Authorization": f"Basic {TOKEN}"},
                            {"Authorization": f"Bearer {TOKEN}x"},
                            # Every strict prefix of the token is as wrong as any other.
                            *({"Authorization": f"Bearer {TOKEN[:n]}"}
                              for n in range(1, len(TOKEN)))):
                r = await call(client, "GET", "/v1/proxies", headers=headers)
                assert r.status_code == 401 and error_of(r) == "unauthorized"
                assert r.headers["www-authenticate"].startswith("Bearer")
            r = await client.post("/v1/leases", json={}, headers={"Authorization": "Bearer x"})
            assert r.status_code == 401
            r = await call(client, "GET", "/healthz", headers={"Authorization": ""})
            assert r.status_code == 200 and r.json() == {"status": "ok"}
            # The refused acquire changed nothing.
            assert (await call(client, "GET", "/v1/proxies")).json()["items"][0][
                "activeLeases"] == 0


async def test_no_token_serves_open_with_one_loud_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="egressd")
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a")]), token=None) as client:
            r = await call(client, "GET", "/v1/proxies")
            assert r.status_code == 200
            assert (await lease(client, {})).status_code == 201
    warnings = [r for r in caplog.records if "UNAUTHENTICATED" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


# --- listing ----------------------------------------------------------------------------

async def test_list_with_selectors_and_healthy() -> None:
    source = MemorySource([
        make_proxy("eu-1", attributes={"region": "eu", "tier": "dc"}, latency=12),
        make_proxy("eu-2", attributes={"region": "eu", "tier": "residential"}, healthy=False),
        make_proxy("us-1", attributes={"region": "us", "tier": "dc"}, healthy=None),
    ])

    async def names(query: str) -> list[str]:
        r = await call(client, "GET", "/v1/proxies", f"/v1/proxies{query}")
        assert r.status_code == 200, r.text
        return [p["name"] for p in r.json()["items"]]

    with trio.fail_after(10):
        async with discovery(source) as client:
            assert await names("") == ["eu-1", "eu-2", "us-1"]
            assert await names("?selector=region=eu") == ["eu-1", "eu-2"]
            assert await names("?selector=region=eu,tier=dc") == ["eu-1"]
            assert await names("?selector=region%3Deu%2Ctier%3Ddc") == ["eu-1"]
            assert await names("?selector=region=mars") == []
            assert await names("?healthy=true") == ["eu-1"]
            assert await names("?healthy=false") == ["eu-2", "us-1"]
            assert await names("?selector=tier=dc&healthy=false") == ["us-1"]
            for bad in ("?selector=region", "?selector==eu", "?selector=a=1,,b=2",
                        "?selector=a=1,a=2", "?selector=a=1&selector=b=2"):
                r = await call(client, "GET", "/v1/proxies", f"/v1/proxies{bad}")
                assert r.status_code == 400 and error_of(r) == "invalid_selector", bad
            for bad in ("?healthy=maybe", "?color=red"):
                r = await call(client, "GET", "/v1/proxies", f"/v1/proxies{bad}")
                assert r.status_code == 400 and error_of(r) == "invalid_query", bad
            view = (await call(client, "GET", "/v1/proxies", "/v1/proxies?selector=tier=dc"
                               "&healthy=true")).json()["items"][0]
    assert view == {
        "namespace": "crawl", "name": "eu-1", "host": "10.0.0.1", "port": 3128,
        "attributes": {"region": "eu", "tier": "dc"}, "healthy": True, "latencyMs": 12,
        "activeLeases": 0, "maxLeases": 10, "phase": "Ready", "cooldowns": {},
    }


# --- acquire ----------------------------------------------------------------------------

async def test_grant_shape(clock: trio.testing.MockClock) -> None:
    source = MemorySource([
        make_proxy("slow", attributes={"region": "eu"}, latency=300, host="10.0.0.2", port=8888),
        make_proxy("fast", attributes={"region": "eu"}, latency=20, host="fd00::1", port=3129),
    ])
    with trio.fail_after(10):
        async with discovery(source) as client:
            before = trio_wall()
            r = await lease(client, {"selector": {"region": "eu"}, "target": "example.org",
                                     "ttlSeconds": 120})
            assert r.status_code == 201, r.text
            body = r.json()
            assert body["proxy"]["name"] == "fast"
            assert body["proxyUrl"] == "http://[fd00::1]:3129"
            assert body["activeLeases"] == body["proxy"]["activeLeases"] == 1
            assert len(body["leaseId"]) >= 32
            expires = httpx_time(body["expiresAt"])
            assert before + 120 <= expires <= trio_wall() + 120
            # Default TTL when omitted; the least-leased proxy goes next.
            r = await lease(client, {"selector": {"region": "eu"}})
            assert r.json()["proxy"]["name"] == "slow"
            assert r.json()["proxyUrl"] == "http://10.0.0.2:8888"
            assert httpx_time(r.json()["expiresAt"]) == pytest.approx(trio_wall() + 300, abs=2)
            # An empty body (curl -X POST) leases any proxy.
            r = await call(client, "POST", "/v1/leases", content=b"")
            assert r.status_code == 201


def httpx_time(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def test_409_arithmetic() -> None:
    source = MemorySource([
        make_proxy("full", attributes={"pool": "a"}, max_leases=1),
        make_proxy("never", attributes={"pool": "a"}, max_leases=0),
        make_proxy("cool", attributes={"pool": "a"}),
        make_proxy("sick", attributes={"pool": "a"}, healthy=False),
        make_proxy("unprobed", attributes={"pool": "a"}, healthy=None),
        make_proxy("hostless", attributes={"pool": "a"}, host=None),
        make_proxy("going", attributes={"pool": "a"}, deleting=True),
        make_proxy("elsewhere", attributes={"pool": "b"}),
    ])
    with trio.fail_after(10):
        async with discovery(source) as client:
            # Fill "full", then put "cool" into a global cooldown.
            names = set()
            for _ in range(2):
                r = await lease(client, {"selector": {"pool": "a"}})
                names.add(r.json()["proxy"]["name"])
                if r.json()["proxy"]["name"] == "cool":
                    assert (await report(client, r.json()["leaseId"],
                                         {"result": "banned"})).status_code == 204
            assert names == {"full", "cool"}
            r = await lease(client, {"selector": {"pool": "a"}, "target": "x.example"})
            assert r.status_code == 409
            assert r.json() == {
                "error": "no_proxy_available", "message": r.json()["message"],
                "considered": 7, "unhealthy": 4, "atCapacity": 2, "inCooldown": 1,
            }
            r = await lease(client, {"selector": {"pool": "nowhere"}})
            assert r.status_code == 409
            assert (r.json()["considered"], r.json()["unhealthy"]) == (0, 0)


async def test_only_ready_proxies_are_leased_whatever_a_stale_condition_says() -> None:
    # Issue 11 item 3 / SPEC §7: every one of these still carries Healthy=True (a condition
    # left from before its phase changed), a host and no deletionTimestamp.
    stale = ["Failed", "Deleting", "Provisioning", "Pending", "Unhealthy"]
    source = MemorySource(
        [make_proxy(f"stale-{phase.lower()}", phase=phase, latency=1, attributes={"pool": "a"})
         for phase in stale]
        + [make_proxy("ready", latency=900, max_leases=2, attributes={"pool": "a"})])
    with trio.fail_after(10):
        async with discovery(source) as client:
            for _ in range(2):  # the slowest proxy, because it is the only Ready one
                r = await lease(client, {"selector": {"pool": "a"}})
                assert r.status_code == 201 and r.json()["proxy"]["name"] == "ready"
            r = await lease(client, {"selector": {"pool": "a"}})
            assert r.status_code == 409
            body = r.json()
            assert (body["considered"], body["unhealthy"], body["atCapacity"],
                    body["inCooldown"]) == (6, 5, 1, 0)
            # The listing still shows them as the cache has them.
            items = (await call(client, "GET", "/v1/proxies")).json()["items"]
            assert sorted(p["phase"] for p in items) == sorted([*stale, "Ready"])


async def test_ttl_rules() -> None:
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a")]), max_ttl=600) as client:
            for ttl in (0, -1, -0.5, 600.5, 10**6):
                r = await lease(client, {"ttlSeconds": ttl})
                assert r.status_code == 400 and error_of(r) == "invalid_ttl", ttl
            assert (await lease(client, {"ttlSeconds": 600})).status_code == 201
            assert (await lease(client, {"ttlSeconds": 0.5})).status_code == 201
            assert (await lease(client, {"ttlSeconds": None})).status_code == 201


@pytest.mark.parametrize(("body", "code"), [
    (b"{", "invalid_body"),
    (b"[]", "invalid_body"),
    (b'"x"', "invalid_body"),
    (b"\xff\xfe{", "invalid_body"),
    (b'{"ttlSeconds": NaN}', "invalid_body"),
    (b'{"ttlSeconds": 1e999}', "invalid_body"),
    (b'{"ttlSeconds": "300"}', "invalid_body"),
    (b'{"ttlSeconds": true}', "invalid_body"),
    (b'{"selector": ["region"]}', "invalid_body"),
    (b'{"selector": {"region": 1}}', "invalid_body"),
    (b'{"target": 5}', "invalid_body"),
    (b'{"target": "*"}', "invalid_body"),
    (b'{"selektor": {}}', "invalid_body"),
    (b'{"target": "a", "target": "b"}', "invalid_body"),
    (b"[" * 20000 + b"]" * 20000, "invalid_body"),
])
async def test_bad_lease_bodies_change_nothing(body: bytes, code: str) -> None:
    store = make_store()
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a")]), store) as client:
            r = await call(client, "POST", "/v1/leases", content=body,
                           headers={"content-type": "application/json"})
            assert r.status_code == 400 and error_of(r) == code, r.text
    assert store.remembered() == 0


async def test_body_over_64k_is_413() -> None:
    store = make_store()
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a")]), store) as client:
            big = b'{"target": "' + b"a" * (65 * 1024) + b'"}'
            r = await call(client, "POST", "/v1/leases", content=big)
            assert r.status_code == 413 and error_of(r) == "body_too_large"

            async def chunks() -> Any:  # no content-length: chunked, counted as it arrives
                for _ in range(65):
                    yield b"a" * 1024

            r = await call(client, "POST", "/v1/leases", content=chunks())
            assert r.status_code == 413
            # Exactly at the cap is read (and then refused as JSON, not as size).
            r = await call(client, "POST", "/v1/leases", content=b" " * (64 * 1024))
            assert r.status_code == 201
    assert store.remembered() == 1


# --- release and report -----------------------------------------------------------------

async def test_delete_is_idempotent_and_frees_capacity() -> None:
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a", max_leases=1)])) as client:
            lease_id = (await lease(client, {})).json()["leaseId"]
            assert (await lease(client, {})).status_code == 409
            for path in (f"/v1/leases/{lease_id}", f"/v1/leases/{lease_id}", "/v1/leases/nope"):
                r = await call(client, "DELETE", "/v1/leases/{leaseId}", path)
                assert r.status_code == 204 and r.content == b""
            assert (await lease(client, {})).status_code == 201


async def test_report_validation_and_unknown_lease() -> None:
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a")])) as client:
            lease_id = (await lease(client, {"target": "t.example"})).json()["leaseId"]
            for body in ({"result": "meh"}, {}, {"result": 3}, {"result": None}):
                r = await report(client, lease_id, body)
                assert r.status_code == 400 and error_of(r) == "invalid_result", body
            for body in ({"result": "ok", "extra": 1}, {"result": "ok", "target": 3},
                         {"result": "rate_limited", "retryAfterSeconds": -1},
                         {"result": "rate_limited", "retryAfterSeconds": "30"}):
                r = await report(client, lease_id, body)
                assert r.status_code == 400 and error_of(r) == "invalid_body", body
            r = await report(client, "not-a-lease", {"result": "ok"})
            assert r.status_code == 404 and error_of(r) == "unknown_lease"
            # None of the bad reports started a cooldown.
            view = (await call(client, "GET", "/v1/proxies")).json()["items"][0]
            assert view["cooldowns"] == {}
            assert (await report(client, lease_id, {"result": "ok"})).status_code == 204


async def test_report_cooldown_409_then_expiry(clock: trio.testing.MockClock) -> None:
    store = make_store(cooldown=600)
    with trio.fail_after(30 + 605):  # the deadline moves with the jumps below
        async with discovery(MemorySource([make_proxy("a")]), store) as client:
            lease_id = (await lease(client, {"target": "shop.example"})).json()["leaseId"]
            assert (await report(client, lease_id, {"result": "rate_limited"})).status_code == 204
            r = await lease(client, {"target": "shop.example"})
            assert r.status_code == 409 and r.json()["inCooldown"] == 1
            # Other targets and target-less leases are unaffected by a target cooldown.
            assert (await lease(client, {"target": "other.example"})).status_code == 201
            assert (await lease(client, {})).status_code == 201
            view = (await call(client, "GET", "/v1/proxies")).json()["items"][0]
            assert list(view["cooldowns"]) == ["shop.example"]
            assert view["cooldowns"]["shop.example"]["reason"] == "rate_limited"
            until = httpx_time(view["cooldowns"]["shop.example"]["until"])
            assert until == pytest.approx(trio_wall() + 600, abs=5)
            await jump(clock, 590)
            assert (await lease(client, {"target": "shop.example"})).status_code == 409
            await jump(clock, 15)
            assert (await lease(client, {"target": "shop.example"})).status_code == 201
            view = (await call(client, "GET", "/v1/proxies")).json()["items"][0]
            assert view["cooldowns"] == {}


async def test_retry_after_bounds_and_ban_duration(clock: trio.testing.MockClock) -> None:
    store = make_store(cooldown=600, ban_cooldown=7200, max_cooldown=1800)
    with trio.fail_after(30):
        async with discovery(MemorySource([make_proxy("a")]), store) as client:
            lease_id = (await lease(client, {})).json()["leaseId"]
            cases = {"t0": ({"retryAfterSeconds": 0}, 1), "t1": ({"retryAfterSeconds": 0.2}, 1),
                     "t2": ({"retryAfterSeconds": 45}, 45),
                     "t3": ({"retryAfterSeconds": 10**9}, 1800), "t4": ({}, 600)}
            for target, (extra, _) in cases.items():
                body = {"result": "rate_limited", "target": target, **extra}
                assert (await report(client, lease_id, body)).status_code == 204
            body = {"result": "banned", "target": "t5", "retryAfterSeconds": 45}
            assert (await report(client, lease_id, body)).status_code == 204
            now = trio_wall()
            cds = (await call(client, "GET", "/v1/proxies")).json()["items"][0]["cooldowns"]
            for target, (_, seconds) in cases.items():
                assert httpx_time(cds[target]["until"]) - now == pytest.approx(seconds, abs=1)
            assert httpx_time(cds["t5"]["until"]) - now == pytest.approx(7200, abs=1)
            assert cds["t5"]["reason"] == "banned"


async def test_late_report_on_expired_lease(clock: trio.testing.MockClock) -> None:
    store = make_store(cooldown=600)
    with trio.fail_after(30 + 611):  # the deadline moves with the jumps below
        source = MemorySource([make_proxy("a", max_leases=1)])
        async with discovery(source, store) as client:
            lease_id = (await lease(client, {"ttlSeconds": 10})).json()["leaseId"]
            await jump(clock, 11)
            # Expired: its slot is free again without any sweeper ...
            other = (await lease(client, {"target": "x"})).json()["leaseId"]
            await call(client, "DELETE", "/v1/leases/{leaseId}", f"/v1/leases/{other}")
            # ... but a late report still lands on it.
            r = await report(client, lease_id, {"result": "banned"})
            assert r.status_code == 204
            assert (await lease(client, {})).json()["inCooldown"] == 1
            await jump(clock, 600)
            r = await report(client, lease_id, {"result": "ok"})
            assert r.status_code == 404 and error_of(r) == "unknown_lease"


async def test_200_concurrent_acquires_against_capacity_5() -> None:
    source = MemorySource([make_proxy("a", max_leases=5), make_proxy("b", max_leases=0)])
    statuses: list[int] = []
    with trio.fail_after(60):
        # httpx's 5 s default includes the wait for one of its 100 pooled connections,
        # which half of the 200 requests make; on a loaded machine that wait ran out.
        # The whole test stays bounded by the fail_after above.
        async with discovery(source, timeout=httpx.Timeout(50.0)) as client:

            async def one() -> None:
                r = await client.post("/v1/leases", json={"ttlSeconds": 60})
                statuses.append(r.status_code)

            async with trio.open_nursery() as nursery:
                for _ in range(200):
                    nursery.start_soon(one)
            view = (await call(client, "GET", "/v1/proxies")).json()["items"][0]
    assert statuses.count(201) == 5
    assert statuses.count(409) == 195
    assert view["activeLeases"] == 5


# --- framework errors -------------------------------------------------------------------

async def test_unknown_routes_and_methods_use_the_error_shape() -> None:
    with trio.fail_after(10):
        async with discovery(MemorySource()) as client:
            r = await client.get("/v2/nothing")
            assert r.status_code == 404 and error_of(r) == "not_found"
            r = await client.put("/v1/leases", json={})
            assert r.status_code == 405 and error_of(r) == "method_not_allowed"
            assert "POST" in r.headers["allow"]
            r = await client.get("/v1/leases/abc/report")
            assert r.status_code == 405 and error_of(r) == "method_not_allowed"


async def test_recovery_answers_500_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    app = create_discovery_app(MemorySource(), store=make_store(), default_ttl=300,
                               max_ttl=3600, token=TOKEN)

    @app.get("/boom")
    async def boom() -> str:
        raise RuntimeError("kaboom details")

    with trio.fail_after(10):
        async with running(app, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            r = await client.get("/boom")
            assert r.status_code == 500
            assert r.json() == {"error": "internal_error", "message": "internal server error"}
            # The server survives it.
            assert (await client.get("/healthz")).status_code == 200
    errors = [rec for rec in caplog.records if rec.getMessage() == "unhandled error"]
    assert len(errors) == 1 and errors[0].exc_info is not None


async def test_report_proxy_error_is_accepted_and_starts_no_cooldown() -> None:
    counted: list[str] = []
    store = make_store()
    store._on_proxy_error = counted.append  # what app.py wires to the health engine
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a", max_leases=2)]), store) as client:
            lease_id = (await lease(client, {"target": "t.example"})).json()["leaseId"]
            body = {"result": "proxy_error", "target": "t.example", "retryAfterSeconds": 5}
            assert (await report(client, lease_id, body)).status_code == 204
            view = (await call(client, "GET", "/v1/proxies")).json()["items"][0]
            assert view["cooldowns"] == {}
            assert (await lease(client, {"target": "t.example"})).status_code == 201
            r = await report(client, "not-a-lease", {"result": "proxy_error"})
            assert r.status_code == 404 and error_of(r) == "unknown_lease"
    assert len(counted) == 1 and counted[0].endswith("/a")


# --- issue 11 item 10: Retry-After on a 409, GET /v1/leases/{id} -------------------------

async def test_409_retry_after_is_the_soonest_end_among_the_matches(
    clock: trio.testing.MockClock,
) -> None:
    source = MemorySource([
        make_proxy("busy", attributes={"pool": "a"}, max_leases=1),
        make_proxy("banned", attributes={"pool": "a"}, latency=1),
        make_proxy("never", attributes={"pool": "z"}, max_leases=0),
    ])
    with trio.fail_after(10 + 100):  # the deadline moves with the jump below
        async with discovery(source) as client:
            r = await lease(client, {"selector": {"pool": "a"}, "target": "shop.example"})
            assert r.json()["proxy"]["name"] == "banned"
            r = await report(client, r.json()["leaseId"], {"result": "banned"})  # 3600 s
            r = await lease(client, {"selector": {"pool": "a"}, "ttlSeconds": 120,
                                     "target": "shop.example"})
            assert r.json()["proxy"]["name"] == "busy"
            r = await lease(client, {"selector": {"pool": "a"}, "target": "shop.example"})
            assert r.status_code == 409 and r.json()["inCooldown"] == 1
            # busy's lease ends in 120 s, banned's cooldown in 3600 s: the sooner wins.
            assert 119 <= int(r.headers["retry-after"]) <= 120
            await jump(clock, 100)
            r = await lease(client, {"selector": {"pool": "a"}, "target": "shop.example"})
            assert 19 <= int(r.headers["retry-after"]) <= 20
            # Nothing will ever end for a maxLeases 0 proxy, nor for no match: no header.
            for selector in ({"pool": "z"}, {"pool": "nowhere"}):
                r = await lease(client, {"selector": selector})
                assert r.status_code == 409 and "retry-after" not in r.headers


async def test_get_lease_shows_an_active_lease_and_404s_otherwise(
    clock: trio.testing.MockClock,
) -> None:
    path = "/v1/leases/{leaseId}"
    source = MemorySource([make_proxy("a", host="10.0.0.9", port=3130, latency=7)])
    with trio.fail_after(10 + 61):  # the deadline moves with the jump below
        async with discovery(source) as client:
            granted = (await lease(client, {"target": "shop.example", "ttlSeconds": 60})).json()
            lease_id = granted["leaseId"]
            r = await call(client, "GET", path, f"/v1/leases/{lease_id}")
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["leaseId"] == lease_id
            assert body["target"] == "shop.example"
            assert body["expiresAt"] == granted["expiresAt"]
            assert body["proxyUrl"] == "http://10.0.0.9:3130"
            assert (body["proxy"]["name"], body["proxy"]["activeLeases"]) == ("a", 1)
            other = (await lease(client, {})).json()["leaseId"]
            r = await call(client, "GET", path, f"/v1/leases/{other}")
            assert r.json()["target"] is None
            # Released: gone at once; the 204 has no body and no content type.
            r = await call(client, "DELETE", path, f"/v1/leases/{other}")
            assert r.status_code == 204 and r.content == b""
            assert "content-type" not in r.headers
            for gone in (other, "never-issued"):
                r = await call(client, "GET", path, f"/v1/leases/{gone}")
                assert r.status_code == 404 and error_of(r) == "unknown_lease"
            # Expired: gone once its TTL has passed, whatever the sweeper did.
            await jump(clock, 61)
            r = await call(client, "GET", path, f"/v1/leases/{lease_id}")
            assert r.status_code == 404 and error_of(r) == "unknown_lease"
