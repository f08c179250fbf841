"""Helpers for the fake API server tests: URLs, sample objects, a watch reader."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

PROXIES = "/apis/crawl.example.com/v1alpha1/namespaces/default/proxies"
ALL_PROXIES = "/apis/crawl.example.com/v1alpha1/proxies"
PODS = "/api/v1/namespaces/default/pods"
SECRETS = "/api/v1/namespaces/default/secrets"
EVENTS = "/api/v1/namespaces/default/events"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}

# A test that leaves an httpx stream early without `watch()` can silence trio's
# warning about httpx's nested, unfinished async generators with this filter.
HTTPX_ASYNCGEN_WARNING = "ignore:Async generator 'http:ResourceWarning"


def proxy(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"mode": "External", "endpoint": {"host": "192.0.2.1", "port": 3128}}
    body.update(spec)
    return {"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": name}, "spec": body}


def pod(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **meta},
            "spec": {"containers": [{"name": "squid", "image": "squid:6"}]}}


class Watch:
    """An open watch: `await w.next()` returns the next event dict."""

    def __init__(self, lines: AsyncIterator[str], response: httpx.Response) -> None:
        self._lines = lines
        self.response = response

    async def next(self) -> dict[str, Any]:
        while True:
            line = await self._lines.__anext__()
            if line.strip():
                event: dict[str, Any] = json.loads(line)
                return event

    async def rest(self) -> list[dict[str, Any]]:
        """Every remaining event until the server ends the stream."""
        events = []
        async for line in self._lines:
            if line.strip():
                events.append(json.loads(line))
        return events


@asynccontextmanager
async def watch(client: httpx.AsyncClient, path: str, *, headers: dict[str, str] | None = None,
                **params: Any) -> AsyncIterator[Watch]:
    query = {"watch": "true", **{k: str(v).lower() if isinstance(v, bool) else str(v)
                                 for k, v in params.items()}}
    lines: AsyncIterator[str] | None = None
    async with client.stream("GET", path, params=query, headers=headers) as response:
        assert response.status_code == 200, response.status_code
        lines = response.aiter_lines()
        yield Watch(lines, response)
    # httpx nests async generators under aiter_lines; leaving a watch early would leave
    # the inner ones unfinished (a ResourceWarning). One read after closing ends them all.
    with contextlib.suppress(httpx.StreamClosed, httpx.StreamError, StopAsyncIteration,
                             httpx.TransportError):
        await lines.__anext__()


async def created(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(path, json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def fail_after(seconds: float = 10) -> trio.CancelScope:
    return trio.fail_after(seconds)
