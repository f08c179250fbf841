"""Informer against the fake API server: sync, events, resume without relist, 410 relist."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from egressd.backoff import Backoff, Retries
from egressd.kube.client import KubeClient, open_client
from egressd.kube.config import KubeConfig, load_config
from egressd.kube.informer import REPLACE_BATCH, Informer
from egressd.kube.resources import SECRETS
from egressd.metrics import REGISTRY
from egressd.sandbox.apiserver import FakeApiServer
from tests.fixtures.kube import FAST_RETRY, hooked_client

LABEL = "crawl.example.com/cloud-init"


def secret(name: str, *, namespace: str = "default", labelled: bool = True) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {LABEL: "true"} if labelled else {}},
            "stringData": {"user-data": "#cloud-config"}}


def restarts(reason: str) -> float:
    return REGISTRY.get_sample_value(
        "egressd_watch_restarts_total", {"resource": "secrets", "reason": reason}) or 0.0


class Seen:
    """Handler calls in order, with a way to wait for one."""

    def __init__(self, informer: Informer) -> None:
        self.calls: list[tuple[str, str]] = []
        self._changed = trio.Event()
        informer.add_handler(
            on_add=lambda o: self._note("add", o),
            on_update=lambda old, new: self._note("update", new),
            on_delete=lambda o: self._note("delete", o))

    def _note(self, kind: str, obj: dict[str, Any]) -> None:
        self.calls.append((kind, obj["metadata"]["name"]))
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, call: tuple[str, str]) -> None:
        while call not in self.calls:
            await self._changed.wait()


async def wait_until(predicate: Callable[[], bool]) -> None:
    # Only for state with no event to wait on (a metric, a bookmarked version);
    # every caller runs under trio.fail_after.
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(0.01)


def fast_informer(**kwargs: Any) -> Informer:
    return Informer(SECRETS, relist_backoff=(0.05, 0.2), **kwargs)


class Sent:
    """The list and watch requests a client really sent, with their query parameters."""

    def __init__(self) -> None:
        self.lists: list[dict[str, str]] = []
        self.watches: list[dict[str, str]] = []

    async def __call__(self, request: httpx.Request) -> None:
        if request.method == "GET" and request.url.path.endswith("/secrets"):
            params = dict(request.url.params)
            (self.watches if params.get("watch") == "true" else self.lists).append(params)


@asynccontextmanager
async def recording_client(config: KubeConfig) -> AsyncIterator[tuple[KubeClient, Sent]]:
    sent = Sent()
    async with hooked_client(config, on_request=[sent]) as client:
        yield client, sent


async def test_sync_then_events(kube_client: KubeClient, apiserver: FakeApiServer,
                                nursery: trio.Nursery) -> None:
    apiserver.create(secret("a"))
    apiserver.create(secret("plain", labelled=False))
    informer = fast_informer(label_selector=f"{LABEL}=true")
    with trio.fail_after(10):
        await nursery.start(informer.run, kube_client)
        assert informer.synced.is_set()
        assert informer.keys() == ["default/a"]
        seen = Seen(informer)
        assert seen.calls == [("add", "a")]  # the cache is replayed to a new handler

        await kube_client.create(SECRETS, secret("b"), namespace="default")
        await kube_client.create(SECRETS, secret("c", labelled=False), namespace="default")
        await kube_client.merge_patch(SECRETS, "b", {"metadata": {"annotations": {"x": "1"}}},
                                      namespace="default")
        await kube_client.delete(SECRETS, "b", namespace="default")
        await seen.wait_for(("delete", "b"))
        assert seen.calls == [("add", "a"), ("add", "b"), ("update", "b"), ("delete", "b")]
        assert informer.get("default/b") is None
        assert informer.get("default/a") is not None
        assert informer.lists == 1


async def test_resume_after_a_cut_without_relist(kube_client: KubeClient,
                                                 apiserver: FakeApiServer,
                                                 nursery: trio.Nursery) -> None:
    informer = fast_informer()
    with trio.fail_after(10):
        await nursery.start(informer.run, kube_client)
        seen = Seen(informer)
        await apiserver.wait_for_watchers("secrets")
        cut, closed = restarts("cut"), restarts("closed")

        apiserver.faults.cut_watches("secrets", abrupt=True)
        # Written while no watch is open (no checkpoint since the cut): only
        # a resume from the last version can deliver it.
        apiserver.create(secret("during-cut"))
        await seen.wait_for(("add", "during-cut"))
        assert restarts("cut") == cut + 1

        await apiserver.wait_for_watchers("secrets")
        apiserver.faults.cut_watches("secrets")  # a clean end, like timeoutSeconds
        apiserver.create(secret("after-close"))
        await seen.wait_for(("add", "after-close"))
        assert restarts("closed") == closed + 1
        assert informer.lists == 1


async def test_410_relists_and_reports_vanished_objects(
    kube_client: KubeClient, apiserver: FakeApiServer, nursery: trio.Nursery
) -> None:
    apiserver.create(secret("doomed"))
    apiserver.create(secret("kept"))
    informer = fast_informer()
    with trio.fail_after(10):
        await nursery.start(informer.run, kube_client)
        seen = Seen(informer)
        await apiserver.wait_for_watchers("secrets")
        gone = restarts("gone")
        apiserver.faults.fail_next(1, code=410, watch=True, resource="secrets")
        apiserver.faults.cut_watches("secrets")
        apiserver.delete("v1", "Secret", "doomed", namespace="default")
        await seen.wait_for(("delete", "doomed"))
        assert informer.lists == 2
        assert restarts("gone") == gone + 1
        assert informer.keys() == ["default/kept"]


async def test_relist_410_falls_back_to_a_quorum_list(
    kube_config: KubeConfig, apiserver: FakeApiServer
) -> None:
    informer = fast_informer()
    with trio.fail_after(10):
        async with recording_client(kube_config) as (client, sent), \
                trio.open_nursery() as nursery:
            await nursery.start(informer.run, client)
            seen = Seen(informer)
            await apiserver.wait_for_watchers("secrets")
            apiserver.create(secret("before"))
            await seen.wait_for(("add", "before"))
            last_seen = informer.resource_version
            # The in-stream form of 410 (an ERROR event), then a relist that is 410 too.
            apiserver.faults.fail_next(1, code=410, watch=True, resource="secrets",
                                       as_watch_event=True)
            relist = apiserver.faults.fail_next(1, code=410, watch=False, method="GET",
                                                resource="secrets")
            apiserver.faults.cut_watches("secrets")
            apiserver.create(secret("fresh"))
            await seen.wait_for(("add", "fresh"))
            nursery.cancel_scope.cancel()
    assert relist.hits == 1
    assert informer.lists == 3  # first list, the relist (410), the quorum list
    # The first list is a quorum read; the relist asks for "not older than"
    # the last version seen; only its 410 falls back to a quorum list.
    versions = [params.get("resourceVersion", "") for params in sent.lists]
    assert versions == ["", last_seen, ""]


async def test_bookmarks_keep_the_version_fresh(tmp_path: Path, nursery: trio.Nursery) -> None:
    server = FakeApiServer(bookmark_interval=0.1)
    await nursery.start(server.serve)
    server.write_kubeconfig(tmp_path / "config")
    cfg = await load_config(kubeconfig=str(tmp_path / "config"), context=None)
    async with open_client(cfg, retry=FAST_RETRY) as client:
        informer = fast_informer(namespace="default")
        with trio.fail_after(10):
            await nursery.start(informer.run, client)
            # Changes elsewhere move the global version; only bookmarks tell
            # this informer about it.
            server.create(secret("other", namespace="kube-system"))
            target = str(server.resource_version)
            await wait_until(lambda: informer.resource_version == target)
            # With the bookmarked version, a compacted history does not force a relist.
            server.compact()
            server.faults.cut_watches("secrets")
            server.create(secret("mine"))
            await wait_until(lambda: informer.get("default/mine") is not None)
            assert informer.lists == 1
            nursery.cancel_scope.cancel()


async def test_inactivity_timeout_reopens_the_watch(kube_client: KubeClient,
                                                    apiserver: FakeApiServer,
                                                    nursery: trio.Nursery) -> None:
    informer = fast_informer(inactivity_timeout=0.2)
    inactive = restarts("inactive")
    with trio.fail_after(10):
        await nursery.start(informer.run, kube_client)
        await wait_until(lambda: restarts("inactive") >= inactive + 2)
        apiserver.create(secret("still-works"))
        await wait_until(lambda: informer.get("default/still-works") is not None)
        assert informer.lists == 1


async def test_watch_open_failures_back_off_then_resume(kube_client: KubeClient,
                                                        apiserver: FakeApiServer,
                                                        nursery: trio.Nursery) -> None:
    informer = fast_informer()
    with trio.fail_after(10):
        await nursery.start(informer.run, kube_client)
        seen = Seen(informer)
        await apiserver.wait_for_watchers("secrets")
        rule = apiserver.faults.fail_next(3, code=503, watch=True, resource="secrets")
        apiserver.faults.cut_watches("secrets")
        apiserver.create(secret("later"))
        await seen.wait_for(("add", "later"))
        assert rule.hits == 3
        assert informer.lists == 1


async def test_watch_parameters_and_resume_version(kube_config: KubeConfig,
                                                   apiserver: FakeApiServer) -> None:
    informer = Informer(SECRETS, label_selector=f"{LABEL}=true", relist_backoff=(0.05, 0.2))
    with trio.fail_after(10):
        async with recording_client(kube_config) as (client, sent), \
                trio.open_nursery() as nursery:
            await nursery.start(informer.run, client)
            listed = informer.resource_version
            seen = Seen(informer)
            await apiserver.wait_for_watchers("secrets")
            apiserver.create(secret("a"))
            await seen.wait_for(("add", "a"))
            after_a = informer.resource_version
            apiserver.faults.cut_watches("secrets", abrupt=True)
            await apiserver.wait_for_watchers("secrets")
            nursery.cancel_scope.cancel()
    assert len(sent.lists) == 1
    assert sent.lists[0].get("labelSelector") == f"{LABEL}=true"
    first, resumed = sent.watches[:2]
    for params in (first, resumed):
        assert params["allowWatchBookmarks"] == "true"
        assert params["labelSelector"] == f"{LABEL}=true"
        # client-go's spread: 5 to 10 minutes, so replicas do not reconnect together.
        assert 300 <= int(params["timeoutSeconds"]) <= 600
    assert first["resourceVersion"] == listed  # watch from the list's version
    assert resumed["resourceVersion"] == after_a  # resume from the last event seen
    assert int(after_a) > int(listed)


def test_relist_backoff_doubles_to_the_cap_with_jitter() -> None:
    backoff = Retries(Backoff(0.8, 30.0, jitter=(1.0, 1.5)))
    delays = [backoff.next() for _ in range(9)]
    bases = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0]
    for delay, base in zip(delays, bases, strict=True):
        assert base <= delay <= base * 1.5
    assert len(set(delays[-3:])) == 3  # jittered, not a fixed 30 s
    backoff.reset()
    assert 0.8 <= backoff.next() <= 1.2
    assert 1.6 <= backoff.next() <= 2.4


async def test_a_watch_that_never_answers_is_reopened(kube_config: KubeConfig,
                                                      apiserver: FakeApiServer) -> None:
    stuck = 2  # the first two watch requests get no answer, like a wedged server

    async def hold_watches(request: httpx.Request) -> None:
        nonlocal stuck
        if request.url.params.get("watch") == "true" and stuck:
            stuck -= 1
            await trio.sleep_forever()

    informer = fast_informer(inactivity_timeout=0.2)
    inactive = restarts("inactive")
    with trio.fail_after(10):
        async with hooked_client(kube_config, on_request=[hold_watches]) as client, \
                trio.open_nursery() as nursery:
            await nursery.start(informer.run, client)
            seen = Seen(informer)
            apiserver.create(secret("after-the-stall"))
            await seen.wait_for(("add", "after-the-stall"))
            nursery.cancel_scope.cancel()
    assert stuck == 0
    assert restarts("inactive") >= inactive + 2
    assert informer.lists == 1


async def test_a_large_list_lets_other_tasks_run_between_handler_batches(
        kube_client: KubeClient, apiserver: FakeApiServer, nursery: trio.Nursery) -> None:
    # Handlers of a list run in batches with a checkpoint between (a relist of a
    # large fleet must not stall the loop for its whole handler work).
    total = 2 * REPLACE_BATCH + 50
    for i in range(total):
        apiserver.create(secret(f"s{i:04d}"))
    informer = fast_informer(label_selector=f"{LABEL}=true")
    added: list[str] = []
    first = trio.Event()

    def on_add(obj: dict[str, Any]) -> None:
        added.append(obj["metadata"]["name"])
        first.set()

    informer.add_handler(on_add=on_add)
    seen_by_other_task: list[int] = []

    async def other_task() -> None:
        await first.wait()
        seen_by_other_task.append(len(added))

    nursery.start_soon(other_task)
    with trio.fail_after(30):
        await nursery.start(informer.run, kube_client)
    assert len(added) == total
    # It ran at a checkpoint between two batches, not after the whole list.
    assert seen_by_other_task and seen_by_other_task[0] in (REPLACE_BATCH, 2 * REPLACE_BATCH)
