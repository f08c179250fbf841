"""A fake Compute Engine REST API over real HTTP on 127.0.0.1, for the GCP provider's tests.

It speaks just enough of compute/v1 for the real google-api-python-client:
instances insert / get / delete / list, aggregated list with a label
`filter` and paging, zone operations get / wait, and Google-style error
bodies. Like the real API, a delete while the VM's insert operation is still
running is refused with 400 resourceNotReady. Tests steer it directly:
`start()` a VM (RUNNING with a NAT IP), `set_status()`, hold operations
RUNNING, fail the next insert operation, or `inject()` an HTTP error (403
quota, 429 RESOURCE_EXHAUSTED, 500, or a 400 that echoes the metadata the
way Compute Engine echoes an invalid field's value) for matching requests.
Every request is recorded in `requests`, with the TCP connection it came on.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import attrs
import h11
import trio

PREFIX = "/compute/v1/"
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_FILTER_TERM = re.compile(r'\(\s*labels\.([a-z0-9_-]+)\s*=\s*"([^"]*)"\s*\)')


@attrs.frozen
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    query: Mapping[str, str]
    body: Any
    connection: int


@attrs.define
class Fault:
    """An error answer for the next `times` requests matching `method` and `path_re`."""

    status: int
    reason: str
    message: str
    method: str | None
    path_re: re.Pattern[str] | None
    times: int
    retry_after: int | None
    # The gRPC-style `error.status` newer Google front ends add (RESOURCE_EXHAUSTED).
    status_text: str | None = None
    # Append "Invalid value for field 'resource.metadata': '<the request's metadata>'".
    echo_metadata: bool = False


@attrs.define
class FakeCompute:
    """The fake's whole state; `serve` runs it, `endpoint` is what the client is pointed at."""

    port: int = 0
    instances: dict[tuple[str, str, str], dict[str, Any]] = attrs.field(factory=dict)
    operations: dict[tuple[str, str, str], dict[str, Any]] = attrs.field(factory=dict)
    requests: list[Recorded] = attrs.field(factory=list)
    faults: list[Fault] = attrs.field(factory=list)
    # False: operations stay RUNNING until `finish_operations()`.
    auto_finish: bool = True
    # Set: the next insert's operation fails with these `errors` (no instance is made).
    insert_operation_error: dict[str, Any] | None = None
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    _connections: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    _arrived: trio.Event = attrs.field(factory=trio.Event)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}{PREFIX}"

    # -- steering

    def inject(self, status: int, reason: str, *, message: str = "injected",
               method: str | None = None, path: str | None = None, times: int = 1,
               retry_after: int | None = None, status_text: str | None = None,
               echo_metadata: bool = False) -> None:
        """Answer the next `times` matching requests with a Google-style error."""
        self.faults.append(Fault(status, reason, message, method,
                                 re.compile(path) if path else None, times, retry_after,
                                 status_text, echo_metadata))

    def instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        return self.instances[(project, zone, name)]

    def set_status(self, project: str, zone: str, name: str, status: str,
                   nat_ip: str | None = None) -> None:
        body = self.instance(project, zone, name)
        body["status"] = status
        access = body["networkInterfaces"][0]["accessConfigs"][0]
        if nat_ip:
            access["natIP"] = nat_ip
        else:
            access.pop("natIP", None)

    def start(self, project: str, zone: str, name: str) -> str:
        """Make the VM RUNNING with a fresh external IP; return the IP."""
        ip = f"203.0.113.{next(self._ids) % 250 + 1}"
        self.set_status(project, zone, name, "RUNNING", ip)
        return ip

    def add_instance(self, project: str, zone: str, body: dict[str, Any]) -> None:
        """Make an instance as if another client had inserted it (its operation DONE)."""
        status, _, op = self._insert(project, zone, body)
        assert status == 200, op
        op["status"] = "DONE"

    def finish_operations(self) -> None:
        for op in self.operations.values():
            op["status"] = "DONE"

    def count(self, method: str, path_re: str) -> int:
        pattern = re.compile(path_re)
        return sum(1 for r in self.requests if r.method == method and pattern.search(r.path))

    async def wait_for(self, method: str, path_re: str, *, count: int = 1) -> None:
        """Return once `count` requests matching `method` and `path_re` have arrived."""
        while self.count(method, path_re) < count:
            await self._arrived.wait()

    # -- serving

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._connection, listeners)
            task_status.started(self.port)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        connection = next(self._connections)
        try:
            while True:
                request: h11.Request | None = None
                body = b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                assert request is not None
                status, headers, payload = self._handle(
                    request.method.decode(), request.target.decode(), body, connection)
                data = json.dumps(payload).encode()
                await stream.send_all(conn.send(h11.Response(status_code=status, headers=[
                    ("content-type", "application/json; charset=UTF-8"),
                    ("content-length", str(len(data))), *headers])))
                await stream.send_all(conn.send(h11.Data(data=data)))
                await stream.send_all(conn.send(h11.EndOfMessage()))
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, h11.RemoteProtocolError):
            return
        finally:
            await stream.aclose()

    # -- the API

    def _injected(self, method: str, path: str,
                  body: Any) -> tuple[int, list[tuple[str, str]], Any] | None:
        """The answer of the first armed fault matching the request (None: no fault)."""
        for fault in self.faults:
            if (fault.times > 0 and (fault.method is None or fault.method == method)
                    and (fault.path_re is None or fault.path_re.search(path))):
                fault.times -= 1
                headers = [("retry-after", str(fault.retry_after))] if fault.retry_after else []
                message = fault.message
                if fault.echo_metadata and isinstance(body, dict):
                    # Compute Engine's wording, with the value rendered as it does.
                    message = (f"Invalid value for field 'resource.metadata': "
                               f"'{json.dumps(body.get('metadata'), indent=2)}'. {message}")
                error = _error(fault.status, fault.reason, message)
                if fault.status_text:
                    error["error"]["status"] = fault.status_text
                return fault.status, headers, error
        return None

    def _handle(self, method: str, target: str, raw: bytes,
                connection: int) -> tuple[int, list[tuple[str, str]], Any]:
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = json.loads(raw) if raw else None
        self.requests.append(Recorded(method, url.path, query, body, connection))
        self._arrived.set()
        self._arrived = trio.Event()
        injected = self._injected(method, url.path, body)
        if injected is not None:
            return injected
        if not url.path.startswith(PREFIX):
            return 404, [], _error(404, "notFound", f"no route {url.path}")
        parts = url.path[len(PREFIX):].strip("/").split("/")
        match parts, method:
            case ["projects", p, "zones", z, "instances"], "POST":
                return self._insert(p, z, body)
            case ["projects", p, "zones", z, "instances"], "GET":
                return self._list(p, query, zone=z)
            case ["projects", p, "zones", z, "instances", n], "GET":
                if (p, z, n) not in self.instances:
                    return _not_found(f"projects/{p}/zones/{z}/instances/{n}")
                return 200, [], self.instances[(p, z, n)]
            case ["projects", p, "zones", z, "instances", n], "DELETE":
                return self._delete(p, z, n)
            case ["projects", p, "aggregated", "instances"], "GET":
                return self._list(p, query, zone=None)
            case ["projects", p, "zones", z, "operations", o], "GET":
                return self._get_operation(p, z, o)
            case ["projects", p, "zones", z, "operations", o, "wait"], "POST":
                return self._get_operation(p, z, o)
        return 404, [], _error(404, "notFound", f"no route {method} {url.path}")

    def _delete(self, p: str, z: str, n: str) -> tuple[int, list[tuple[str, str]], Any]:
        if (p, z, n) not in self.instances:
            return _not_found(f"projects/{p}/zones/{z}/instances/{n}")
        if self._pending_insert(p, z, n):
            return 400, [], _error(400, "resourceNotReady", f"The resource 'projects/"
                                   f"{p}/zones/{z}/instances/{n}' is not ready")
        del self.instances[(p, z, n)]
        return 200, [], self._operation(p, z, "delete", n)

    def _insert(self, project: str, zone: str, body: Any) -> tuple[int, list[tuple[str, str]],
                                                                    Any]:
        if not isinstance(body, dict):
            return 400, [], _error(400, "required", "Required field 'resource' not specified")
        name = body.get("name", "")
        if not _NAME_RE.match(name):
            return 400, [], _error(400, "invalid", f"Invalid value for field 'resource.name': "
                                   f"'{name}'")
        for field in ("machineType", "disks", "networkInterfaces"):
            if field not in body:
                return 400, [], _error(400, "required", f"Required field '{field}' not specified")
        if (project, zone, name) in self.instances:
            return 409, [], _error(409, "alreadyExists",
                                   f"The resource 'projects/{project}/zones/{zone}/instances/"
                                   f"{name}' already exists")
        op = self._operation(project, zone, "insert", name)
        if self.insert_operation_error is not None:
            op["error"] = {"errors": self.insert_operation_error["errors"]}
            op["httpErrorStatusCode"] = self.insert_operation_error.get("httpErrorStatusCode", 403)
            op["status"] = "DONE" if self.auto_finish else "RUNNING"
            self.insert_operation_error = None
            return 200, [], op
        nics = json.loads(json.dumps(body["networkInterfaces"]))
        self.instances[(project, zone, name)] = {
            **body,
            "kind": "compute#instance",
            "id": str(next(self._ids)),
            "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
            "status": "PROVISIONING",
            "networkInterfaces": nics,
            "creationTimestamp": datetime.now(UTC).astimezone().isoformat(timespec="milliseconds"),
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}"
                        f"/instances/{name}",
        }
        return 200, [], op

    def _operation(self, project: str, zone: str, kind: str, name: str) -> dict[str, Any]:
        op_name = f"operation-{next(self._ids)}-{kind}"
        op = {
            "kind": "compute#operation",
            "name": op_name,
            "operationType": kind,
            "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
            "targetLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}"
                          f"/instances/{name}",
            "status": "DONE" if self.auto_finish else "RUNNING",
        }
        self.operations[(project, zone, op_name)] = op
        return op

    def _pending_insert(self, project: str, zone: str, name: str) -> bool:
        target = (f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}"
                  f"/instances/{name}")
        return any(op["operationType"] == "insert" and op["targetLink"] == target
                   and op["status"] != "DONE" for op in self.operations.values())

    def _get_operation(self, project: str, zone: str,
                       name: str) -> tuple[int, list[tuple[str, str]], Any]:
        op = self.operations.get((project, zone, name))
        if op is None:
            return _not_found(f"projects/{project}/zones/{zone}/operations/{name}")
        return 200, [], op

    def _list(self, project: str, query: Mapping[str, str],
              zone: str | None) -> tuple[int, list[tuple[str, str]], Any]:
        wanted: dict[str, str] = {}
        text = query.get("filter", "").strip()
        if text:
            terms = _FILTER_TERM.findall(text)
            if not terms or _FILTER_TERM.sub("", text).replace("AND", "").strip():
                return 400, [], _error(400, "invalid", f"Invalid list filter expression '{text}'")
            wanted = dict(terms)
        matches = [
            body for (p, z, _), body in sorted(self.instances.items())
            if p == project and (zone is None or z == zone)
            and all((body.get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]
        size = int(query.get("maxResults", "500"))
        start = int(query.get("pageToken", "0") or "0")
        page = matches[start:start + size]
        answer: dict[str, Any] = {}
        if start + size < len(matches):
            answer["nextPageToken"] = str(start + size)
        if zone is not None:
            answer.update(kind="compute#instanceList", items=page)
            return 200, [], answer
        items: dict[str, Any] = {
            # A zone with nothing to show, as the real API sends it.
            "zones/us-east1-b": {"warning": {"code": "NO_RESULTS_ON_PAGE",
                                             "message": "There are no results for scope"}},
        }
        for body in page:
            scope = "zones/" + body["zone"].rsplit("/", 1)[-1]
            items.setdefault(scope, {}).setdefault("instances", []).append(body)
        answer.update(kind="compute#instanceAggregatedList", items=items)
        return 200, [], answer


def _error(status: int, reason: str, message: str) -> dict[str, Any]:
    domain = "usageLimits" if reason in ("quotaExceeded", "rateLimitExceeded") else "global"
    return {"error": {"code": status, "message": message,
                      "errors": [{"message": message, "domain": domain, "reason": reason}]}}


def _not_found(resource: str) -> tuple[int, list[tuple[str, str]], Any]:
    return 404, [], _error(404, "notFound", f"The resource '{resource}' was not found")
