"""Client libraries nobody here wrote, against the fake API server: lightkube and kr8s.

Both are driven through their synchronous APIs in a worker thread (they bring
their own httpx or asyncio loop) while the server serves in the test's trio
nursery. Each does what an operator does: create, list, patch, delete, and
watch across the end of a stream (the server cuts it) without losing or
repeating an event.
"""

from __future__ import annotations

import functools
import queue
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kr8s
import lightkube
import pytest
import trio
from kr8s.objects import new_class
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from egressd.sandbox.apiserver import FakeApiServer
from tests.sandbox.apiserver.support import proxy

T = TypeVar("T")
GROUP, VERSION = "crawl.example.com", "v1alpha1"
LkProxy = create_namespaced_resource(GROUP, VERSION, "Proxy", "proxies")
KrProxy = new_class("Proxy", f"{GROUP}/{VERSION}", asyncio=False, namespaced=True,
                    plural="proxies")


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    # abandon_on_cancel: a client stuck in a blocking read fails the test at fail_after
    # instead of hanging it.
    return await trio.to_thread.run_sync(functools.partial(fn, *args), abandon_on_cancel=True)


@pytest.fixture
async def server(nursery: trio.Nursery, tmp_path: Path) -> FakeApiServer:
    api = FakeApiServer()
    await nursery.start(api.serve)
    api.write_kubeconfig(tmp_path / "kubeconfig")
    return api


async def _cut_and_wait_for_rewatch(server: FakeApiServer) -> None:
    """End the open watch cleanly, then wait until the client watches again."""
    assert server.faults.cut_watches("proxies") == 1
    while server.watch_count("proxies"):
        await server.store.wait_changed()
    await server.wait_for_watchers("proxies")


# ----- lightkube


@pytest.fixture
def lk(server: FakeApiServer, tmp_path: Path) -> Iterator[Any]:
    """A lightkube Client for `server` (closed after the test: it pools connections)."""
    config = lightkube.KubeConfig.from_file(str(tmp_path / "kubeconfig"))
    with lightkube.Client(config=config, namespace="default") as client:
        yield client


async def test_lightkube_creates_lists_patches_and_deletes(server: FakeApiServer,
                                                           lk: Any) -> None:
    client = lk

    def crud() -> tuple[list[str], int, list[str]]:
        client.create(LkProxy.from_dict(proxy("a")))
        client.create(LkProxy.from_dict(proxy("b")))
        names = sorted(p.metadata.name for p in client.list(LkProxy))
        patched = client.patch(LkProxy, "a", {"spec": {"endpoint": {"port": 8080}}},
                               patch_type=PatchType.MERGE)
        client.delete(LkProxy, "b")
        left = [p.metadata.name for p in client.list(LkProxy)]
        return names, patched["spec"]["endpoint"]["port"], left

    with trio.fail_after(30):
        names, port, left = await in_thread(crud)
    assert names == ["a", "b"]
    assert port == 8080
    assert left == ["a"]
    stored = server.get(f"{GROUP}/{VERSION}", "Proxy", "a", namespace="default")
    assert stored is not None and stored["spec"]["endpoint"]["port"] == 8080


async def test_lightkube_watch_rewatches_after_the_stream_ends(server: FakeApiServer,
                                                               lk: Any) -> None:
    client = lk
    server.create(proxy("before"))
    events: queue.Queue[tuple[str, str]] = queue.Queue()

    def watch() -> None:
        rv = client.get(LkProxy, "before").metadata.resourceVersion
        for kind, obj in client.watch(LkProxy, namespace="default", resource_version=rv):
            events.put((kind, obj.metadata.name))
            if obj.metadata.name == "last":
                return

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(in_thread, watch)
            await server.wait_for_watchers("proxies")
            server.create(proxy("a"))
            for _ in range(3):  # lightkube failed every re-watch here before
                await _cut_and_wait_for_rewatch(server)
            server.create(proxy("last"))
    got = [events.get_nowait() for _ in range(events.qsize())]
    assert got == [("ADDED", "a"), ("ADDED", "last")]


async def test_lightkube_replace_needs_the_resource_version(server: FakeApiServer,
                                                             lk: Any) -> None:
    def replace_without_then_with() -> tuple[int, int]:
        client = lk
        client.create(LkProxy.from_dict(proxy("a")))
        body = proxy("a")
        body["spec"]["endpoint"]["port"] = 8080
        try:
            client.replace(LkProxy.from_dict(body))
        except lightkube.ApiError as exc:
            refused = exc.status.code
        else:
            refused = 0
        body["metadata"]["resourceVersion"] = client.get(LkProxy, "a").metadata.resourceVersion
        return refused, client.replace(LkProxy.from_dict(body))["spec"]["endpoint"]["port"]

    with trio.fail_after(30):
        refused, port = await in_thread(replace_without_then_with)
    assert refused == 422
    assert port == 8080


# ----- kr8s


def _close_kr8s(api: Any) -> None:
    """Close the httpx session kr8s keeps open in its runner loop (it has no close())."""
    from kr8s._async_utils import Portal

    if api._session is not None:
        Portal().call(api._session.aclose)


async def test_kr8s_creates_lists_patches_and_deletes(server: FakeApiServer,
                                                      tmp_path: Path) -> None:
    def crud() -> tuple[list[str], int, list[str]]:
        api = kr8s.api(kubeconfig=str(tmp_path / "kubeconfig"))
        for name in ("a", "b"):
            KrProxy(proxy(name), api=api).create()
        names = sorted(p.name for p in api.get("proxies", namespace="default"))
        a = KrProxy.get("a", namespace="default", api=api)
        a.patch({"spec": {"endpoint": {"port": 8080}}})
        KrProxy.get("b", namespace="default", api=api).delete()
        left = [p.name for p in api.get("proxies", namespace="default")]
        _close_kr8s(api)
        return names, a.raw["spec"]["endpoint"]["port"], left

    with trio.fail_after(30):
        names, port, left = await in_thread(crud)
    assert names == ["a", "b"]
    assert port == 8080
    assert left == ["a"]


async def test_kr8s_watch_resumes_from_the_last_version_after_the_stream_ends(
        server: FakeApiServer, tmp_path: Path) -> None:
    server.create(proxy("before"))
    send, receive = trio.open_memory_channel[tuple[str, str]](16)

    def watch_twice() -> None:
        # Every kr8s call blocks (its own asyncio loop in a thread): none on trio's thread.
        api = kr8s.api(kubeconfig=str(tmp_path / "kubeconfig"))
        # kr8s ends its generator with the stream; a re-watch starts from the last
        # resourceVersion it saw, as an informer does.
        since = KrProxy.get("before", namespace="default", api=api).metadata.resourceVersion
        for _ in range(2):
            for kind, obj in api.watch("proxies", namespace="default", since=since):
                trio.from_thread.run_sync(send.send_nowait, (kind, obj.name))
                since = obj.metadata.resourceVersion
        _close_kr8s(api)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(in_thread, watch_twice)
            await server.wait_for_watchers("proxies")
            server.create(proxy("a"))
            assert await receive.receive() == ("ADDED", "a")
            await _cut_and_wait_for_rewatch(server)
            server.create(proxy("b"))
            server.delete(f"{GROUP}/{VERSION}", "Proxy", "a", namespace="default")
            got = [await receive.receive(), await receive.receive()]
            assert server.faults.cut_watches("proxies") == 1
    assert got == [("ADDED", "b"), ("DELETED", "a")]
    assert receive.statistics().current_buffer_used == 0  # nothing repeated
