"""The ops app: /metrics in the Prometheus text format, /healthz, /readyz after sync."""

from __future__ import annotations

import trio
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from egressd.http.ops import create_ops_app
from tests.http.support import MemorySource, discovery, make_proxy, running


async def test_healthz_readyz_follow_sync() -> None:
    source = MemorySource(synced=False)
    with trio.fail_after(10):
        async with running(create_ops_app(source)) as client:
            assert (await client.get("/healthz")).status_code == 200
            r = await client.get("/readyz")
            assert r.status_code == 503 and r.json()["error"] == "not_ready"
            source.synced.set()
            r = await client.get("/readyz")
            assert r.status_code == 200
            r = await client.get("/nope")
            assert r.status_code == 404 and r.json()["error"] == "not_found"


async def test_metrics_exports_the_lease_metrics() -> None:
    with trio.fail_after(10):
        async with discovery(MemorySource([make_proxy("a", max_leases=1)])) as api:
            lease_id = (await api.post("/v1/leases", json={})).json()["leaseId"]
            assert (await api.post("/v1/leases", json={})).status_code == 409
            await api.post(f"/v1/leases/{lease_id}/report", json={"result": "banned"})
            async with running(create_ops_app(MemorySource())) as ops:
                r = await ops.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == CONTENT_TYPE_LATEST
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    # Every metric of SPEC §8 that exists is exported (the families are process-global).
    for name in ("egressd_leases_active", "egressd_leases_granted", "egressd_leases_refused",
                 "egressd_reports", "egressd_cooldowns_active", "egressd_probes",
                 "egressd_reconciles", "egressd_leader"):
        assert name in families, name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("egressd_leases_granted_total", ())] >= 1
    assert samples[("egressd_leases_refused_total", (("reason", "at_capacity"),))] >= 1
    assert samples[("egressd_reports_total", (("result", "banned"),))] >= 1
    assert samples[("egressd_cooldowns_active", ())] >= 1
