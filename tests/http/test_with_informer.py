"""The discovery API over the real pieces: fake API server, Proxy informer, persisted store."""

from __future__ import annotations

from typing import Any

import trio

from egressd.http.discovery import create_discovery_app
from egressd.http.ops import create_ops_app
from egressd.http.source import InformerProxySource
from egressd.kube.client import KubeClient
from egressd.kube.informer import Informer
from egressd.kube.resources import PROXIES
from egressd.leases.persist import CooldownWriter
from egressd.sandbox.apiserver import FakeApiServer
from tests.http.support import make_store, running, trio_wall


def proxy(name: str, region: str) -> dict[str, Any]:
    return {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"mode": "External", "endpoint": {"host": f"10.9.0.{len(name)}"},
                     "attributes": {"region": region}}}


HEALTHY = {"status": {"phase": "Ready", "latencyMs": 40, "conditions": [
    {"type": "Healthy", "status": "True", "reason": "ProbeSucceeded",
     "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


async def test_list_lease_report_over_the_informer(
    kube_client: KubeClient, apiserver: FakeApiServer,
) -> None:
    apiserver.create(proxy("eu-a", "eu"))
    apiserver.create(proxy("us-b", "us"))
    await kube_client.patch_status(PROXIES, "eu-a", HEALTHY, namespace="default")
    informer = Informer(PROXIES, relist_backoff=(0.05, 0.2))
    source = InformerProxySource(informer)
    writer = CooldownWriter(client=kube_client, lookup=informer.get, clock=trio_wall)
    store = make_store(on_cooldown=writer.cooldown_started)
    app = create_discovery_app(source, store=store, default_ttl=300, max_ttl=3600, token=None)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            async with running(create_ops_app(source)) as ops:
                assert (await ops.get("/readyz")).status_code == 503
                await nursery.start(informer.run, kube_client)
                writer.attach(informer, store)
                await nursery.start(writer.run)
                assert (await ops.get("/readyz")).status_code == 200
                # One more proxy through the watch, after the (sorted) initial list.
                added = trio.Event()
                informer.add_handler(
                    on_add=lambda obj: obj["metadata"]["name"] == "ap-c" and added.set())
                apiserver.create(proxy("ap-c", "ap"))
                await added.wait()
            async with running(app) as client:
                # By key, whatever order the informer delivered them in.
                items = (await client.get("/v1/proxies")).json()["items"]
                assert [p["name"] for p in items] == ["ap-c", "eu-a", "us-b"]
                items = (await client.get("/v1/proxies?healthy=true")).json()["items"]
                assert [(p["name"], p["latencyMs"], p["phase"]) for p in items] == [
                    ("eu-a", 40, "Ready")]
                r = await client.post("/v1/leases", json={"target": "shop.example"})
                assert r.status_code == 201 and r.json()["proxy"]["name"] == "eu-a"
                lease_id = r.json()["leaseId"]
                r = await client.post(f"/v1/leases/{lease_id}/report",
                                      json={"result": "banned"})
                assert r.status_code == 204
                r = await client.post("/v1/leases", json={"target": "shop.example"})
                assert r.status_code == 409
                assert (r.json()["considered"], r.json()["unhealthy"],
                        r.json()["inCooldown"]) == (3, 2, 1)
                # The ban reached the Proxy's status.
                changed = trio.Event()
                informer.add_handler(on_update=lambda _o, _n: changed.set())

                def persisted() -> dict[str, Any]:
                    obj = informer.get("default/eu-a") or {}
                    return dict(obj.get("status", {}).get("cooldowns", {}))

                while "shop.example" not in persisted():
                    await changed.wait()
                    changed = trio.Event()
            nursery.cancel_scope.cancel()
