"""egressd-client: lease egress proxies from egressd's discovery API.

    from egressd_client import Client
    with Client() as egressd, egressd.lease(target="example.org") as lease:
        r = httpx.get("https://example.org/", proxy=lease.proxy_url)
        lease.report_response(r)

`Client` blocks; `AsyncClient` is the same for asyncio and trio. Scrapy
support is `egressd_client.scrapy` (the `egressd-client[scrapy]` extra), the
shell's is the `egressd-lease` command. Nothing here logs a token, a lease id
or a proxy URL.
"""

from egressd_client._async import AsyncClient, AsyncLeaseHandle
from egressd_client._classify import Classifier, Verdict, classify, is_proxy_failure
from egressd_client._errors import (
    ApiError,
    EgressdError,
    EgressdUnavailable,
    NoProxyAvailable,
    Unauthorized,
    UnknownLease,
)
from egressd_client._retry import RetryPolicy
from egressd_client._sync import Client, LeaseHandle
from egressd_client._wire import Lease, ProxyInfo, Result, parse_retry_after

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncLeaseHandle",
    "Classifier",
    "Client",
    "EgressdError",
    "EgressdUnavailable",
    "Lease",
    "LeaseHandle",
    "NoProxyAvailable",
    "ProxyInfo",
    "Result",
    "RetryPolicy",
    "Unauthorized",
    "UnknownLease",
    "Verdict",
    "classify",
    "is_proxy_failure",
    "parse_retry_after",
]
__version__ = "0.1.0"
