"""Fetch a page through an egressd lease with requests, and report what the site said.

    EGRESSD_URL=http://egressd:8090 EGRESSD_TOKEN=... python requests_lease.py https://example.org/
"""

from __future__ import annotations

import sys
from urllib.parse import urlsplit

import requests
from egressd_client import Client, NoProxyAvailable


def main(url: str) -> int:
    with Client() as egressd:
        try:
            lease_cm = egressd.lease(target=urlsplit(url).hostname, wait=30)
            with lease_cm as lease:
                response = requests.get(url, proxies=lease.proxies, timeout=30)
                verdict = lease.report_response(response)  # ok, rate_limited or banned
        except NoProxyAvailable as exc:
            print(f"no proxy: {exc}", file=sys.stderr)
            return 69
    print(f"{response.status_code} via {lease.proxy.key}: {verdict.result.value}")
    return 0 if not verdict.is_ban else 75


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
