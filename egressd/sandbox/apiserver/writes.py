"""The write pipeline every verb shares, as named steps:

    decode → admit metadata (create or update rules) → isolate status →
    validate (kind rules) → admit schema (prune, defaults, CEL) → generation →
    no-op check → store → notify (CRD registration, deletion cascades)

`Writer.write` runs them for create (old None), update and patch; `create`
adds the create-only checks (name, namespace, existence) first; `delete`
marks for deletion while finalizers remain, else deletes.
"""

from __future__ import annotations

import copy
import datetime
import json
import secrets
import uuid
from collections.abc import Callable
from typing import Any

import attrs

from egressd.sandbox.apiserver import builtin, managed, ownergc
from egressd.sandbox.apiserver.bodies import check_decodable
from egressd.sandbox.apiserver.errors import already_exists, conflict, invalid, not_found
from egressd.sandbox.apiserver.managed import Manager
from egressd.sandbox.apiserver.registry import Registry
from egressd.sandbox.apiserver.resources import ResourceType
from egressd.sandbox.apiserver.respond import out, timestamp
from egressd.sandbox.apiserver.store import Obj, Store
from egressd.sandbox.apiserver.validation import BadSchema, enforce, load_schema

NAMESPACE_KEY = "/namespaces"
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# Metadata the server owns: an update keeps the stored values whatever the body says.
_KEPT_ON_UPDATE = ("uid", "creationTimestamp", "deletionTimestamp",
                   "deletionGracePeriodSeconds", "generation", "namespace")


@attrs.frozen
class WriteResult:
    obj: Obj
    status: int
    warnings: tuple[str, ...] = ()


@attrs.define
class _Write:
    """One write on its way through the pipeline."""

    rt: ResourceType
    new: Obj
    old: Obj | None
    subresource: str | None
    warnings: list[str] = attrs.field(factory=list)

    @property
    def meta(self) -> Obj:
        meta: Obj = self.new.setdefault("metadata", {})
        return meta

    @property
    def name(self) -> str:
        return str(self.meta.get("name", ""))


class Writer:
    """Runs writes against the store and keeps the registry in step with CRD writes."""

    def __init__(self, store: Store, registry: Registry, *,
                 now: Callable[[], datetime.datetime]) -> None:
        self.store = store
        self.registry = registry
        self._now = now

    # ----- the pipeline

    def write(self, rt: ResourceType, new: Obj, old: Obj | None, *, subresource: str | None,
              dry_run: bool, field_validation: str, manager: Manager | None = None
              ) -> WriteResult:
        """The shared write pipeline for create (old None), update and patch.

        `manager` records who wrote which fields (managedFields); an apply to an
        existing object brings them computed (`managed.apply`), others are recorded here.
        """
        w = _Write(rt, copy.deepcopy(new), old, subresource)
        _decode(w)
        if old is None:
            self._admit_create(w)
        else:
            _admit_update(w, old)
        self._track_managers(w, manager)
        _validate(w)
        self._admit_schema(w, field_validation)
        if old is not None:
            _next_generation(w, old)
            if _same(w.new, old):
                return WriteResult(out(rt, old), 200, tuple(w.warnings))
        if dry_run:
            return WriteResult(out(rt, w.new), 201 if old is None else 200, tuple(w.warnings))
        return self._store(w)

    def _admit_create(self, w: _Write) -> None:
        """A new object's server-owned metadata: uid, creation time, generation."""
        rt, meta = w.rt, w.meta
        problem = builtin.name_problem(rt, w.name)
        if problem:
            raise invalid(rt.kind, rt.group, w.name, [(
                "metadata.name", "FieldValueInvalid",
                f"Invalid value: {builtin.quote(w.name)}: {problem}")])
        for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = timestamp(self._now())
        if rt.has_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if rt.has_status and rt.custom:
            w.new.pop("status", None)  # create cannot set status (status subresource)
        builtin.on_create(rt, w.new)

    def _track_managers(self, w: _Write, manager: Manager | None) -> None:
        """managedFields: recorded for this write's manager, else (a write without a
        request: seeding, the sandbox) the stored ones, whatever the body said."""
        old_fields = (w.old or {}).get("metadata", {}).get("managedFields")
        if manager is None:
            if old_fields is None:
                w.meta.pop("managedFields", None)
            else:
                w.meta["managedFields"] = copy.deepcopy(old_fields)
        elif manager.operation != "Apply" or w.old is None:
            managed.record_update(w.new, w.old, manager, api_version=w.rt.api_version,
                                  now=self._now())

    def _admit_schema(self, w: _Write, field_validation: str) -> None:
        """Prune, default and validate a custom resource against its CRD version's schema."""
        schema = self.registry.schema(w.rt)
        if schema is None:
            return
        w.new, warnings = enforce(schema, w.new, w.old, kind=w.rt.kind, group=w.rt.group,
                                  field_validation=field_validation)
        w.warnings.extend(warnings)

    def _store(self, w: _Write) -> WriteResult:
        rt, status = w.rt, 201 if w.old is None else 200
        if w.meta.get("deletionTimestamp") and not w.meta.get("finalizers"):
            # The last finalizer is gone: the write is the deletion.
            stored = self.store.write(rt.store_key, w.new, event_type="DELETED", old=w.old)
            self._notify_deleted(rt, stored)
            return WriteResult(out(rt, stored), 200, tuple(w.warnings))
        stored = self.store.write(rt.store_key, w.new,
                                  event_type="ADDED" if w.old is None else "MODIFIED", old=w.old)
        if rt.kind == "CustomResourceDefinition":
            self.registry.register_crd(stored)
        return WriteResult(out(rt, stored), status, tuple(w.warnings))

    # ----- create and delete

    def create(self, rt: ResourceType, body: Obj, *, dry_run: bool,
               field_validation: str, manager: Manager | None = None) -> WriteResult:
        """Create `body` (its namespace set): name or generateName, namespace exists, unique."""
        check_decodable(rt, body)
        meta = body.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(rt.kind, rt.group, "", [(
                    "metadata.name", "FieldValueRequired",
                    "Required value: name or generateName is required")])
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
        if rt.namespaced:
            namespace = meta.get("namespace") or ""
            if self.store.peek(NAMESPACE_KEY, "", namespace) is None:
                raise not_found("namespaces", "", namespace)
        else:
            meta.pop("namespace", None)
        if self.store.peek(rt.store_key, meta.get("namespace", ""), meta["name"]) is not None:
            raise already_exists(rt.plural, rt.group, meta["name"])
        return self.write(rt, body, None, subresource=None, dry_run=dry_run,
                          field_validation=field_validation, manager=manager)

    def delete(self, rt: ResourceType, old: Obj, *, dry_run: bool = False,
               propagation: str = ownergc.BACKGROUND) -> tuple[Obj, int]:
        """Delete now (200), or mark for deletion while finalizers remain (202);
        dependents by `propagation` (ownergc)."""
        if not dry_run and not old["metadata"].get("deletionTimestamp"):
            if propagation == ownergc.ORPHAN:
                ownergc.orphan(self.store, self.registry, old)
            elif propagation == ownergc.FOREGROUND and next(
                    ownergc.dependents(self.store, self.registry, old), None):
                old = copy.deepcopy(old)
                old["metadata"]["finalizers"] = [*(old["metadata"].get("finalizers") or ()),
                                                 ownergc.FOREGROUND_FINALIZER]
                result = self._delete(rt, old, dry_run=False)
                ownergc.cascade(self.store, self.registry, old, self._delete_dependent)
                return result
        return self._delete(rt, old, dry_run=dry_run)

    def _delete_dependent(self, rt: ResourceType, obj: Obj) -> None:
        self.delete(rt, obj)

    def _delete(self, rt: ResourceType, old: Obj, *, dry_run: bool) -> tuple[Obj, int]:
        meta = old["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return out(rt, old), 202
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = timestamp(self._now())
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if rt.has_generation:
                new["metadata"]["generation"] = int(meta.get("generation", 1)) + 1
            if dry_run:
                return out(rt, new), 202
            return out(rt, self.store.write(rt.store_key, new, event_type="MODIFIED",
                                            old=old)), 202
        if dry_run:
            return out(rt, old), 200
        stored = self.store.write(rt.store_key, copy.deepcopy(old), event_type="DELETED", old=old)
        self._notify_deleted(rt, stored)
        return out(rt, stored), 200

    def _notify_deleted(self, rt: ResourceType, obj: Obj) -> None:
        ownergc.cascade(self.store, self.registry, obj, self._delete_dependent)
        for owner_rt, owner in list(ownergc.owners_waiting(self.store, self.registry, obj)):
            if next(ownergc.dependents(self.store, self.registry, owner), None) is None:
                self._drop_finalizer(owner_rt, owner, ownergc.FOREGROUND_FINALIZER)
        if rt.kind == "CustomResourceDefinition":
            for gone in self.registry.unregister_crd(obj["metadata"]["name"]):
                self.store.drop_all(gone.store_key)
        elif rt.kind == "Namespace":
            # Namespace deletion removes its contents (the namespace controller's job).
            namespace = obj["metadata"]["name"]
            seen: set[str] = set()
            for other in self.registry.types():
                if not other.namespaced or other.store_key in seen:
                    continue
                seen.add(other.store_key)
                for child in list(self.store.items(other.store_key, namespace)):
                    self.delete(other, copy.deepcopy(child))


    def _drop_finalizer(self, rt: ResourceType, obj: Obj, finalizer: str) -> None:
        """What the finalizer's controller does when done: the last one deletes."""
        new = copy.deepcopy(obj)
        new["metadata"]["finalizers"] = [
            f for f in new["metadata"].get("finalizers") or () if f != finalizer]
        w = _Write(rt, new, obj, None)
        self._store(w)


# ----- steps without state


def _decode(w: _Write) -> None:
    """400 for a field of the wrong JSON type; the stored kind and apiVersion."""
    check_decodable(w.rt, w.new)
    w.new["apiVersion"], w.new["kind"] = w.rt.api_version, w.rt.kind


def _admit_update(w: _Write, old: Obj) -> None:
    """An update keeps what the server owns: the precondition, metadata, and status
    (or, through the status subresource, everything but status)."""
    old_meta = old["metadata"]
    given_rv = w.meta.get("resourceVersion")
    if given_rv and given_rv != old_meta["resourceVersion"]:
        raise conflict(w.rt.plural, w.rt.group, w.name)
    if w.subresource == "status":
        _status_only(w, old)
    else:
        _keep_status(w, old)
        _keep_server_metadata(w, old_meta)
    w.meta["resourceVersion"] = old_meta["resourceVersion"]


def _status_only(w: _Write, old: Obj) -> None:
    """A status write changes status only (metadata, spec: the old ones; managedFields
    as the write brings them, for an apply to the status subresource)."""
    status = w.new.get("status")
    fields = w.meta.get("managedFields")
    w.new = copy.deepcopy(old)
    if status is None:
        w.new.pop("status", None)
    else:
        w.new["status"] = status
    if fields is not None:
        w.meta["managedFields"] = fields


def _keep_status(w: _Write, old: Obj) -> None:
    if not w.rt.has_status:
        return
    if "status" in old:
        w.new["status"] = copy.deepcopy(old["status"])
    else:
        w.new.pop("status", None)


def _keep_server_metadata(w: _Write, old_meta: Obj) -> None:
    meta = w.meta
    for field in _KEPT_ON_UPDATE:
        if field in old_meta:
            meta[field] = old_meta[field]
        else:
            meta.pop(field, None)
    if old_meta.get("deletionTimestamp"):
        added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
        if added:
            raise invalid(w.rt.kind, w.rt.group, w.name, [(
                "metadata.finalizers", "FieldValueForbidden",
                "Forbidden: no new finalizers can be added if the object is being "
                "deleted, found new finalizers " + json.dumps(sorted(added)))])


def _validate(w: _Write) -> None:
    """The kind's own rules (built-ins), and a CRD's schemas must compile: 422."""
    causes = builtin.on_write(w.rt, w.new)
    causes += builtin.validate(w.rt, w.new, w.old)
    if not causes and w.rt.kind == "CustomResourceDefinition":
        causes = _crd_schema_problems(w.new)
    if causes:
        raise invalid(w.rt.kind, w.rt.group, w.name, causes)


def _crd_schema_problems(crd: Obj) -> list[builtin.Cause]:
    """Compile every version's schema before the CRD is stored: one that cannot be
    served is a 422, never a stored CRD whose objects then fail to write."""
    causes: list[builtin.Cause] = []
    for i, version in enumerate(crd["spec"]["versions"]):
        try:
            load_schema(crd, version["name"])
        except BadSchema as exc:
            causes.append((f"spec.versions[{i}].schema.openAPIV3Schema", "FieldValueInvalid",
                           f"Invalid value: {exc}"))
    return causes


def _next_generation(w: _Write, old: Obj) -> None:
    if w.rt.has_generation and _spec_part(w.new, w.rt) != _spec_part(old, w.rt):
        w.meta["generation"] = int(old["metadata"].get("generation", 1)) + 1


def _spec_part(obj: Obj, rt: ResourceType) -> Any:
    """What moves generation: all but metadata and status for CRs, spec otherwise."""
    if rt.custom:
        return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion",
                                                          "kind")}
    return obj.get("spec")


def _same(new: Obj, old: Obj) -> bool:
    """A write that changes nothing keeps the resourceVersion and sends no event.

    A change of field ownership is a change; a manager's new timestamp alone is not
    (as kube-apiserver, which would otherwise write on every identical apply).
    """
    def strip(obj: Obj) -> Obj:
        kept = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        meta = obj.get("metadata", {})
        kept["metadata"] = {k: v for k, v in meta.items()
                            if k not in ("resourceVersion", "managedFields")}
        kept["managers"] = [{k: v for k, v in entry.items() if k != "time"}
                            for entry in meta.get("managedFields") or ()
                            if isinstance(entry, dict)]
        return kept

    return strip(new) == strip(old)
