"""The GCP provider: one Compute Engine VM per instance (docs/providers.md).

The VM's cloud-init (metadata `user-data`) installs the proxy; this module
only creates, reads, deletes and lists VMs through google-api-python-client
with Application Default Credentials (or a service-account key file).

The client library is blocking and httplib2 is not thread-safe, so every call
runs in `trio.to_thread.run_sync` behind a `CapacityLimiter`, with one
authorized HTTP object per worker thread passed as `execute(http=...)`.
Library errors are mapped to the provider error kinds here, once.

Importing this module loads the Google client libraries (~60 ms, ~12 MB); the
registry imports it only when a gcp provider is configured.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import attrs
import google.auth
import google.auth.credentials
import google.auth.exceptions
import google_auth_httplib2
import httplib2
import trio
from google.oauth2 import service_account
from googleapiclient import discovery
from googleapiclient.errors import HttpError

from egressd import timestamps
from egressd.errors import ConfigError
from egressd.providers.config import REGION_RE, ZONE_RE, GcpConfig
from egressd.providers.contract import CreateRequest, Instance, InstanceState, Placement
from egressd.providers.errors import (
    QUOTA_RETRY_AFTER,
    NotConfigured,
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
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

# Compute Engine resource names (RFC 1035 labels).
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_MACHINE_TYPE_RE = re.compile(r"^[a-z0-9][-a-z0-9]*$")
_LABEL_RE = re.compile(r"^[a-z0-9_-]{0,63}$")

# Error reasons (HTTP errors' `errors[].reason` and `details[].reason`,
# operations' `errors[].code`) meaning "out of quota or capacity": retry in
# 5 min, not in a second (docs/providers.md). A resource quota answers 403 quotaExceeded
# ("Quota 'CPUS' exceeded") or an insert operation fails with QUOTA_EXCEEDED;
# a stock-out fails the operation with ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]
# (httpErrorStatusCode 503).
_QUOTA_REASONS = frozenset({
    "quotaExceeded", "QUOTA_EXCEEDED", "dailyLimitExceeded", "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
})
# The API's per-minute request limits: 403 rateLimitExceeded ("Quota exceeded
# for quota group 'ReadGroup' and limit 'Read requests per 100 seconds'") or
# 429 RESOURCE_EXHAUSTED with reason rateLimitExceeded. The window is a minute
# or so, so these are transient (docs/providers.md: 429 → transient), not a 5-min quota.
_RATE_REASONS = frozenset({
    "rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED",
    "RESOURCE_OPERATION_RATE_EXCEEDED",
})
# The gRPC-style `error.status` for either of the above; alone (no reason we
# know) it is taken as a quota unless the answer was a 429.
_RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
# 400 resourceNotReady: the VM is mid-operation (a delete while its insert
# still runs). It clears by itself, so it is transient, not a bad request.
_NOT_READY_REASONS = frozenset({"resourceNotReady", "RESOURCE_NOT_READY"})
_ALREADY_EXISTS = frozenset({"alreadyExists", "RESOURCE_ALREADY_EXISTS"})

# Compute Engine refuses a metadata value over 256 KiB.
MAX_METADATA_VALUE_BYTES = 256 * 1024
# Lines of a cloud-init shorter than this are not redacted from error
# messages: they are too common ("runcmd:") to be worth mangling a message for.
_MIN_REDACTED_LINE = 6
REDACTED = "<cloud-init redacted>"

# Every status of compute v1's Instance.status enum; one added later (and so
# unknown here) maps to Provisioning: poll again, do not replace.
STATES = {
    # PENDING: a Flex Start VM waiting for capacity.
    "PENDING": InstanceState.PROVISIONING,
    "PROVISIONING": InstanceState.PROVISIONING,
    "STAGING": InstanceState.PROVISIONING,
    # REPAIRING: the host failed and GCE is moving the VM; it comes back.
    "REPAIRING": InstanceState.PROVISIONING,
    "RUNNING": InstanceState.RUNNING,
    "PENDING_STOP": InstanceState.STOPPED,
    "STOPPING": InstanceState.STOPPED,
    # DEPROVISIONING: halted, its IP and disks being released (stop or delete).
    "DEPROVISIONING": InstanceState.STOPPED,
    "STOPPED": InstanceState.STOPPED,
    "SUSPENDING": InstanceState.STOPPED,
    "SUSPENDED": InstanceState.STOPPED,
    "TERMINATED": InstanceState.TERMINATED,
}


class _AlreadyExists(ProviderError):
    """Insert of a name that exists: create adopts it (never leaves this module)."""


# --- pure functions ---------------------------------------------------------


def provider_id(project: str, zone: str, name: str) -> str:
    """`<project>/<zone>/<name>`: everything get and delete need, with no lookup."""
    return f"{project}/{zone}/{name}"


def parse_provider_id(value: str) -> tuple[str, str, str]:
    """(project, zone, name) of a provider ID; `NotFound` if it cannot name a VM."""
    parts = value.split("/")
    if len(parts) != 3 or not all(parts) or not ZONE_RE.match(parts[1]):
        # No VM of this provider can have such an ID (it may be another provider's).
        raise NotFound(f"{value!r} is not a GCP provider ID (<project>/<zone>/<name>)")
    return parts[0], parts[1], parts[2]


@attrs.frozen
class Target:
    """Where a create goes once the config's defaults and the Placement are merged."""

    project: str
    zone: str
    machine_type: str


def resolve_target(config: GcpConfig, placement: Placement, *, project: str | None) -> Target:
    """Merge the Placement over the config; `Permanent`, naming the field, if it cannot be met.

    `project` is the config's project or else the credentials' project.
    """
    if not project:
        raise NotConfigured("gcp.project: no project configured and the credentials name none")
    zone = placement.zone or config.zone
    if not ZONE_RE.match(zone):
        field = "placement.zone" if placement.zone else "gcp.zone"
        raise Permanent(f"{field}: {zone!r} is not a Compute Engine zone (like europe-west1-b)")
    if placement.region:
        if not REGION_RE.match(placement.region):
            raise Permanent(f"placement.region: {placement.region!r} is not a Compute Engine "
                            "region (like europe-west1)")
        if zone.rsplit("-", 1)[0] != placement.region:
            raise Permanent(f"placement.region: zone {zone!r} is not in region "
                            f"{placement.region!r}; set placement.zone to a zone of that region")
    machine_type = placement.machine_type or config.machine_type
    if "/" not in machine_type and not _MACHINE_TYPE_RE.match(machine_type):
        field = "placement.machineType" if placement.machine_type else "gcp.machineType"
        raise Permanent(f"{field}: {machine_type!r} is not a machine type (like e2-micro)")
    return Target(project=project, zone=zone, machine_type=machine_type)


def _network_url(value: str, kind: str) -> str:
    # A bare name is a network of the VM's project; anything with a slash is a
    # partial or full URL and goes through unchanged (shared VPC).
    return value if "/" in value else f"{kind}/{value}"


def insert_body(config: GcpConfig, request: CreateRequest, target: Target) -> dict[str, Any]:
    """The `instances.insert` body for `request` (pure; docs/providers.md).

    One NIC with a one-to-one NAT access config (the external egress IP), the
    cloud-init as `user-data` metadata, the GC labels and the network tags.
    No service account: a proxy needs no Google API access.
    """
    machine_type = (target.machine_type if "/" in target.machine_type
                    else f"zones/{target.zone}/machineTypes/{target.machine_type}")
    nic: dict[str, Any] = {
        "network": _network_url(config.network, "global/networks"),
        "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
    }
    if config.subnetwork:
        region = target.zone.rsplit("-", 1)[0]
        nic["subnetwork"] = _network_url(config.subnetwork, f"regions/{region}/subnetworks")
    body: dict[str, Any] = {
        "name": request.name,
        "machineType": machine_type,
        "disks": [{
            "boot": True,
            "autoDelete": True,
            "initializeParams": {"sourceImage": config.image},
        }],
        "networkInterfaces": [nic],
        "metadata": {"items": [{"key": "user-data", "value": request.cloud_init}]},
        "labels": dict(request.labels),
    }
    if config.network_tags:
        body["tags"] = {"items": list(config.network_tags)}
    return body


def instance_state(status: str, nat_ip: str | None) -> InstanceState:
    """docs/providers.md's mapping; RUNNING without a NAT IP is still Provisioning."""
    state = STATES.get(status, InstanceState.PROVISIONING)
    if state is InstanceState.RUNNING and not nat_ip:
        return InstanceState.PROVISIONING
    return state


def instance_from_api(project: str, body: Mapping[str, Any]) -> Instance:
    """An `Instance` from a Compute Engine instance resource."""
    zone = str(body.get("zone", "")).rsplit("/", 1)[-1]
    nat_ip: str | None = None
    for nic in body.get("networkInterfaces") or ():
        for access in nic.get("accessConfigs") or ():
            nat_ip = nat_ip or access.get("natIP") or None
    created = body.get("creationTimestamp")
    created_at = timestamps.parse_time(created) if created else datetime.now(UTC)
    state = instance_state(str(body.get("status", "")), nat_ip)
    return Instance(
        provider_id=provider_id(project, zone, body["name"]),
        name=body["name"],
        state=state,
        ip=nat_ip,
        created_at=created_at,
        labels=body.get("labels") or {},
    )


def label_filter(labels: Mapping[str, str]) -> str:
    """A list `filter` matching every label: `(labels.k = "v") (labels.k2 = "v2")` (AND)."""
    for key, value in labels.items():
        if not _LABEL_RE.match(key) or not key or not _LABEL_RE.match(value):
            raise Permanent(f"labels: {key!r}={value!r} is not a valid GCP label")
    return " ".join(f'(labels.{k} = "{v}")' for k, v in sorted(labels.items()))


# --- error mapping ----------------------------------------------------------


def classify(status: int, reasons: set[str], message: str, *,
             retry_after: float | None = None) -> ProviderError:
    """The provider error for an HTTP status and the error reasons Google sent."""
    if reasons & _QUOTA_REASONS:
        return QuotaExceeded(message, retry_after=max(retry_after or 0.0, QUOTA_RETRY_AFTER))
    if status == 429 or reasons & _RATE_REASONS:
        return Transient(message, retry_after=retry_after)
    if _RESOURCE_EXHAUSTED in reasons:
        return QuotaExceeded(message, retry_after=max(retry_after or 0.0, QUOTA_RETRY_AFTER))
    if status == 404:
        return NotFound(message)
    if status == 409 and reasons & _ALREADY_EXISTS:
        return _AlreadyExists(message)
    if reasons & _NOT_READY_REASONS:
        return Transient(message, retry_after=retry_after)
    # 401: google-auth refreshes tokens itself, so one that still fails is a
    # metadata-server or clock hiccup more often than a revoked key.
    if status in (401, 408, 409, 412, 429) or status >= 500:
        return Transient(message, retry_after=retry_after)
    if status == 403:
        # Permission denied or the API not enabled: the daemon's credentials or
        # project are at fault, not the request.
        return NotConfigured(message)
    if 400 <= status < 500:
        return Permanent(message)
    return Transient(message)


def _retry_after(resp: Any) -> float | None:
    try:
        value = resp.get("retry-after")
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


# "Invalid value for field 'resource.metadata': '<the value>'. <why>"
_METADATA_VALUE = re.compile(r"(field '[^']*metadata[^']*'): '.*'", re.DOTALL)


def redact(text: str, secret: str) -> str:
    """`text` with every trace of `secret` (a cloud-init) replaced (docs/reference.md).

    Compute Engine echoes an invalid field's value in its message ("Invalid
    value for field 'resource.metadata': '...'"), raw or JSON-escaped and
    perhaps cut short, so the whole text, its escaped forms and each of its
    lines are replaced, and a quoted metadata value is dropped whatever it holds.
    """
    if not secret:
        return text
    text = _METADATA_VALUE.sub(rf"\1: '{REDACTED}'", text)
    pieces = {secret, *(line.strip() for line in secret.splitlines())}
    forms: set[str] = set()
    for piece in pieces:
        if len(piece) < _MIN_REDACTED_LINE:
            continue
        forms.update({piece, json.dumps(piece)[1:-1],
                      json.dumps(piece, ensure_ascii=False)[1:-1]})
        forms.add(json.dumps(piece, ensure_ascii=False)[1:-1].replace("'", "\\'"))
    for form in sorted(forms, key=len, reverse=True):  # longest first: whole before lines
        text = text.replace(form, REDACTED)
    return text



def error_from_http(exc: HttpError, what: str, *, secret: str = "") -> ProviderError:
    """Map a client library `HttpError`: status plus the reasons in `error`.

    `secret` (the cloud-init of an insert) is redacted from the message and,
    if it was there, from `exc` itself, which stays attached as the cause.
    """
    status = int(getattr(exc.resp, "status", 0) or 0)
    reasons: set[str] = set()
    message = ""
    try:
        error = json.loads(exc.content.decode("utf-8")).get("error", {})
        message = str(error.get("message", ""))
        entries = [*(error.get("errors") or ()), *(error.get("details") or ())]
        reasons = {str(e.get("reason", "")) for e in entries if isinstance(e, dict)}
        if error.get("status"):
            reasons.add(str(error["status"]))
    except (ValueError, AttributeError, TypeError):
        pass
    reasons.discard("")
    clean = redact(message, secret)
    body = exc.content.decode("utf-8", "replace")
    if secret and redact(body, secret) != body:
        # The HttpError's str() (printed with any traceback) holds the body.
        exc.content = json.dumps({"error": {"code": status, "message": clean, "errors": [
            {"reason": r} for r in sorted(reasons)]}}).encode()
        exc.reason = clean
        exc.error_details = ""
    text = f"{what}: HTTP {status}" + (f": {clean}" if clean else "")
    return classify(status, reasons, text, retry_after=_retry_after(exc.resp))


def error_from_operation(op: Mapping[str, Any], what: str, *,
                         secret: str = "") -> ProviderError | None:
    """The error a finished zone operation carries, or None if it succeeded."""
    errors = (op.get("error") or {}).get("errors") or ()
    if not errors:
        return None
    codes = {str(e.get("code", "")) for e in errors}
    messages = "; ".join(str(e.get("message", e.get("code", ""))) for e in errors)
    status = int(op.get("httpErrorStatusCode") or 400)
    err = classify(status, codes, f"{what}: {redact(messages, secret)}")
    if isinstance(err, NotFound):
        # The operation's subject exists; a 404 here is a missing image,
        # network or machine type the request refers to.
        return Permanent(err.message)
    return err


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
        if not _NAME_RE.match(request.name):
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
        except _AlreadyExists:
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
