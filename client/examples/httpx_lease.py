"""Fetch pages concurrently through one egressd lease with httpx (asyncio; the same code
runs under trio with `trio.run(main, url)`).

    EGRESSD_URL=http://egressd:8090 EGRESSD_TOKEN=... python httpx_lease.py https://example.org/
"""

from __future__ import annotations

import asyncio
import sys
from urllib.parse import urlsplit

import httpx
from egressd_client import AsyncClient


async def main(url: str) -> int:
    async with (AsyncClient() as egressd,
                egressd.lease(target=urlsplit(url).hostname, ttl=120) as lease,
                httpx.AsyncClient(proxy=lease.proxy_url, timeout=30) as http):
        responses = await asyncio.gather(*(http.get(url) for _ in range(3)))
        for response in responses:
            verdict = await lease.report_response(response)
            if verdict.is_ban:  # this proxy is cooling down for the site: stop using it
                print(f"{response.status_code} via {lease.proxy.key}: {verdict.result.value}")
                return 75
    print(f"{[r.status_code for r in responses]} via {lease.proxy.key}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
