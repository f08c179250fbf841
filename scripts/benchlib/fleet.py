"""The fleet: External Proxies in the fake API server (in this process), counted as they
become leasable, with the writes the daemon makes to them.

Every Proxy points at the one local Squid and probes the local TLS target, so
"healthy" is a real probe through a real proxy, not a status written by the
bench. The probe interval is the longest the CRD allows (3600 s): after a
proxy's first probe nothing is probed during a measurement unless a phase
asks for it (`faster_probes`).
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterable
from typing import Any

import trio

from egressd.kube.client import KubeClient
from egressd.kube.resources import PROXIES
from egressd.sandbox.apiserver import FakeApiServer

Obj = dict[str, Any]

PROXY_STORE = "crawl.example.com/proxies"
SLOW_INTERVAL = 3600
CREATE_CONCURRENCY = 16
"""Creates in flight: a controller applying a fleet, not one kubectl at a time."""


def proxy(name: str, namespace: str, *, proxy_host: str, proxy_port: int, probe_url: str,
          zone: int) -> Obj:
    return {
        "apiVersion": PROXIES.api_version, "kind": PROXIES.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"mode": "External", "endpoint": {"host": proxy_host, "port": proxy_port},
                 "attributes": {"bench": "true", "zone": f"z{zone}"},
                 "healthCheck": {"probeURL": probe_url, "intervalSeconds": SLOW_INTERVAL,
                                 "timeoutSeconds": 10}},
    }


def is_leasable(obj: Obj) -> bool:
    """What the discovery API leases (SPEC §7): Ready, healthy, with a host, not deleting."""
    status = obj.get("status") or {}
    if status.get("phase") != "Ready" or not status.get("host"):
        return False
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Healthy" and c.get("status") == "True"
               for c in status.get("conditions") or ())


def without_cel(node: Any) -> Any:
    """The CRD with its CEL rules removed (in place): the bench's API server skips them.

    cel-python evaluates the Proxy CRD's rules in ~8 ms per write on this
    machine, half of what the fake API server spends on a status write; a real
    kube-apiserver evaluates compiled CEL in microseconds. The objects the
    bench writes are valid either way: only the API server's cost changes.
    """
    if isinstance(node, dict):
        node.pop("x-kubernetes-validations", None)
        for value in node.values():
            without_cel(value)
    elif isinstance(node, list):
        for value in node:
            without_cel(value)
    return node


class Fleet:
    """Watches every Proxy write in the fake API server (an observer on its store)."""

    def __init__(self, server: FakeApiServer) -> None:
        self.server = server
        self.leasable: set[str] = set()
        self.status_writes = 0
        """PATCH/PUT requests on a Proxy's status subresource."""
        self.other_writes = 0
        """PATCH/PUT requests on a Proxy itself (metadata, spec)."""
        self._changed = trio.Event()
        store = server.store
        write = store.write

        def observed_write(store_key: str, obj: Obj, *, event_type: str,
                           old: Obj | None) -> Obj:
            result = write(store_key, obj, event_type=event_type, old=old)
            if store_key == PROXY_STORE:
                meta = obj["metadata"]
                key = f"{meta.get('namespace', '')}/{meta['name']}"
                if event_type != "DELETED" and is_leasable(obj):
                    self.leasable.add(key)
                else:
                    self.leasable.discard(key)
                self._changed.set()
                self._changed = trio.Event()
            return result

        store.write = observed_write  # type: ignore[method-assign]
        handle = server.app.handle

        async def counted(request: Any) -> Any:
            if request.method in ("PATCH", "PUT") and "/proxies/" in request.path:
                if request.path.rstrip("/").endswith("/status"):
                    self.status_writes += 1
                else:
                    self.other_writes += 1
            return await handle(request)

        server.app.handle = counted  # type: ignore[method-assign]

    async def create(self, client: KubeClient, objs: Iterable[Obj]) -> None:
        """Create through the API (HTTP), `CREATE_CONCURRENCY` at a time."""
        limiter = trio.CapacityLimiter(CREATE_CONCURRENCY)

        async def one(obj: Obj) -> None:
            async with limiter:
                await client.create(PROXIES, obj, namespace=obj["metadata"]["namespace"])

        async with trio.open_nursery() as nursery:
            for obj in objs:
                nursery.start_soon(one, obj)

    def delete_namespace(self, namespace: str) -> int:
        """Delete every Proxy of `namespace` (in process: cleanup, not a measurement)."""
        names = [o["metadata"]["name"] for o in self.server.store.items(PROXY_STORE, namespace)]
        for name in names:
            self.server.delete(PROXIES.api_version, PROXIES.kind, name, namespace=namespace)
        return len(names)

    def seed(self, namespace: str, size: int, template: Obj) -> None:
        """Write `size` copies of `template` (a Proxy the daemon made Ready) into the store.

        The documented shortcut for the largest fleet: each copy already has the
        status the daemon would write (same endpoint, generation, conditions),
        so the daemon seeds its health engine from it and writes nothing, and
        the API server's per-write cost does not make the run last an hour.
        """
        store = self.server.store
        for i in range(size):
            obj = copy.deepcopy(template)
            meta = obj["metadata"]
            meta.update(name=f"px-{i:05d}", namespace=namespace, uid=str(uuid.uuid4()))
            meta.pop("resourceVersion", None)
            store.write(PROXY_STORE, obj, event_type="ADDED", old=None)

    def count(self, namespace: str) -> int:
        return sum(1 for key in self.leasable if key.startswith(namespace + "/"))

    async def wait_leasable(self, namespace: str, count: int) -> float:
        """Wait until `count` Proxies of `namespace` are leasable; returns perf_counter then."""
        while self.count(namespace) < count:
            await self._changed.wait()
        return time.perf_counter()

    async def patch_interval(self, client: KubeClient, keys: list[str], seconds: int) -> None:
        limiter = trio.CapacityLimiter(CREATE_CONCURRENCY)

        async def one(key: str) -> None:
            namespace, _, name = key.partition("/")
            async with limiter:
                await client.merge_patch(PROXIES, name, {"spec": {"healthCheck": {
                    "intervalSeconds": seconds, "timeoutSeconds": min(10, seconds - 1)}}},
                    namespace=namespace)

        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(one, key)
