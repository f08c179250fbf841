"""Where the HTTP layer reads proxies from: the `ProxySource` protocol.

The informer's cache satisfies it in the daemon; tests use a small in-memory
stand-in. The API never lists from the Kubernetes API per request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import trio

from egressd.model.proxy import Proxy


class ProxySource(Protocol):
    """A read-only view of every Proxy this replica knows."""

    @property
    def synced(self) -> trio.Event:
        """Set once the first full list has been loaded (drives `/readyz`)."""
        ...

    def proxies(self) -> Iterable[Proxy]:
        """Every Proxy currently known, in no particular order."""
        ...

    def get(self, key: str) -> Proxy | None:
        """The Proxy with key "namespace/name", or None."""
        ...
