"""The GCP provider: one Compute Engine VM per instance (docs/providers.md).

The VM's cloud-init (metadata `user-data`) installs the proxy; this module
only creates, reads, deletes and lists VMs through google-api-python-client
with Application Default Credentials (or a service-account key file).

The client library is blocking and httplib2 is not thread-safe, so every call
runs in `trio.to_thread.run_sync` behind a `CapacityLimiter`, with one
authorized HTTP object per worker thread passed as `execute(http=...)`.
Library errors are mapped to the provider error kinds once, in `gcperrors`;
the IDs, the insert body and the instance mapping are pure, in `gcpcompute`.

Importing this module loads the Google client libraries (~60 ms, ~12 MB); the
registry imports it only when a gcp provider is configured.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import google.auth
import google.auth.credentials
import google.auth.exceptions
import google_auth_httplib2
import httplib2
import trio
from google.oauth2 import service_account
from googleapiclient import discovery
from googleapiclient.errors import HttpError

from egressd.errors import ConfigError
from egressd.providers.config import GcpConfig
from egressd.providers.contract import CreateRequest, Instance
from egressd.providers.errors import (
    NotConfigured,
    NotFound,
    Permanent,
    Transient,
)
from egressd.providers.gcpcompute import (
    MAX_METADATA_VALUE_BYTES,
    NAME_RE,
    insert_body,
    instance_from_api,
    label_filter,
    parse_provider_id,
    provider_id,
    resolve_target,
)
from egressd.providers.gcperrors import (
    AlreadyExists,
    error_from_http,
    error_from_operation,
    redact,
)

log = logging.getLogger(__name__)

SCOPES = ("https://www.googleapis.com/auth/compute",)

# Worker threads per GCP provider: the calls are I/O-bound and short, and
# Compute Engine's per-project API rate limit makes more pointless.
DEFAULT_THREADS = 8
# Per HTTP request; also bounds how long a cancelled call keeps its thread.
HTTP_TIMEOUT = 30.0
# An insert's zone operation usually finishes in 10-30 s; past this deadline
# create returns the instance as it is (Provisioning) and the caller polls.
OPERATION_TIMEOUT = 90.0
OPERATION_POLL_INTERVAL = 2.0
LIST_PAGE_SIZE = 500


# --- the provider -----------------------------------------------------------


def _operation_get(compute: Any, *, project: str, zone: str, name: str) -> Any:
    return compute.zoneOperations().get(project=project, zone=zone, operation=name)


def _aggregated_list(compute: Any, *, project: str, query: str, page_size: int,
                     token: str | None) -> Any:
    return compute.instances().aggregatedList(
        project=project, filter=query, maxResults=page_size, pageToken=token)


def load_credentials(
    config: GcpConfig,
) -> tuple[google.auth.credentials.Credentials, str | None]:
    """Credentials and their project: the key file if configured, else ADC. Blocking.

    Raises `ConfigError` when there are none, so a missing credential stops
    the process at start rather than failing every call.
    """
    try:
        if config.credentials_file:
            creds = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                config.credentials_file, scopes=SCOPES)
            return creds, creds.project_id
        creds, project = google.auth.default(scopes=SCOPES)
        return creds, project
    except (google.auth.exceptions.GoogleAuthError, OSError, ValueError) as exc:
        raise ConfigError(f"no usable Google credentials: {exc}") from exc


class GcpProvider:
    """A `Provider` of Compute Engine VMs in one project (or the ADC project)."""

    def __init__(
        self,
        config: GcpConfig,
        *,
        credentials: google.auth.credentials.Credentials,
        project: str | None = None,
        api_endpoint: str | None = None,
        limiter: trio.CapacityLimiter | None = None,
        operation_timeout: float = OPERATION_TIMEOUT,
        operation_poll_interval: float = OPERATION_POLL_INTERVAL,
        page_size: int = LIST_PAGE_SIZE,
    ) -> None:
        self.config = config
        self.project = config.project or project
        self._credentials = credentials
        client_options = {"api_endpoint": api_endpoint} if api_endpoint else None
        # static_discovery: the discovery document ships with the library, so
        # building the client needs no network.
        self._compute = discovery.build(
            "compute", "v1", credentials=credentials, static_discovery=True,
            cache_discovery=False, client_options=client_options)
        self._limiter = limiter or trio.CapacityLimiter(DEFAULT_THREADS)
        self._local = threading.local()
        # Every thread's HTTP object, so close() can shut their keep-alive sockets.
        self._https: list[google_auth_httplib2.AuthorizedHttp] = []
        self._https_lock = threading.Lock()
        self._operation_timeout = operation_timeout
        self._poll_interval = operation_poll_interval
        self._page_size = page_size

    @classmethod
    def from_config(cls, config: GcpConfig, **kwargs: Any) -> GcpProvider:
        """Build with the configured credentials (key file or ADC). Blocking; `ConfigError`."""
        credentials, project = load_credentials(config)
        return cls(config, credentials=credentials, project=project, **kwargs)

    # -- threads

    def _http(self) -> google_auth_httplib2.AuthorizedHttp:
        # One per worker thread: httplib2 connections are not thread-safe.
        http = getattr(self._local, "http", None)
        if http is None:
            http = google_auth_httplib2.AuthorizedHttp(
                self._credentials, http=httplib2.Http(timeout=HTTP_TIMEOUT))
            self._local.http = http
            with self._https_lock:
                self._https.append(http)
        return http

    def close(self) -> None:
        """Close every worker thread's keep-alive connections (at shutdown, after the calls)."""
        with self._https_lock:
            https, self._https = self._https, []
        for http in https:
            http.close()

    def _execute(self, build: Callable[[Any], Any], what: str, secret: str) -> Any:
        """Run in a worker thread: build the request, execute it, map its errors."""
        try:
            return build(self._compute).execute(http=self._http(), num_retries=0)
        except HttpError as exc:
            raise error_from_http(exc, what, secret=secret) from exc
        except (OSError, httplib2.HttpLib2Error, google.auth.exceptions.GoogleAuthError,
                ValueError) as exc:
            raise Transient(f"{what}: {type(exc).__name__}: {redact(str(exc), secret)}") from exc

    async def _call(self, build: Callable[[Any], Any], what: str, *, secret: str = "") -> Any:
        # abandon_on_cancel: shutdown need not wait for a slow call; the thread
        # keeps its limiter token until the call ends (at most HTTP_TIMEOUT).
        return await trio.to_thread.run_sync(
            self._execute, build, what, secret, limiter=self._limiter, abandon_on_cancel=True)

    # -- the contract

    async def create(self, request: CreateRequest, /) -> Instance:
        if not NAME_RE.match(request.name):
            raise Permanent(f"name: {request.name!r} is not a valid Compute Engine name")
        size = len(request.cloud_init.encode())
        if size > MAX_METADATA_VALUE_BYTES:
            raise Permanent(f"cloud_init: {size} bytes is more than Compute Engine's "
                            f"{MAX_METADATA_VALUE_BYTES} per metadata value")
        target = resolve_target(self.config, request.placement, project=self.project)
        body = insert_body(self.config, request, target)
        pid = provider_id(target.project, target.zone, request.name)
        what = f"insert {pid}"
        try:
            op = await self._call(
                lambda c: c.instances().insert(project=target.project, zone=target.zone,
                                               body=body), what, secret=request.cloud_init)
            await self._wait(target.project, target.zone, op, what, secret=request.cloud_init)
        except AlreadyExists:
            # Idempotent by name: a synchronous 409, or an insert operation that
            # lost a race with another insert of the same name.
            log.info("instance %s already exists; adopting it", pid)
        except NotFound as exc:
            # The insert names no VM yet: a 404 is its project or zone missing.
            raise Permanent(f"{exc.message} (check gcp.project {target.project!r} and "
                            f"the zone {target.zone!r})") from exc
        try:
            return await self.get(pid)
        except NotFound as exc:
            # Accepted or adopted, then gone (deleted meanwhile): create again later.
            raise Transient(f"{what}: the instance vanished after the insert") from exc

    async def _wait(self, project: str, zone: str, op: Mapping[str, Any], what: str, *,
                    secret: str) -> None:
        """Poll the zone operation until DONE and raise its error; give up at the deadline."""
        with trio.move_on_after(self._operation_timeout):
            while op.get("status") != "DONE":
                await trio.sleep(self._poll_interval)
                name = str(op["name"])
                try:
                    op = await self._call(
                        functools.partial(_operation_get, project=project, zone=zone,
                                          name=name), f"{what}: operation {name}")
                except NotFound:
                    break  # operations expire; the instance itself tells the rest
        if op.get("status") != "DONE":
            log.info("%s: operation %s not followed to the end; polling the instance instead",
                     what, op.get("name"))
            return
        err = error_from_operation(op, what, secret=secret)
        if err is not None:
            raise err

    async def get(self, provider_id: str, /) -> Instance:
        project, zone, name = parse_provider_id(provider_id)
        body = await self._call(
            lambda c: c.instances().get(project=project, zone=zone, instance=name),
            f"get {provider_id}")
        return instance_from_api(project, body)

    async def delete(self, provider_id: str, /) -> None:
        try:
            project, zone, name = parse_provider_id(provider_id)
            what = f"delete {provider_id}"
            op = await self._call(
                lambda c: c.instances().delete(project=project, zone=zone, instance=name), what)
        except NotFound:
            return
        # Not waited on: once accepted, GCE finishes the deletion by itself,
        # and orphan GC catches the rare one that fails.
        if op.get("status") == "DONE" and (err := error_from_operation(op, what)) is not None:
            if isinstance(err, NotFound):
                return
            raise err

    async def list_by_labels(self, labels: Mapping[str, str], /) -> list[Instance]:
        project = self.project
        if not project:
            raise NotConfigured("gcp.project: no project configured and the credentials name none")
        query = label_filter(labels)
        found: list[Instance] = []
        token: str | None = None
        while True:
            page = await self._call(
                functools.partial(_aggregated_list, project=project, query=query,
                                  page_size=self._page_size, token=token),
                f"list instances in {project}")
            for scope in (page.get("items") or {}).values():
                for body in scope.get("instances") or ():
                    instance = instance_from_api(project, body)
                    # The server filtered already; checking again costs nothing
                    # and keeps GC safe if a filter is ever misread.
                    if all(instance.labels.get(k) == v for k, v in labels.items()):
                        found.append(instance)
            token = page.get("nextPageToken")
            if not token:
                return found
