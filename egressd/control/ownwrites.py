"""The reconciler's own writes that the Proxy cache has not shown yet.

After a pass writes, the watch may deliver that write only after the next
pass of the same key has started (a provisioning poll, a Secret event). That
pass would act on the old version: see the replaced instance's providerID,
find it gone and clear the new one. So the object a pass's last write
returned is used instead of the cache while the cache still shows a version
those writes replaced. Versions are only compared for equality (never
ordered), and the entry goes as soon as the cache shows anything else.
"""

from __future__ import annotations

from typing import Any

from egressd.kube.resources import resource_version

Obj = dict[str, Any]


class OwnWrites:
    """Key -> (versions our writes replaced, the object the last write returned)."""

    def __init__(self) -> None:
        self._ahead: dict[str, tuple[frozenset[str], Obj]] = {}

    def fresh(self, key: str, cached: Obj | None) -> tuple[Obj | None, frozenset[str]]:
        """The newest known version of `key` and the versions it replaced: the cache's,
        unless our own writes already replaced the cached version."""
        ahead = self._ahead.get(key)
        if ahead is None:
            return cached, frozenset()
        superseded, mine = ahead
        if cached is None:
            del self._ahead[key]
            return None, frozenset()
        if resource_version(cached) in superseded:
            return mine, superseded
        del self._ahead[key]  # the cache caught up, or someone else wrote since
        return cached, frozenset()

    def wrote(self, key: str, superseded: frozenset[str], latest: Obj) -> None:
        """A pass replaced the `superseded` versions; its last write returned `latest`."""
        self._ahead[key] = (superseded, latest)
