"""The blocking client: `Client`, and `LeaseHandle` for `with client.lease(...)`."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
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
from egressd_client._wire import Call, Lease, ProxyInfo, Result

NO_PROXY_DEFAULT_WAIT = 1.0
"""Seconds between acquires while waiting for a proxy, when the 409 names no Retry-After."""


class Client:
    """A connection to egressd's discovery API (thread-safe, like `httpx.Client`).

    `Client(url=None, token=None)` reads `EGRESSD_URL` and `EGRESSD_TOKEN`. Every
    call has a timeout (`timeout`, seconds) and is retried on connection
    failures and 5xx (`retry`). `verify` is an SSLContext trusting egressd's CA when
    it serves HTTPS with a private one (the environment's proxy and CA variables are
    ignored: HTTPS_PROXY is for the leased proxy, never for egressd).
    """

    def __init__(self, url: str | None = None, *, token: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, retry: RetryPolicy | None = None,
                 verify: ssl.SSLContext | bool = True,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.config = ClientConfig.build(url, token=token, timeout=timeout, retry=retry)
        # trust_env=False: HTTPS_PROXY (set by egressd-lease) must not route calls to egressd.
        self._http = httpx.Client(base_url=self.config.url, headers=self.config.headers(),
                                  timeout=self.config.httpx_timeout(), transport=transport,
                                  verify=tls_verify(verify), trust_env=False)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call, *, request_timeout: float | None = None) -> httpx.Response:
        policy = self.config.retry
        for attempt in range(policy.attempts):
            last = attempt == policy.attempts - 1
            try:
                response = self._http.request(
                    call.method, call.path, json=call.json, params=call.params,
                    timeout=(request_timeout if request_timeout is not None
                             else httpx.USE_CLIENT_DEFAULT))
            except httpx.HTTPError as exc:
                if last or not retriable_error(exc, unsent_only=call.retry_unsent_only):
                    raise EgressdUnavailable(
                        f"egressd at {_wire.safe_url(self.config.url)} is unreachable: "
                        f"{type(exc).__name__}: {exc}") from exc
                time.sleep(policy.delay(attempt))
                continue
            if last or not retriable_status(response.status_code):
                if response.status_code >= 500:
                    raise EgressdUnavailable(
                        f"egressd at {_wire.safe_url(self.config.url)} answered "
                        f"{response.status_code} ({attempt + 1} tries)")
                _wire.check(response, base_url=self.config.url)
                return response
            retry_after = _wire.parse_retry_after(response.headers.get("Retry-After"))
            time.sleep(policy.delay(attempt, retry_after=retry_after))
        raise AssertionError("unreachable")  # pragma: no cover

    def proxies(self, *, selector: Mapping[str, str] | None = None,
                healthy: bool | None = None) -> list[ProxyInfo]:
        """The proxies matching `selector` (`healthy=True`: only healthy ones)."""
        return _wire.parse_proxies(self._send(_wire.proxies_call(selector, healthy)))

    def acquire(self, *, selector: Mapping[str, str] | None = None, target: str | None = None,
                ttl: float | None = None, wait: float = 0.0) -> Lease:
        """Lease a proxy. With `wait` > 0, a 409 is retried until `wait` seconds have
        passed, sleeping its Retry-After; then the last `NoProxyAvailable` is raised."""
        deadline = time.monotonic() + wait
        while True:
            try:
                return _wire.parse_lease(
                    self._send(_wire.acquire_call(selector, target, ttl)), target=target)
            except NoProxyAvailable as exc:
                pause = exc.retry_after if exc.retry_after is not None else NO_PROXY_DEFAULT_WAIT
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)

    def release(self, lease: Lease | str) -> None:
        """Give the lease back (also fine for an expired or unknown one)."""
        lease_id = lease.id if isinstance(lease, Lease) else lease
        self._send(_wire.release_call(lease_id))

    def report(self, lease: Lease | str, result: Result | str, *,
               retry_after: float | None = None, target: str | None = None) -> None:
        """Tell egressd what the site did (`rate_limited` with the site's Retry-After
        cools the proxy down for that long). The target defaults to the lease's."""
        lease_id = lease.id if isinstance(lease, Lease) else lease
        self._send(_wire.report_call(lease_id, result, target=target, retry_after=retry_after))

    @contextmanager
    def lease(self, *, selector: Mapping[str, str] | None = None, target: str | None = None,
              ttl: float | None = None, wait: float = 0.0) -> Iterator[LeaseHandle]:
        """`with client.lease(target="example.org") as lease:` — released on exit; a
        connection failure through the proxy escaping the block reports `proxy_error`."""
        handle = LeaseHandle(self, self.acquire(selector=selector, target=target, ttl=ttl,
                                                wait=wait))
        try:
            yield handle
        except BaseException as exc:
            if not handle.reported and is_proxy_failure(exc):
                handle._report_quietly(Result.PROXY_ERROR)
            raise
        finally:
            handle._release_quietly()


class LeaseHandle:
    """A lease inside `with client.lease(...)`: its proxy, and report/release bound to it."""

    def __init__(self, client: Client, lease: Lease) -> None:
        self.client = client
        self.lease = lease
        self.reported: Result | None = None
        self.released = False

    def __repr__(self) -> str:
        return f"LeaseHandle(proxy={self.lease.proxy.key!r}, target={self.lease.target!r})"

    @property
    def proxy_url(self) -> str:
        """The URL to send traffic through (may carry credentials: never log it)."""
        return self.lease.proxy_url

    @property
    def proxies(self) -> dict[str, str]:
        """For requests: `requests.get(url, proxies=lease.proxies)`."""
        return self.lease.proxies

    @property
    def proxy(self) -> ProxyInfo:
        return self.lease.proxy

    def report(self, result: Result | str, *, retry_after: float | None = None,
               target: str | None = None) -> None:
        self.client.report(self.lease, result, retry_after=retry_after, target=target)
        self.reported = Result(result)

    def report_response(self, response: Any, *, classifier: Any = classify) -> Verdict:
        """Classify `response` and report what it means; the verdict is returned."""
        verdict: Verdict = classifier(response)
        self.report(verdict.result, retry_after=verdict.retry_after)
        return verdict

    def release(self) -> None:
        if not self.released:
            self.client.release(self.lease)
            self.released = True

    def _report_quietly(self, result: Result) -> None:
        try:
            self.client._send(
                _wire.report_call(self.lease.id, result, target=None, retry_after=None),
                request_timeout=CLEANUP_TIMEOUT)
            self.reported = result
        except EgressdError as exc:
            log.warning("egressd: could not report %s for proxy %s: %s",
                        result.value, self.lease.proxy.key, exc)

    def _release_quietly(self) -> None:
        if self.released:
            return
        try:
            self.client._send(_wire.release_call(self.lease.id),
                                    request_timeout=CLEANUP_TIMEOUT)
            self.released = True
        except EgressdError as exc:
            # The TTL frees it anyway; the caller's own error must not be masked.
            log.warning("egressd: could not release the lease on proxy %s (its TTL will): %s",
                        self.lease.proxy.key, exc)
