"""Garbage collection by ownerReferences, as kube-controller-manager's garbage
collector does it, run inline on each deletion:

* Background (the default for custom resources): the owner goes at once, then
  every dependent naming its uid is deleted (each in turn, so a chain cascades);
* Foreground: the owner gets the `foregroundDeletion` finalizer and a
  deletionTimestamp, its dependents with `blockOwnerDeletion` are deleted, and
  the owner goes once the last of them is gone;
* Orphan: the owner's uid is removed from its dependents' ownerReferences
  first, so they stay.

Dependents with finalizers of their own (a Managed Proxy's instance cleanup)
are only marked for deletion, as on a cluster. Finding dependents scans the
namespace's objects: fine for a test server (the real GC keeps a graph).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

from egressd.sandbox.apiserver.errors import bad_request
from egressd.sandbox.apiserver.registry import Registry
from egressd.sandbox.apiserver.resources import ResourceType
from egressd.sandbox.apiserver.store import Obj, Store

BACKGROUND, FOREGROUND, ORPHAN = "Background", "Foreground", "Orphan"
FOREGROUND_FINALIZER = "foregroundDeletion"
ORPHAN_FINALIZER = "orphan"

Delete = Callable[[ResourceType, Obj], object]


def policy(options: Obj) -> str:
    """The propagation policy of DeleteOptions (orphanDependents, the old spelling, too)."""
    value = options.get("propagationPolicy")
    if value is None and options.get("orphanDependents") is True:
        return ORPHAN
    if value in (None, ""):
        return BACKGROUND
    if value not in (BACKGROUND, FOREGROUND, ORPHAN):
        raise bad_request(f'propagationPolicy: Unsupported value: "{value}": supported values: '
                          '"Orphan", "Background", "Foreground"')
    return str(value)


def dependents(store: Store, registry: Registry, owner: Obj
               ) -> Iterator[tuple[ResourceType, Obj]]:
    """Objects (in the owner's namespace, or anywhere for a cluster-scoped owner) that
    name the owner's uid in their ownerReferences."""
    uid = owner["metadata"].get("uid")
    namespace = owner["metadata"].get("namespace") or None
    seen: set[str] = set()
    for rt in registry.types():
        if rt.store_key in seen:
            continue
        seen.add(rt.store_key)
        for obj in list(store.items(rt.store_key, namespace if rt.namespaced else None)):
            refs = obj["metadata"].get("ownerReferences") or ()
            if any(ref.get("uid") == uid for ref in refs):
                yield rt, obj


def orphan(store: Store, registry: Registry, owner: Obj) -> None:
    """Remove the owner from every dependent's ownerReferences."""
    uid = owner["metadata"].get("uid")
    for rt, obj in list(dependents(store, registry, owner)):
        new = copy.deepcopy(obj)
        refs = [r for r in new["metadata"].get("ownerReferences") or () if r.get("uid") != uid]
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        store.write(rt.store_key, new, event_type="MODIFIED", old=obj)


def cascade(store: Store, registry: Registry, owner: Obj, delete: Delete) -> None:
    """Delete the owner's dependents (not those already being deleted)."""
    for rt, obj in list(dependents(store, registry, owner)):
        if not obj["metadata"].get("deletionTimestamp"):
            delete(rt, copy.deepcopy(obj))


def owners_waiting(store: Store, registry: Registry, dependent: Obj
                   ) -> Iterator[tuple[ResourceType, Obj]]:
    """Owners of `dependent` in foreground deletion (to check once it is gone)."""
    namespace = dependent["metadata"].get("namespace") or ""
    for ref in dependent["metadata"].get("ownerReferences") or ():
        group, _, version = str(ref.get("apiVersion", "")).rpartition("/")
        for rt in registry.types():
            if rt.group == group and rt.kind == ref.get("kind") and rt.version == version:
                owner = store.get(rt.store_key, namespace if rt.namespaced else "",
                                  str(ref.get("name")))
                if (owner is not None and owner["metadata"].get("uid") == ref.get("uid")
                        and FOREGROUND_FINALIZER in (owner["metadata"].get("finalizers")
                                                     or ())):
                    yield rt, owner
                break
