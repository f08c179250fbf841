"""The API server's behaviour behind the transport: authentication, faults, routing
and dispatch to the verbs.

`ApiApp` composes the parts: the `Registry` of served types, `reads` (get,
list), `Watches`, `Verbs` (create, replace, patch, apply, delete) and the
`Writer` pipeline they share (see `writes`). Requests answer a `Response` or,
for watches, a `Stream`; every failure is an `ApiError` rendered as a `Status`.
"""

from __future__ import annotations

import copy
import datetime
import hmac
import logging
from collections.abc import Callable

import trio

from egressd.sandbox.apiserver import discovery, rbac, reads, reviews, scale
from egressd.sandbox.apiserver.errors import (
    ApiError,
    method_not_allowed,
    not_found_path,
    unauthorized,
)
from egressd.sandbox.apiserver.faults import Faults
from egressd.sandbox.apiserver.registry import Registry
from egressd.sandbox.apiserver.resources import ResourceType
from egressd.sandbox.apiserver.respond import error_response, json_response, render_one
from egressd.sandbox.apiserver.routing import Target, meta_document, route
from egressd.sandbox.apiserver.store import Obj, Store
from egressd.sandbox.apiserver.verbs import Verbs
from egressd.sandbox.apiserver.watch import Watches, error_stream
from egressd.sandbox.apiserver.wire import Request, Response, Stream
from egressd.sandbox.apiserver.writes import Writer

log = logging.getLogger("egressd.sandbox.apiserver")

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_PUBLIC = ("/version", "/healthz", "/livez", "/readyz")


class ApiApp:
    """The API server's behaviour behind the transport."""

    def __init__(self, store: Store, faults: Faults, *, token: Callable[[], str],
                 now: Callable[[], datetime.datetime], address: Callable[[], str],
                 bookmark_interval: float) -> None:
        self.store = store
        self.faults = faults
        self._token = token
        self._now = now
        self._address = address
        self.authorizer: reviews.Authorizer = reviews.AllowAll()
        self.rbac: rbac.RbacAuthorizer | None = None
        # Bearer tokens other than the server's own: service-account tokens.
        self.tokens: dict[str, reviews.User] = {}
        self.registry = Registry()
        self.writer = Writer(store, self.registry, now=now)
        self.verbs = Verbs(self.writer, now=now)
        self.watches = Watches(store, faults, now=now, bookmark_interval=bookmark_interval)
        for name in DEFAULT_NAMESPACES:
            self.create_object(self.resource("", "v1", "namespaces"),
                               {"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": name}})

    @property
    def bookmark_interval(self) -> float:
        return self.watches.bookmark_interval

    @bookmark_interval.setter
    def bookmark_interval(self, seconds: float) -> None:
        self.watches.bookmark_interval = seconds

    # ----- resource types and direct access

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        return self.registry.resource(group, version, plural)

    def types(self) -> list[ResourceType]:
        return self.registry.types()

    def install_crd(self, crd: Obj) -> Obj:
        """Create (or replace) a CRD as `kubectl apply` would; returns the stored CRD."""
        rt = self.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        body = copy.deepcopy(crd)
        body.setdefault("apiVersion", "apiextensions.k8s.io/v1")
        body.setdefault("kind", "CustomResourceDefinition")
        old = self.store.get(rt.store_key, "", body["metadata"]["name"])
        if old is None:
            return self.create_object(rt, body)
        body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self.writer.write(rt, body, old, subresource=None, dry_run=False,
                                 field_validation="Ignore").obj

    def create_object(self, rt: ResourceType, body: Obj) -> Obj:
        """Create without a request (seeding, the sandbox); raises ApiError like POST."""
        return self.writer.create(rt, copy.deepcopy(body), dry_run=False,
                                  field_validation="Ignore").obj

    def delete_object(self, rt: ResourceType, old: Obj, *, dry_run: bool = False
                      ) -> tuple[Obj, int]:
        """Delete now (200), or mark for deletion while finalizers remain (202)."""
        return self.writer.delete(rt, old, dry_run=dry_run)

    # ----- entry point

    async def handle(self, request: Request) -> Response | Stream:
        try:
            return await self._handle(request)
        except ApiError as exc:
            return error_response(exc)
        except trio.Cancelled:
            raise
        except Exception as exc:  # a bug here must be a 500, never a dead server
            log.exception("request failed", extra={"method": request.method,
                                                   "path": request.path})
            return error_response(ApiError(500, "InternalError",
                                           f"Internal error occurred: {exc!r}"))

    def enable_rbac(self) -> rbac.RbacAuthorizer:
        """Authorize every request by the stored Roles, ClusterRoles and bindings."""
        self.rbac = rbac.RbacAuthorizer(self.store)
        self.authorizer = self.rbac
        return self.rbac

    def _user(self, request: Request) -> reviews.User | None:
        """The caller its bearer token names (None: no valid token, a 401)."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        token = given.strip().encode()
        found = reviews.ADMIN if hmac.compare_digest(token, self._token().encode()) else None
        for known, user in self.tokens.items():  # every one compared: constant time
            if hmac.compare_digest(token, known.encode()):
                found = user
        return found

    def _authorize(self, user: reviews.User, request: Request, target: Target | None,
                   parts: list[str], *, is_watch: bool) -> None:
        if self.rbac is None:
            return
        attributes = _attributes(request, target, parts, is_watch=is_watch)
        if not self.rbac.allowed(user, attributes)[0]:
            details = {"kind": attributes.resource, "group": attributes.group}
            if attributes.name:
                details["name"] = attributes.name
            raise ApiError(403, "Forbidden", rbac.forbidden_message(user, attributes),
                           details=details)

    async def _handle(self, request: Request) -> Response | Stream:
        path = request.path.rstrip("/") or "/"
        if path in _PUBLIC:
            return (json_response(200, discovery.VERSION) if path == "/version"
                    else Response(200, b"ok", content_type="text/plain"))
        user = self._user(request)
        if user is None:
            raise unauthorized()
        parts = [p for p in path.split("/") if p]
        target = route(parts, self.registry)
        is_watch = request.flag("watch")
        self._authorize(user, request, target, parts, is_watch=is_watch)
        fault = self.faults.take(request, resource=target.rt.plural if target else None,
                                 is_watch=is_watch)
        if fault is not None:
            error, rule = fault
            if is_watch and rule.as_watch_event:
                return error_stream(error)
            raise error
        if target is None:
            return self._meta_endpoint(parts, request)
        if target.name is None:
            return self._collection(target, request, is_watch=is_watch)
        return self._one(target, request, is_watch=is_watch)

    def _meta_endpoint(self, parts: list[str], request: Request) -> Response:
        document = meta_document(parts, self.registry, self._address)
        if document is None:  # an unknown path is a 404 whatever the verb, as on a cluster
            raise not_found_path("/" + "/".join(parts))
        if request.method != "GET":
            raise method_not_allowed(request.method)
        return json_response(200, document)

    def _collection(self, target: Target, request: Request, *, is_watch: bool
                    ) -> Response | Stream:
        method = request.method
        if method == "GET":
            if is_watch:
                return self.watches.open(target, request)
            return reads.list_objects(self.store, target, request, now=self._now())
        if method == "POST":
            if target.rt.namespaced and target.namespace is None:
                raise method_not_allowed(method)
            if target.rt.review:
                return reviews.answer(target.rt, request,
                                      user=self._user(request) or reviews.ADMIN,
                                      authorizer=self.authorizer)
            return self.verbs.create(target, request)
        if target.rt.review:
            raise method_not_allowed(method)
        if method == "DELETE":
            return self.verbs.delete_collection(target, request)
        raise method_not_allowed(method)

    def _one(self, target: Target, request: Request, *, is_watch: bool) -> Response | Stream:
        method = request.method
        if target.rt.review:
            raise method_not_allowed(method)
        if target.subresource == "scale" and not is_watch:
            return scale.handle(self.writer, target, request)
        if method == "GET":
            if is_watch:
                return self.watches.open(target, request)
            return render_one(target.rt, request, 200, reads.get(self.store, target),
                              now=self._now())
        if method == "PUT":
            return self.verbs.update(target, request)
        if method == "PATCH":
            return self.verbs.patch(target, request)
        if method == "DELETE" and target.subresource is None:
            return self.verbs.delete(target, request)
        raise method_not_allowed(method)


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def _attributes(request: Request, target: Target | None, parts: list[str], *,
                is_watch: bool) -> reviews.Attributes:
    """The request as RBAC sees it: verb, group, resource, namespace, name (or a path)."""
    if target is None:
        return reviews.Attributes(verb=request.method.lower(), path="/" + "/".join(parts))
    if request.method in _VERBS:
        verb = _VERBS[request.method]
    elif request.method == "DELETE":
        verb = "delete" if target.name else "deletecollection"
    elif is_watch:
        verb = "watch"
    else:
        verb = "get" if target.name else "list"
    return reviews.Attributes(verb=verb, group=target.rt.group, resource=target.rt.plural,
                              subresource=target.subresource or "",
                              namespace=target.namespace or "", name=target.name or "")
