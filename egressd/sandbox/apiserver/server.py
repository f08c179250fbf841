"""`FakeApiServer`: the pieces wired together and served over HTTPS in the caller's nursery.

    server = FakeApiServer(token="t0ken")
    url = await nursery.start(server.serve)      # https://127.0.0.1:PORT
    server.write_kubeconfig(path)                 # for kubectl and kube clients
    server.faults.fail_next(1, code=429, retry_after=2, resource="proxies")

Cancelling the nursery stops it at once (connections are cancelled, not drained).
"""

from __future__ import annotations

import copy
import datetime
import errno
import logging
import os
import secrets
import shutil
import ssl
import tempfile
import weakref
from collections.abc import Callable
from typing import Any

import trio

from egressd.sandbox.apiserver.app import ApiApp
from egressd.sandbox.apiserver.crd import pool_crd, proxy_crd
from egressd.sandbox.apiserver.errors import not_found
from egressd.sandbox.apiserver.faults import Faults
from egressd.sandbox.apiserver.rbac import RbacAuthorizer
from egressd.sandbox.apiserver.resources import ResourceType
from egressd.sandbox.apiserver.reviews import User
from egressd.sandbox.apiserver.store import Obj, Store
from egressd.sandbox.apiserver.tls import Identity, kubeconfig, write_private
from egressd.sandbox.apiserver.wire import serve_connection

log = logging.getLogger("egressd.sandbox.apiserver")


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class ServerNotRunning(RuntimeError):
    """Raised by a call that needs `serve()` to be running (faults on connections)."""


class FakeApiServer:
    """An in-process Kubernetes API server with real semantics (docs/architecture.md)."""

    def __init__(self, *, token: str | None = None, install_proxy_crd: bool = True,
                 crds: list[dict[str, Any]] | None = None, history_limit: int = 1000,
                 bookmark_interval: float = 60.0,
                 now: Callable[[], datetime.datetime] = _utcnow) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self._identity = Identity.generate()
        self.ca_pem: bytes = self._identity.ca_pem
        self._dir = tempfile.mkdtemp(prefix="egressd-apiserver-")
        weakref.finalize(self, shutil.rmtree, self._dir, True)
        self.ca_file = os.path.join(self._dir, "ca.pem")
        with open(self.ca_file, "wb") as handle:
            handle.write(self.ca_pem)
        self.url = ""
        self._port = 0
        self.store = Store(history_limit=history_limit)
        self.faults = Faults(self.store, refuse=self._refuse, rotate=self.rotate_token)
        self.app = ApiApp(self.store, self.faults, token=lambda: self.token, now=now,
                          address=lambda: f"127.0.0.1:{self._port}",
                          bookmark_interval=bookmark_interval)
        if install_proxy_crd:
            self.app.install_crd(proxy_crd())
            self.app.install_crd(pool_crd())
        for crd in crds or ():
            self.app.install_crd(crd)
        self._nursery: trio.Nursery | None = None
        self._listen_scope: trio.CancelScope | None = None
        self._listeners: list[trio.SocketListener] = []
        self.accepting = trio.Event()

    # ----- serving

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Listen on 127.0.0.1 (port 0 the first time) and serve until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await nursery.start(self._listen)
                self.url = f"https://127.0.0.1:{self._port}"
                log.info("fake API server listening", extra={"url": self.url})
                task_status.started(self.url)
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def _listen(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                      ) -> None:
        listeners = await trio.open_tcp_listeners(self._port, host="127.0.0.1")
        self._port = listeners[0].socket.getsockname()[1]
        self._listeners = listeners
        try:
            with trio.CancelScope() as scope:
                self._listen_scope = scope
                async with trio.open_nursery() as connections:
                    for listener in listeners:
                        connections.start_soon(self._accept, listener, connections)
                    self.accepting.set()
                    task_status.started()
        finally:
            for listener in listeners:
                listener.socket.close()

    async def _accept(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        context = self._identity.server_context
        while True:
            try:
                stream = await listener.accept()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    await trio.sleep(0.1)
                    continue
                raise
            connections.start_soon(serve_connection, stream, context, self.app.handle)

    def _refuse(self, seconds: float) -> None:
        if self._nursery is None or self._listen_scope is None:
            raise ServerNotRunning("refuse_connections needs a serving FakeApiServer")
        for listener in self._listeners:
            listener.socket.close()  # refused from now on, not at the next checkpoint
        self._listen_scope.cancel()
        self.accepting = trio.Event()

        async def reopen() -> None:
            await trio.sleep(seconds)
            await self._listen()

        self._nursery.start_soon(reopen)

    # ----- credentials

    def rotate_token(self) -> str:
        """Switch to a new token; the old one is refused (401) from now on."""
        self.token = secrets.token_urlsafe(24)
        return self.token

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token that authenticates as ServiceAccount `namespace/name`."""
        token = secrets.token_urlsafe(24)
        self.app.tokens[token] = User(
            f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
             "system:authenticated"))
        return token

    def enable_rbac(self) -> RbacAuthorizer:
        """Authorize requests by the stored RBAC objects (the server's own token stays a
        cluster admin); the returned authorizer knows which grants were used."""
        return self.app.enable_rbac()

    def client_ssl_context(self) -> ssl.SSLContext:
        """An SSLContext trusting this server's CA."""
        return self._identity.client_context()

    def kubeconfig_text(self, *, token: str | None = None, context: str = "sandbox") -> str:
        if not self.url:
            raise ServerNotRunning("the kubeconfig needs the URL: start serve() first")
        return kubeconfig(server=self.url, ca_pem=self.ca_pem, token=token or self.token,
                          context=context)

    def write_kubeconfig(self, path: str | os.PathLike[str], *, token: str | None = None,
                         context: str = "sandbox") -> str:
        """Write a kubeconfig for this server (mode 0600); returns its path."""
        write_private(os.fspath(path), self.kubeconfig_text(token=token, context=context))
        return os.fspath(path)

    # ----- direct access (seeding objects, assertions) without HTTP

    def resource_for(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        for rt in self.app.types():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        raise KeyError(f"no resource serves {kind} in {api_version}")

    def create(self, obj: Obj) -> Obj:
        """Create an object as a POST would (same defaults and validation)."""
        rt = self.resource_for(obj["apiVersion"], obj["kind"])
        body = copy.deepcopy(obj)
        if rt.namespaced:
            body.setdefault("metadata", {}).setdefault("namespace", "default")
        return self.app.create_object(rt, body)

    def get(self, api_version: str, kind: str, name: str, *, namespace: str = "") -> Obj | None:
        rt = self.resource_for(api_version, kind)
        return self.store.get(rt.store_key, namespace if rt.namespaced else "", name)

    def list(self, api_version: str, kind: str, *, namespace: str | None = None) -> list[Obj]:
        rt = self.resource_for(api_version, kind)
        return [copy.deepcopy(o) for o in self.store.items(rt.store_key, namespace)]

    def delete(self, api_version: str, kind: str, name: str, *, namespace: str = "") -> Obj:
        rt = self.resource_for(api_version, kind)
        old = self.store.get(rt.store_key, namespace if rt.namespaced else "", name)
        if old is None:
            raise not_found(rt.plural, rt.group, name)
        return self.app.delete_object(rt, old)[0]

    def install_crd(self, crd: Obj) -> Obj:
        return self.app.install_crd(crd)

    def compact(self) -> None:
        """Drop the watch history: resuming from any earlier version answers 410."""
        self.store.compact()

    @property
    def resource_version(self) -> int:
        return self.store.resource_version

    def watch_count(self, resource: str | None = None) -> int:
        """Open watch streams (of one resource plural, or all)."""
        return len(self.store.watchers(resource))

    async def wait_for_watchers(self, resource: str | None = None, count: int = 1) -> None:
        """Return once at least `count` watches of `resource` are open (test ordering)."""
        while self.watch_count(resource) < count:
            await self.store.wait_changed()
