"""What both clients share: where egressd is, the token, timeouts and retries.

Defaults come from the environment, the same names the Scrapy add-on and
`egressd-lease` read: `EGRESSD_URL` (default `http://localhost:8090`),
`EGRESSD_TOKEN` (else `DISCOVERY_TOKEN`, the server's own variable) and
`EGRESSD_CA_FILE` (a CA bundle for an egressd served over HTTPS with a private CA).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from egressd_client._retry import RetryPolicy

log = logging.getLogger("egressd_client")

DEFAULT_URL = "http://localhost:8090"
DEFAULT_TIMEOUT = 10.0
"""Seconds for each connect, read and write to egressd (it answers in milliseconds)."""
CLEANUP_TIMEOUT = 5.0
"""Longest a release or report on the way out of a `with lease` may take."""


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    url: str
    token: str | None = field(repr=False)
    timeout: float
    retry: RetryPolicy

    @classmethod
    def build(cls, url: str | None, *, token: str | None, timeout: float, retry: RetryPolicy | None,
              environ: Mapping[str, str] | None = None) -> ClientConfig:
        env = os.environ if environ is None else environ
        url = (url or env.get("EGRESSD_URL") or DEFAULT_URL).rstrip("/")
        if token is None:
            token = (env.get("EGRESSD_TOKEN") or env.get("DISCOVERY_TOKEN") or "").strip() or None
        if timeout <= 0:
            raise ValueError("timeout must be above 0 seconds")
        return cls(url=url, token=token, timeout=timeout, retry=retry or RetryPolicy())

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "egressd-client/0.1"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def httpx_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout)


def tls_verify(verify: ssl.SSLContext | bool, environ: Mapping[str, str] | None = None
               ) -> ssl.SSLContext | bool:
    """`verify` as given, or a context trusting `$EGRESSD_CA_FILE` when that is set."""
    env = os.environ if environ is None else environ
    ca_file = env.get("EGRESSD_CA_FILE")
    if verify is True and ca_file:
        return ssl.create_default_context(cafile=ca_file)
    return verify
