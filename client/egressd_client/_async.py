"""The async client for asyncio and trio (through httpx): `AsyncClient`, `AsyncLeaseHandle`.

The event loop is detected at each sleep, so one client class serves both.
On the way out of `async with client.lease(...)` under trio, the release runs
in a shielded scope with its own deadline: a cancelled task still gives its
lease back, in at most `CLEANUP_TIMEOUT` seconds.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx

from egressd_client import _wire
from egressd_client._classify import Verdict, classify, is_proxy_failure
from egressd_client._config import (
    CLEANUP_TIMEOUT,
    DEFAULT_TIMEOUT,
    ClientConfig,
    log,
    tls_verify,
)
from egressd_client._errors import EgressdError, EgressdUnavailable, NoProxyAvailable
from egressd_client._retry import RetryPolicy, retriable_error, retriable_status
from egressd_client._sync import NO_PROXY_DEFAULT_WAIT
from egressd_client._wire import Call, Lease, ProxyInfo, Result


def _in_asyncio() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def sleep(seconds: float) -> None:
    """Sleep on whichever loop runs us (asyncio or trio)."""
    if _in_asyncio():
        import asyncio

        await asyncio.sleep(seconds)
    else:
        import trio

        await trio.sleep(seconds)


async def _cleanup(step: Callable[[], Awaitable[None]]) -> None:
    if _in_asyncio():
        # A cancelled asyncio task may await again (cancellation is delivered once).
        await step()
        return
    import trio

    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + CLEANUP_TIMEOUT
        await step()


class AsyncClient:
    """The async twin of `Client`: same calls, awaited."""

    def __init__(self, url: str | None = None, *, token: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, retry: RetryPolicy | None = None,
                 verify: ssl.SSLContext | bool = True,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = ClientConfig.build(url, token=token, timeout=timeout, retry=retry)
        self._http = httpx.AsyncClient(
            base_url=self.config.url, headers=self.config.headers(),
            timeout=self.config.httpx_timeout(), transport=transport, verify=tls_verify(verify),
            trust_env=False)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call, *, request_timeout: float | None = None) -> httpx.Response:
        policy = self.config.retry
        for attempt in range(policy.attempts):
            last = attempt == policy.attempts - 1
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.json, params=call.params,
                    timeout=(request_timeout if request_timeout is not None
                             else httpx.USE_CLIENT_DEFAULT))
            except httpx.HTTPError as exc:
                if last or not retriable_error(exc, unsent_only=call.retry_unsent_only):
                    raise EgressdUnavailable(
                        f"egressd at {_wire.safe_url(self.config.url)} is unreachable: "
                        f"{type(exc).__name__}: {exc}") from exc
                await sleep(policy.delay(attempt))
                continue
            if last or not retriable_status(response.status_code):
                if response.status_code >= 500:
                    raise EgressdUnavailable(
                        f"egressd at {_wire.safe_url(self.config.url)} answered "
                        f"{response.status_code} ({attempt + 1} tries)")
                _wire.check(response, base_url=self.config.url)
                return response
            retry_after = _wire.parse_retry_after(response.headers.get("Retry-After"))
            await sleep(policy.delay(attempt, retry_after=retry_after))
        raise AssertionError("unreachable")  # pragma: no cover

    async def proxies(self, *, selector: Mapping[str, str] | None = None,
                      healthy: bool | None = None) -> list[ProxyInfo]:
        return _wire.parse_proxies(await self._send(_wire.proxies_call(selector, healthy)))

    async def acquire(self, *, selector: Mapping[str, str] | None = None,
                      target: str | None = None, ttl: float | None = None,
                      wait: float = 0.0) -> Lease:
        deadline = time.monotonic() + wait
        while True:
            try:
                return _wire.parse_lease(
                    await self._send(_wire.acquire_call(selector, target, ttl)), target=target)
            except NoProxyAvailable as exc:
                pause = exc.retry_after if exc.retry_after is not None else NO_PROXY_DEFAULT_WAIT
                if time.monotonic() + pause > deadline:
                    raise
                await sleep(pause)

    async def release(self, lease: Lease | str) -> None:
        lease_id = lease.id if isinstance(lease, Lease) else lease
        await self._send(_wire.release_call(lease_id))

    async def report(self, lease: Lease | str, result: Result | str, *,
                     retry_after: float | None = None, target: str | None = None) -> None:
        lease_id = lease.id if isinstance(lease, Lease) else lease
        await self._send(_wire.report_call(lease_id, result, target=target,
                                           retry_after=retry_after))

    @asynccontextmanager
    async def lease(self, *, selector: Mapping[str, str] | None = None,
                    target: str | None = None, ttl: float | None = None,
                    wait: float = 0.0) -> AsyncIterator[AsyncLeaseHandle]:
        """`async with client.lease(target=...) as lease:` — see `Client.lease`."""
        handle = AsyncLeaseHandle(self, await self.acquire(
            selector=selector, target=target, ttl=ttl, wait=wait))
        try:
            yield handle
        except BaseException as exc:
            if not handle.reported and is_proxy_failure(exc):
                await _cleanup(lambda: handle._report_quietly(Result.PROXY_ERROR))
            raise
        finally:
            await _cleanup(handle._release_quietly)


class AsyncLeaseHandle:
    """A lease inside `async with client.lease(...)`."""

    def __init__(self, client: AsyncClient, lease: Lease) -> None:
        self.client = client
        self.lease = lease
        self.reported: Result | None = None
        self.released = False

    def __repr__(self) -> str:
        return f"AsyncLeaseHandle(proxy={self.lease.proxy.key!r}, target={self.lease.target!r})"

    @property
    def proxy_url(self) -> str:
        """The URL to send traffic through (may carry credentials: never log it)."""
        return self.lease.proxy_url

    @property
    def proxies(self) -> dict[str, str]:
        return self.lease.proxies

    @property
    def proxy(self) -> ProxyInfo:
        return self.lease.proxy

    async def report(self, result: Result | str, *, retry_after: float | None = None,
                     target: str | None = None) -> None:
        await self.client.report(self.lease, result, retry_after=retry_after, target=target)
        self.reported = Result(result)

    async def report_response(self, response: Any, *, classifier: Any = classify) -> Verdict:
        verdict: Verdict = classifier(response)
        await self.report(verdict.result, retry_after=verdict.retry_after)
        return verdict

    async def release(self) -> None:
        if not self.released:
            await self.client.release(self.lease)
            self.released = True

    async def _report_quietly(self, result: Result) -> None:
        try:
            await self.client._send(
                _wire.report_call(self.lease.id, result, target=None, retry_after=None),
                request_timeout=CLEANUP_TIMEOUT)
            self.reported = result
        except EgressdError as exc:
            log.warning("egressd: could not report %s for proxy %s: %s",
                        result.value, self.lease.proxy.key, exc)

    async def _release_quietly(self) -> None:
        if self.released:
            return
        try:
            await self.client._send(_wire.release_call(self.lease.id),
                                    request_timeout=CLEANUP_TIMEOUT)
            self.released = True
        except EgressdError as exc:
            log.warning("egressd: could not release the lease on proxy %s (its TTL will): %s",
                        self.lease.proxy.key, exc)
