"""The trio-native Kubernetes API client: one `httpx.AsyncClient` per process.

Everything egressd says to the API goes through `KubeClient` (docs/architecture.md): it adds
the refreshing bearer token, maps answers to typed errors once (errors.py),
retries what can be retried (429, 5xx, connection failures) with exponential
backoff where a longer Retry-After wins, and re-reads credentials once on a
401 before replaying the request.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from egressd.backoff import Backoff
from egressd.kube.config import KubeConfig
from egressd.kube.errors import (
    ApiUnavailable,
    bad_json,
    error_from_response,
    parse_retry_after,
)
from egressd.kube.resources import Resource
from egressd.kube.resources import resource_version as version_of
from egressd.kube.watch import WatchStream

log = logging.getLogger(__name__)

FIELD_MANAGER = "egressd"
JsonPatch = list[dict[str, Any]]
"""RFC 6902 operations."""
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# Errors raised before the request left this process: replaying is safe for any verb.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class _Body(httpx.AsyncByteStream):
    """A request body sent as one chunk, iterated without an async generator.

    httpx wraps `content=bytes` in an async generator; a request cancelled
    mid-send (a stop, a lost leadership) leaves that generator suspended, and
    its finalizer can run after the trio run that made it has ended, which
    Python reports as an unraisable exception. A plain iterator has nothing
    to finalize.
    """

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._sent = False

    def __aiter__(self) -> _Body:
        self._sent = False
        return self

    async def __anext__(self) -> bytes:
        if self._sent:
            raise StopAsyncIteration
        self._sent = True
        return self._data


@attrs.frozen
class RetryPolicy:
    """How the client retries 429 / 5xx / connection failures."""

    attempts: int = 5
    """Tries in all, the first included."""
    base_delay: float = 0.2
    """Delay before the second try; doubles each time."""
    max_delay: float = 10.0
    """Longest backoff between two tries."""
    max_retry_after: float = 60.0
    """A server's Retry-After is honoured up to this many seconds."""

    @property
    def backoff(self) -> Backoff:
        """The backoff between tries, ±20 % jitter so clients that failed together spread."""
        return Backoff(self.base_delay, self.max_delay, jitter=(0.8, 1.2))

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed try number `attempt` (1-based)."""
        backoff = self.backoff.delay(attempt)
        if retry_after is not None:
            return max(backoff, min(retry_after, self.max_retry_after))
        return backoff


@attrs.frozen
class ObjectList:
    """A list answer: the items (with kind and apiVersion filled in) and the list's version."""

    items: list[dict[str, Any]]
    resource_version: str


def ssl_context(config: KubeConfig) -> ssl.SSLContext:
    """The TLS context for the API server: its CA, and the client certificate if any."""
    ctx = ssl.create_default_context(cadata=config.ca_data) if config.ca_data else (
        ssl.create_default_context())
    if not config.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if config.client_cert_file:
        ctx.load_cert_chain(config.client_cert_file, config.client_key_file)
    return ctx


class KubeClient:
    """Typed verbs on API resources; errors are egressd.kube.errors classes."""

    def __init__(
        self, http: httpx.AsyncClient, config: KubeConfig, *, retry: RetryPolicy
    ) -> None:
        self._http = http
        self._config = config
        self._retry = retry
        self._extensions: dict[str, Any] = (
            {"sni_hostname": config.tls_server_name} if config.tls_server_name else {})

    @property
    def config(self) -> KubeConfig:
        return self._config

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        stream: bool = False,
        http_timeout: httpx.Timeout | None = None,
        retry: bool = True,
    ) -> httpx.Response:
        """Send one request with auth, retries and the 401 replay; return a 2xx/3xx response."""
        credentials = self._config.credentials
        content = None if body is None else json.dumps(body).encode()
        attempt = 0
        replayed_401 = False
        while True:
            attempt += 1
            headers = {"Accept": "application/json"}
            auth = await credentials.header()
            # Read after header(): no checkpoint in between, so a 401 to this
            # request can tell whether a reload happened since its token.
            generation = credentials.generation
            if auth:
                headers["Authorization"] = auth
            if content is not None:
                headers["Content-Type"] = content_type
            request = self._http.build_request(
                method, path, params=params, headers=headers,
                timeout=http_timeout if http_timeout is not None else httpx.USE_CLIENT_DEFAULT,
                extensions=self._extensions)
            if content is not None:
                request.headers["Content-Length"] = str(len(content))
                request.stream = _Body(content)
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                # After the request was sent only a read may be replayed: a
                # write may have happened on the server.
                replayable = isinstance(exc, _NOT_SENT) or method == "GET"
                if retry and replayable and attempt < self._retry.attempts:
                    delay = self._retry.delay(attempt)
                    log.info("API unreachable, retrying",
                             extra={"method": method, "path": path, "error": describe(exc),
                                    "delay": round(delay, 3)})
                    await trio.sleep(delay)
                    continue
                raise ApiUnavailable(f"{method} {path}: {describe(exc)}") from exc
            if response.status_code < 400:
                return response
            data = await response.aread()
            await response.aclose()
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            error = error_from_response(response.status_code, data, retry_after=retry_after)
            status = response.status_code
            if status == 401 and not replayed_401:
                replayed_401 = True
                attempt -= 1
                log.info("API answered 401, re-reading credentials",
                         extra={"method": method, "path": path})
                await credentials.reload(seen_generation=generation)
                continue
            if retry and (status == 429 or status >= 500) and attempt < self._retry.attempts:
                delay = self._retry.delay(attempt, retry_after)
                log.info("API answered %s, retrying", status,
                         extra={"method": method, "path": path, "delay": round(delay, 3)})
                await trio.sleep(delay)
                continue
            raise error

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self._send(method, path, **kwargs)
        return _decode(response)

    async def get(self, res: Resource, name: str, *, namespace: str | None = None,
                  subresource: str | None = None) -> dict[str, Any]:
        """GET one object; raises NotFound when it does not exist."""
        obj = await self._json(
            "GET", res.path(namespace=namespace, name=name, subresource=subresource))
        return _typed(obj, res)

    async def list(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
    ) -> ObjectList:
        """LIST a collection (all namespaces when `namespace` is None).

        `resource_version` None or "" is a quorum read; "0" may be served from
        the server's cache; any other value means "not older than".
        """
        params = _selectors(label_selector, field_selector)
        if resource_version:
            params["resourceVersion"] = resource_version
        body = await self._json("GET", res.path(namespace=namespace), params=params)
        items = body.get("items")
        if not isinstance(items, list) or not all(
                isinstance(item, dict) and isinstance(item.get("metadata"), dict)
                and item["metadata"].get("name") for item in items):
            # The preview leaves the items out: they may be Secrets.
            shape = {k: v for k, v in body.items() if k != "items"}
            raise bad_json(200, json.dumps(shape).encode())
        return ObjectList(
            items=[_typed(item, res) for item in items],
            resource_version=version_of(body),
        )

    @asynccontextmanager
    async def watch(
        self,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str,
        timeout_seconds: int | None,
        allow_bookmarks: bool = True,
    ) -> AsyncIterator[WatchStream]:
        """Open a watch from `resource_version`; yields the stream of WatchEvents.

        Not retried here (the informer decides between resuming and relisting);
        a 410 at open raises Gone, an in-stream ERROR raises its typed error and
        a broken connection raises WatchCut.
        """
        params = _selectors(label_selector, field_selector)
        params["watch"] = "true"
        if resource_version:
            params["resourceVersion"] = resource_version
        if timeout_seconds is not None:
            params["timeoutSeconds"] = str(timeout_seconds)
        if allow_bookmarks:
            params["allowWatchBookmarks"] = "true"
        # The server ends the stream after timeoutSeconds; a read timeout would
        # only cut quiet-but-healthy watches (the informer has its own
        # inactivity timeout).
        response = await self._send(
            "GET", res.path(namespace=namespace), params=params, stream=True, retry=False,
            http_timeout=httpx.Timeout(30.0, read=None))
        stream = WatchStream(response)
        try:
            yield stream
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def create(
        self, res: Resource, obj: dict[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        """POST a new object; raises AlreadyExists when the name is taken."""
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        created = await self._json("POST", res.path(namespace=namespace), body=body,
                                   params={"fieldManager": FIELD_MANAGER})
        return _typed(created, res)

    async def replace(
        self, res: Resource, name: str, obj: dict[str, Any], *,
        namespace: str | None = None, subresource: str | None = None,
    ) -> dict[str, Any]:
        """PUT a whole object; its metadata.resourceVersion makes a stale write a Conflict."""
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        replaced = await self._json(
            "PUT", res.path(namespace=namespace, name=name, subresource=subresource),
            body=body, params={"fieldManager": FIELD_MANAGER})
        return _typed(replaced, res)

    async def merge_patch(
        self, res: Resource, name: str, patch: dict[str, Any], *,
        namespace: str | None = None, subresource: str | None = None,
    ) -> dict[str, Any]:
        """PATCH with an RFC 7386 merge patch (`subresource="status"` for a status patch)."""
        patched = await self._json(
            "PATCH", res.path(namespace=namespace, name=name, subresource=subresource),
            body=patch, content_type=MERGE_PATCH, params={"fieldManager": FIELD_MANAGER})
        return _typed(patched, res)

    async def json_patch(
        self, res: Resource, name: str, ops: JsonPatch, *,
        namespace: str | None = None, subresource: str | None = None,
    ) -> dict[str, Any]:
        """PATCH with RFC 6902 operations; a failed `test` op raises Invalid."""
        patched = await self._json(
            "PATCH", res.path(namespace=namespace, name=name, subresource=subresource),
            body=ops, content_type=JSON_PATCH, params={"fieldManager": FIELD_MANAGER})
        return _typed(patched, res)

    async def patch_status(
        self, res: Resource, name: str, patch: dict[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch the status subresource."""
        return await self.merge_patch(res, name, patch, namespace=namespace,
                                      subresource="status")

    async def delete(
        self, res: Resource, name: str, *, namespace: str | None = None,
        propagation_policy: str | None = None,
    ) -> dict[str, Any] | None:
        """DELETE an object; returns it while it terminates (finalizers), None once gone.

        Raises NotFound when it did not exist.
        """
        body = None
        if propagation_policy:
            body = {"apiVersion": "v1", "kind": "DeleteOptions",
                    "propagationPolicy": propagation_policy}
        answer = await self._json("DELETE", res.path(namespace=namespace, name=name), body=body)
        # The server answers a Status or the last state of the object; only an
        # object marked for deletion (finalizers, graceful Pod deletion) is
        # still there.
        if answer.get("kind") == "Status" or not (
                answer.get("metadata") or {}).get("deletionTimestamp"):
            return None
        return _typed(answer, res)


def describe(exc: BaseException) -> str:
    """An httpx error with its causes: httpx often wraps a TLS or socket error in an empty one."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 4:
        text = str(seen)
        parts.append(f"{type(seen).__name__}: {text}" if text else type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(parts)


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    params: dict[str, str] = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


def _decode(response: httpx.Response) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except ValueError:
        raise bad_json(response.status_code, response.content) from None
    if not isinstance(body, dict):
        raise bad_json(response.status_code, response.content)
    return body


def _typed(obj: dict[str, Any], res: Resource) -> dict[str, Any]:
    """List items come without kind/apiVersion; fill them so every cached object is whole."""
    if "kind" not in obj or "apiVersion" not in obj:
        obj = {"apiVersion": res.api_version, "kind": res.kind, **obj}
    return obj


@asynccontextmanager
async def open_client(
    config: KubeConfig, *, retry: RetryPolicy | None = None,
    request_timeout: float = 30.0,
) -> AsyncIterator[KubeClient]:
    """A KubeClient owning one connection pool for the life of the block."""
    try:
        # Reads the CA bundle and client key files: blocking, so in a thread.
        ctx = await trio.to_thread.run_sync(ssl_context, config)
    except (OSError, ssl.SSLError) as exc:
        from egressd.errors import ConfigError

        raise ConfigError(f"{config.source}: bad TLS material: {exc}") from None
    async with httpx.AsyncClient(
        base_url=config.server,
        verify=ctx,
        proxy=config.proxy_url,
        timeout=httpx.Timeout(request_timeout),
        # The environment's HTTP(S)_PROXY is for crawling traffic, not the API;
        # kubeconfig's proxy-url is the way to proxy API calls.
        trust_env=False,
    ) as http:
        yield KubeClient(http, config, retry=retry or RetryPolicy())
