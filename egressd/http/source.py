"""Where the HTTP layer reads proxies from: the `ProxySource` protocol.

`InformerProxySource` adapts the Proxy informer to it in the daemon; tests
use a small in-memory stand-in. The API never lists from the Kubernetes API per request.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

import trio

from egressd.kube.informer import Informer
from egressd.kube.resources import object_key
from egressd.model.convert import ModelError, parse_proxy
from egressd.model.proxy import Proxy

log = logging.getLogger(__name__)


class ProxySource(Protocol):
    """A read-only view of every Proxy this replica knows."""

    @property
    def synced(self) -> trio.Event:
        """Set once the first full list has been loaded (drives `/readyz`)."""
        ...

    def proxies(self) -> Iterable[Proxy]:
        """Every Proxy currently known, by key ("namespace/name").

        Iterate without awaiting in between: the view is live.
        """
        ...

    def get(self, key: str) -> Proxy | None:
        """The Proxy with key "namespace/name", or None."""
        ...


class InformerProxySource:
    """A ProxySource over the Proxy informer: each object is parsed once, on its event.

    Requests then read ready `Proxy` values instead of parsing raw dicts per
    request. An object that does not parse is left out (and logged), never served
    half-read. The key order is sorted again only after a proxy comes or goes, not
    per request (status updates, the frequent events, keep it).
    """

    def __init__(self, informer: Informer) -> None:
        self._informer = informer
        self._proxies: dict[str, Proxy] = {}
        self._order: list[str] | None = []
        informer.add_handler(
            on_add=self._put, on_update=lambda _old, new: self._put(new), on_delete=self._drop)

    @property
    def synced(self) -> trio.Event:
        return self._informer.synced

    def proxies(self) -> Iterable[Proxy]:
        if self._order is None:
            self._order = sorted(self._proxies)
        proxies = self._proxies
        return (proxies[key] for key in self._order)

    def get(self, key: str) -> Proxy | None:
        return self._proxies.get(key)

    def _put(self, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        try:
            proxy = parse_proxy(obj)
        except ModelError as exc:
            self._drop(obj)
            log.warning("ignoring a Proxy that does not parse",
                        extra={"proxy": key, "error": str(exc)})
            return
        if key not in self._proxies:
            self._order = None
        self._proxies[key] = proxy

    def _drop(self, obj: dict[str, Any]) -> None:
        if self._proxies.pop(object_key(obj), None) is not None:
            self._order = None
