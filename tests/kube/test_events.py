"""The Event recorder: one Event per distinct occurrence, repeats counted."""

from __future__ import annotations

import functools
from typing import Any

import trio

from egressd.kube.client import KubeClient
from egressd.kube.events import WARNING, EventRecorder
from egressd.kube.resources import EVENTS, PROXIES
from egressd.sandbox.apiserver import FakeApiServer


async def proxy(client: KubeClient) -> dict[str, Any]:
    return await client.create(
        PROXIES, {"metadata": {"name": "px"},
                  "spec": {"mode": "External", "endpoint": {"host": "10.0.0.9", "port": 3128}}},
        namespace="default")


async def test_repeats_are_aggregated(kube_client: KubeClient) -> None:
    recorder = EventRecorder(kube_client, component="egressd", host="replica-1")
    with trio.fail_after(10):
        obj = await proxy(kube_client)
        first = await recorder.record(obj, reason="InstanceCreated", message="created px-1")
        assert first is not None
        second = await recorder.record(obj, reason="InstanceCreated", message="created px-1")
        assert second is not None
        other = await recorder.record(obj, type=WARNING, reason="ProvisionFailed",
                                      message="quota")
        assert other is not None
        events = (await kube_client.list(EVENTS, namespace="default")).items
    assert len(events) == 2
    created = next(e for e in events if e["reason"] == "InstanceCreated")
    assert created["count"] == 2
    assert created["metadata"]["name"] == first["metadata"]["name"]
    assert created["lastTimestamp"] >= created["firstTimestamp"]
    assert created["involvedObject"] == {
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy", "name": "px",
        "namespace": "default", "uid": obj["metadata"]["uid"],
        "resourceVersion": obj["metadata"]["resourceVersion"]}
    assert created["source"] == {"component": "egressd", "host": "replica-1"}
    assert created["type"] == "Normal"
    warning = next(e for e in events if e["reason"] == "ProvisionFailed")
    assert (warning["type"], warning["count"]) == ("Warning", 1)


async def test_a_deleted_event_is_recreated(kube_client: KubeClient) -> None:
    recorder = EventRecorder(kube_client)
    with trio.fail_after(10):
        obj = await proxy(kube_client)
        first = await recorder.record(obj, reason="R", message="m")
        assert first is not None
        await kube_client.delete(EVENTS, first["metadata"]["name"], namespace="default")
        again = await recorder.record(obj, reason="R", message="m")
    assert again is not None
    assert again["count"] == 1
    assert again["metadata"]["name"] != first["metadata"]["name"]


async def test_failures_are_logged_not_raised(kube_client: KubeClient,
                                              apiserver: FakeApiServer) -> None:
    recorder = EventRecorder(kube_client)
    with trio.fail_after(10):
        obj = await proxy(kube_client)
        apiserver.faults.fail_next(1, code=403, resource="events")
        assert await recorder.record(obj, reason="R", message="m") is None
        assert await recorder.record(obj, reason="R", message="m") is not None


async def test_concurrent_repeats_are_all_counted(kube_client: KubeClient) -> None:
    recorder = EventRecorder(kube_client)

    async def burst(obj: dict[str, Any], reason: str, times: int) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(times):
                nursery.start_soon(functools.partial(
                    recorder.record, obj, reason=reason, message="m"))

    with trio.fail_after(10):
        obj = await proxy(kube_client)
        await burst(obj, "Fresh", 4)  # none recorded yet: one Event, not four
        await recorder.record(obj, reason="Seen", message="m")
        await burst(obj, "Seen", 5)  # repeats racing each other: none lost
        events = (await kube_client.list(EVENTS, namespace="default")).items
    counts = sorted((e["reason"], e["count"]) for e in events)
    assert counts == [("Fresh", 4), ("Seen", 6)]
    assert not recorder._locks  # per-event locks do not pile up
