"""The write verbs over HTTP: create (POST), replace (PUT), patch (merge, JSON,
strategic, server-side apply), delete and delete-collection. Each turns the request
into a body and runs it through the `Writer` pipeline."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable

from egressd.sandbox.apiserver import bodies, managed, ownergc, patch, reads
from egressd.sandbox.apiserver.bodies import check_type
from egressd.sandbox.apiserver.errors import (
    bad_request,
    conflict,
    invalid,
    not_found,
    unsupported_media_type,
)
from egressd.sandbox.apiserver.respond import json_response, out, render_one
from egressd.sandbox.apiserver.routing import Target
from egressd.sandbox.apiserver.store import Obj
from egressd.sandbox.apiserver.wire import Request, Response
from egressd.sandbox.apiserver.writes import Writer, WriteResult


def _updater(request: Request, target: Target) -> managed.Manager:
    return managed.manager_for(request.param("fieldManager"),
                               request.headers.get("user-agent", ""), operation="Update",
                               subresource=target.subresource)


class Verbs:
    """create, update, patch, apply, delete and delete-collection for one server."""

    def __init__(self, writer: Writer, *, now: Callable[[], datetime.datetime]) -> None:
        self.writer = writer
        self.store = writer.store
        self._now = now

    def _render(self, target: Target, request: Request, result: WriteResult,
                status: int | None = None) -> Response:
        return render_one(target.rt, request, status or result.status, result.obj,
                          now=self._now(), warnings=result.warnings)

    def create(self, target: Target, request: Request) -> Response:
        body = bodies.object_body(request, target.rt)
        meta = body.setdefault("metadata", {})
        if target.rt.namespaced:
            if meta.get("namespace") not in (None, "", target.namespace):
                raise bad_request("the namespace of the provided object does not match the "
                                  "namespace sent on the request")
            meta["namespace"] = target.namespace
        result = self.writer.create(target.rt, body, dry_run=bodies.dry_run(request),
                                    field_validation=bodies.field_validation(request),
                                    manager=_updater(request, target))
        return self._render(target, request, result, 201)

    def update(self, target: Target, request: Request) -> Response:
        rt = target.rt
        assert target.name is not None
        body = bodies.object_body(request, rt)
        meta = bodies.url_name(body, rt, name=target.name, namespace=target.namespace)
        dry_run, validation = bodies.dry_run(request), bodies.field_validation(request)
        old = self.store.get(rt.store_key, target.namespace or "", target.name)
        if old is None:
            if target.subresource is None and rt.kind != "Pod":
                # PUT creates when missing (AllowCreateOnUpdate) for CRs and most kinds.
                result = self.writer.create(rt, body, dry_run=dry_run,
                                            field_validation=validation,
                                            manager=_updater(request, target))
                return self._render(target, request, result, 201)
            raise not_found(rt.plural, rt.group, target.name)
        if not meta.get("resourceVersion") and rt.custom:
            raise invalid(rt.kind, rt.group, target.name, [(
                "metadata.resourceVersion", "FieldValueInvalid",
                "Invalid value: 0x0: must be specified for an update")])
        result = self.writer.write(rt, body, old, subresource=target.subresource,
                                   dry_run=dry_run, field_validation=validation,
                                   manager=_updater(request, target))
        return self._render(target, request, result)

    def patch(self, target: Target, request: Request) -> Response:
        rt = target.rt
        assert target.name is not None
        media = bodies.content_type(request)
        strategic_ok = not rt.custom
        accepted = patch.accepted_types(strategic_ok=strategic_ok)
        if media not in accepted:
            raise unsupported_media_type(accepted)
        dry_run, validation = bodies.dry_run(request), bodies.field_validation(request)
        old = self.store.get(rt.store_key, target.namespace or "", target.name)
        if media == patch.APPLY:
            return self._apply(target, request, old, dry_run=dry_run,
                               field_validation=validation)
        if old is None:
            raise not_found(rt.plural, rt.group, target.name)
        new = patch.apply_patch(media, out(rt, old), request.body, strategic_ok=strategic_ok)
        check_type(rt, new)
        new_meta = new.setdefault("metadata", {})
        if not isinstance(new_meta, dict):
            raise bad_request("metadata: must be an object")
        if new_meta.get("name") != target.name:
            raise bad_request("metadata.name: the name of the object cannot change in a patch")
        result = self.writer.write(rt, new, old, subresource=target.subresource,
                                   dry_run=dry_run, field_validation=validation,
                                   manager=_updater(request, target))
        return self._render(target, request, result)

    def _apply(self, target: Target, request: Request, old: Obj | None, *, dry_run: bool,
               field_validation: str) -> Response:
        rt = target.rt
        assert target.name is not None
        if not request.param("fieldManager"):
            raise bad_request("PATCH, application/apply-patch+yaml requests require a "
                              "fieldManager")
        applied = patch.parse_apply(request.body)
        if applied.get("kind") is None or applied.get("apiVersion") is None:
            raise bad_request("invalid object type: the applied configuration needs "
                              "apiVersion and kind")
        check_type(rt, applied)
        meta = applied.setdefault("metadata", {})
        if meta.get("name") not in (None, target.name):
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the "
                              f"name on the URL ({target.name})")
        meta["name"] = target.name
        if rt.namespaced:
            meta["namespace"] = target.namespace
        manager = managed.manager_for(request.param("fieldManager"), "", operation="Apply",
                                      subresource=target.subresource)
        if old is None:
            if target.subresource is not None:
                raise not_found(rt.plural, rt.group, target.name)
            result = self.writer.create(rt, applied, dry_run=dry_run,
                                        field_validation=field_validation, manager=manager)
            return self._render(target, request, result, 201)
        new = managed.apply(out(rt, old), applied, manager, force=request.flag("force"),
                            api_version=rt.api_version, now=self._now())
        result = self.writer.write(rt, new, old, subresource=target.subresource,
                                   dry_run=dry_run, field_validation=field_validation,
                                   manager=manager)
        return self._render(target, request, result)

    def delete(self, target: Target, request: Request) -> Response:
        rt = target.rt
        assert target.name is not None
        options: Obj = {}
        if request.body.strip():
            parsed = bodies.decoded(request, rt)
            if not isinstance(parsed, dict):
                raise bad_request("DeleteOptions must be a JSON object")
            options = parsed
        old = reads.get(self.store, target)
        preconditions = options.get("preconditions") or {}
        if not isinstance(preconditions, dict):
            raise bad_request("preconditions must be an object")
        for field in ("uid", "resourceVersion"):
            wanted = preconditions.get(field)
            if wanted and wanted != old["metadata"].get(field):
                raise conflict(rt.plural, rt.group, target.name,
                               f"Precondition failed: {field.upper() if field == 'uid' else field}"
                               f" in precondition: {wanted}, {field} in object meta: "
                               f"{old['metadata'].get(field)}")
        propagation = ownergc.policy(options)
        if request.param("propagationPolicy"):  # also accepted as a query parameter
            propagation = ownergc.policy({"propagationPolicy": request.param("propagationPolicy")})
        result, status = self.writer.delete(rt, old, dry_run=bodies.dry_run(request),
                                            propagation=propagation)
        return render_one(rt, request, status, result, now=self._now())

    def delete_collection(self, target: Target, request: Request) -> Response:
        rt = target.rt
        labels, fields = reads.selectors(target, request)
        dry_run = bodies.dry_run(request)
        deleted = []
        for obj in list(self.store.items(rt.store_key, target.namespace or None)):
            if labels.matches(obj) and fields.matches(obj):
                result, _ = self.writer.delete(rt, copy.deepcopy(obj), dry_run=dry_run)
                deleted.append(result)
        return json_response(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                                   "metadata": {"resourceVersion":
                                                str(self.store.resource_version)},
                                   "items": deleted})
