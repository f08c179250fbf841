"""The GCP provider, end to end through the real google-api-python-client.

The client library talks real HTTP to the fake Compute Engine server
(tests/providers/fake_compute.py) on 127.0.0.1; nothing in the client is
patched. The blocking calls run in worker threads while the fake answers on
the trio loop, so a call that blocked the loop would deadlock these tests.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import googleapiclient
import pytest
import trio
from google.auth.credentials import AnonymousCredentials

from egressd.providers import (
    CreateRequest,
    InstanceState,
    NotConfigured,
    NotFound,
    Permanent,
    Placement,
    QuotaExceeded,
    Transient,
    gc_labels,
    is_transient,
)
from egressd.providers.config import GcpConfig
from egressd.providers.gcp import GcpProvider
from egressd.providers.gcpcompute import (
    STATES,
    insert_body,
    instance_from_api,
    instance_state,
    label_filter,
    parse_provider_id,
    resolve_target,
)
from egressd.providers.gcperrors import error_from_operation, redact
from tests.providers.conftest import PROJECT, ZONE
from tests.providers.fake_compute import FakeCompute

LABELS = gc_labels(cluster="prod", proxy_uid="0f7c-uid", namespace="crawl", name="eu-1")
CLOUD_INIT = "#cloud-config\npackages: [squid]\n"


def request(name: str = "px-abcdefghijklmnop", **kw: object) -> CreateRequest:
    return CreateRequest(name=name, cloud_init=CLOUD_INIT, port=3128, labels=LABELS, **kw)  # type: ignore[arg-type]


# --- pure parts --------------------------------------------------------------


def test_insert_body_has_everything_spec_4_lists(gcp_config: GcpConfig) -> None:
    target = resolve_target(gcp_config, Placement(), project=PROJECT)
    body = insert_body(gcp_config, request(), target)
    assert body == {
        "name": "px-abcdefghijklmnop",
        "machineType": "zones/europe-west1-b/machineTypes/e2-micro",
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
            "sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"}}],
        "networkInterfaces": [{
            "network": "global/networks/default",
            "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
        }],
        "metadata": {"items": [{"key": "user-data", "value": CLOUD_INIT}]},
        "labels": LABELS,
        "tags": {"items": ["egressd-proxy"]},
    }


def test_insert_body_placement_subnetwork_and_urls(gcp_config: GcpConfig) -> None:
    config = GcpConfig(project=PROJECT, zone=ZONE, machine_type="e2-micro", image="img",
                       network="projects/host/global/networks/shared", subnetwork="proxies")
    target = resolve_target(config, Placement(zone="us-central1-a", machine_type="n2-standard-2"),
                            project=PROJECT)
    body = insert_body(config, request(), target)
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n2-standard-2"
    assert body["networkInterfaces"][0]["network"] == "projects/host/global/networks/shared"
    assert body["networkInterfaces"][0]["subnetwork"] == "regions/us-central1/subnetworks/proxies"
    assert "tags" not in body


@pytest.mark.parametrize(("placement", "project", "field"), [
    (Placement(zone="europe"), PROJECT, "placement.zone"),
    (Placement(zone="Europe-West1-B"), PROJECT, "placement.zone"),
    (Placement(region="us-central1"), PROJECT, "placement.region"),
    (Placement(region="nowhere"), PROJECT, "placement.region"),
    (Placement(machine_type="e2 micro"), PROJECT, "placement.machineType"),
    (Placement(), None, "gcp.project"),
])
def test_placement_that_cannot_be_honoured_is_permanent_and_names_the_field(
        gcp_config: GcpConfig, placement: Placement, project: str | None, field: str) -> None:
    config = GcpConfig(project=None, zone=ZONE, machine_type="e2-micro", image="img")
    with pytest.raises(Permanent, match=f"^{field}: "):
        resolve_target(config, placement, project=project)


def test_placement_region_matching_the_zone_is_fine(gcp_config: GcpConfig) -> None:
    target = resolve_target(gcp_config, Placement(zone="us-east1-c", region="us-east1"),
                            project=PROJECT)
    assert (target.zone, target.machine_type) == ("us-east1-c", "e2-micro")


@pytest.mark.parametrize(("status", "nat_ip", "state"), [
    ("PROVISIONING", None, InstanceState.PROVISIONING),
    ("STAGING", None, InstanceState.PROVISIONING),
    ("RUNNING", None, InstanceState.PROVISIONING),
    ("RUNNING", "203.0.113.9", InstanceState.RUNNING),
    ("STOPPING", "203.0.113.9", InstanceState.STOPPED),
    ("PENDING_STOP", "203.0.113.9", InstanceState.STOPPED),
    ("DEPROVISIONING", None, InstanceState.STOPPED),
    ("PENDING", None, InstanceState.PROVISIONING),
    ("REPAIRING", "203.0.113.9", InstanceState.PROVISIONING),
    ("SOMETHING_NEW", "203.0.113.9", InstanceState.PROVISIONING),
    ("STOPPED", None, InstanceState.STOPPED),
    ("SUSPENDED", None, InstanceState.STOPPED),
    ("TERMINATED", None, InstanceState.TERMINATED),
])
def test_status_mapping(status: str, nat_ip: str | None, state: InstanceState) -> None:
    # An address is published only for Running (SPEC §4).
    assert instance_state(status, nat_ip) is state
    body = {"name": "px-a", "status": status, "zone": f"zones/{ZONE}",
            "creationTimestamp": "2024-05-01T10:00:00.000-07:00",
            "networkInterfaces": [{"accessConfigs": [{"natIP": nat_ip} if nat_ip else {}]}]}
    instance = instance_from_api(PROJECT, body)
    assert instance.state is state
    assert instance.provider_id == f"{PROJECT}/{ZONE}/px-a"
    assert instance.created_at == datetime(2024, 5, 1, 17, 0, tzinfo=UTC)


def test_every_status_of_the_compute_api_is_mapped() -> None:
    """The enum of the discovery document the client library ships (compute v1)."""
    doc = json.loads((Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
                      / "compute.v1.json").read_text())
    statuses = set(doc["schemas"]["Instance"]["properties"]["status"]["enum"])
    assert statuses == set(STATES)


def test_provider_id_round_trip_and_garbage_is_not_found() -> None:
    assert parse_provider_id(f"{PROJECT}/{ZONE}/px-a") == (PROJECT, ZONE, "px-a")
    for bad in ("px-a", "ns/pod", "p/not-a-zone/x", "p//x", "a/b/c/d"):
        with pytest.raises(NotFound):
            parse_provider_id(bad)


def test_label_filter_is_an_and_of_terms() -> None:
    assert label_filter({"b": "2", "a": "x_y"}) == '(labels.a = "x_y") (labels.b = "2")'
    with pytest.raises(Permanent):
        label_filter({"a": 'x" OR (name = "y'})


@pytest.mark.parametrize(("codes", "status", "kind"), [
    (["ZONE_RESOURCE_POOL_EXHAUSTED"], 503, QuotaExceeded),
    (["ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"], 503, QuotaExceeded),
    (["QUOTA_EXCEEDED"], 403, QuotaExceeded),
    (["RESOURCE_OPERATION_RATE_EXCEEDED"], 403, Transient),
    (["RESOURCE_NOT_FOUND"], 404, Permanent),  # a missing image, not a missing VM
    (["INVALID_FIELD_VALUE"], 400, Permanent),
    (["INTERNAL_ERROR"], 500, Transient),
])
def test_operation_errors(codes: list[str], status: int, kind: type[Exception]) -> None:
    op = {"status": "DONE", "httpErrorStatusCode": status,
          "error": {"errors": [{"code": c, "message": f"{c} happened"} for c in codes]}}
    err = error_from_operation(op, "insert x")
    assert type(err) is kind
    assert error_from_operation({"status": "DONE"}, "insert x") is None


# --- through the client library ---------------------------------------------


async def test_create_get_list_delete(gcp: GcpProvider, fake_compute: FakeCompute) -> None:
    with trio.fail_after(20):
        created = await gcp.create(request())
        pid = f"{PROJECT}/{ZONE}/px-abcdefghijklmnop"
        assert created.provider_id == pid
        assert created.state is InstanceState.PROVISIONING
        assert created.ip is None
        assert dict(created.labels) == LABELS
        sent = fake_compute.requests[0]
        assert (sent.method, sent.path) == (
            "POST", f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances")
        assert sent.body["metadata"] == {"items": [{"key": "user-data", "value": CLOUD_INIT}]}
        assert sent.body["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"

        fake_compute.set_status(PROJECT, ZONE, "px-abcdefghijklmnop", "RUNNING")
        assert (await gcp.get(pid)).state is InstanceState.PROVISIONING  # no NAT IP yet
        ip = fake_compute.start(PROJECT, ZONE, "px-abcdefghijklmnop")
        running = await gcp.get(pid)
        assert (running.state, running.ip) == (InstanceState.RUNNING, ip)

        listed = await gcp.list_by_labels({"egressd-managed-by": "egressd",
                                           "egressd-cluster": "prod"})
        assert [i.provider_id for i in listed] == [pid]
        assert fake_compute.requests[-1].query["filter"] == (
            '(labels.egressd-cluster = "prod") (labels.egressd-managed-by = "egressd")')
        assert await gcp.list_by_labels({"egressd-cluster": "staging"}) == []

        await gcp.delete(pid)
        with pytest.raises(NotFound):
            await gcp.get(pid)
        await gcp.delete(pid)  # idempotent: not found is success
        await gcp.delete("not-a-gcp-id")


async def test_create_is_idempotent_by_name(gcp: GcpProvider, fake_compute: FakeCompute) -> None:
    with trio.fail_after(20):
        first = await gcp.create(request())
        fake_compute.start(PROJECT, ZONE, first.name)
        again = await gcp.create(request())
        assert again.provider_id == first.provider_id
        assert again.state is InstanceState.RUNNING  # adopted as it is
        assert len(fake_compute.instances) == 1
        assert fake_compute.count("POST", "/instances$") == 2


async def test_create_waits_for_the_insert_operation(
        gcp: GcpProvider, fake_compute: FakeCompute) -> None:
    fake_compute.auto_finish = False
    done = trio.Event()

    async def create() -> None:
        await gcp.create(request())
        done.set()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create)
            await fake_compute.wait_for("GET", "/operations/", count=2)
            assert not done.is_set()
            fake_compute.finish_operations()
        assert done.is_set()


async def test_create_stops_waiting_at_the_operation_deadline(
        fake_compute: FakeCompute, gcp_factory: Callable[..., GcpProvider]) -> None:
    fake_compute.auto_finish = False
    gcp = gcp_factory(operation_timeout=0.3, operation_poll_interval=0.05)
    with trio.fail_after(20):
        instance = await gcp.create(request())
    assert instance.state is InstanceState.PROVISIONING


@pytest.mark.parametrize(("code", "kind"), [
    ("ZONE_RESOURCE_POOL_EXHAUSTED", QuotaExceeded),
    ("QUOTA_EXCEEDED", QuotaExceeded),
    ("PERMISSIONS_ERROR", NotConfigured),
])
async def test_failed_insert_operation(gcp: GcpProvider, fake_compute: FakeCompute,
                                       code: str, kind: type[Exception]) -> None:
    fake_compute.insert_operation_error = {
        "errors": [{"code": code, "message": f"{code} in {ZONE}"}], "httpErrorStatusCode": 403}
    with trio.fail_after(20), pytest.raises(kind, match=code):
        await gcp.create(request())
    assert fake_compute.instances == {}


# Reasons and statuses as Compute Engine sends them (see the comments in gcperrors.py):
# "Quota 'CPUS' exceeded" is 403 quotaExceeded; the API's request-rate limit is
# 403 rateLimitExceeded or 429 RESOURCE_EXHAUSTED/rateLimitExceeded; a delete
# racing an insert is 400 resourceNotReady.
@pytest.mark.parametrize(("status", "reason", "status_text", "kind"), [
    (403, "quotaExceeded", None, QuotaExceeded),
    (403, "quotaExceeded", "PERMISSION_DENIED", QuotaExceeded),
    (403, "rateLimitExceeded", None, Transient),
    (403, "userRateLimitExceeded", None, Transient),
    (429, "rateLimitExceeded", "RESOURCE_EXHAUSTED", Transient),
    (429, "tooManyRequests", None, Transient),
    (403, "forbidden", None, NotConfigured),
    (403, "accessNotConfigured", None, NotConfigured),
    (400, "invalid", None, Permanent),
    (400, "resourceNotReady", None, Transient),
    (404, "notFound", None, Permanent),  # an insert's 404: its project or zone is missing
    (500, "backendError", None, Transient),
    (503, "backendError", None, Transient),
])
async def test_http_errors_map_to_kinds(gcp: GcpProvider, fake_compute: FakeCompute,
                                        status: int, reason: str, status_text: str | None,
                                        kind: type[Exception]) -> None:
    fake_compute.inject(status, reason, message=f"{reason} says no", method="POST",
                        retry_after=7 if status == 429 else None, status_text=status_text)
    with trio.fail_after(20):
        with pytest.raises(kind, match=f"HTTP {status}: {reason} says no") as info:
            await gcp.create(request())
        # The same request succeeds once the fault is spent.
        assert (await gcp.create(request())).name == "px-abcdefghijklmnop"
    err = info.value
    assert isinstance(err.cause, Exception)  # the client library's HttpError
    if kind is QuotaExceeded:
        assert err.retry_after == 300
    if status == 429:
        assert err.retry_after == 7
        assert is_transient(err)


async def test_unknown_name_and_bad_ids(gcp: GcpProvider, fake_compute: FakeCompute) -> None:
    with trio.fail_after(20):
        with pytest.raises(NotFound):
            await gcp.get(f"{PROJECT}/{ZONE}/px-missing")
        with pytest.raises(NotFound):
            await gcp.get("egressd-proxies/px-a")
        with pytest.raises(Permanent, match=r"^name: "):
            await gcp.create(request("Not_A_Name"))
    # Bad input never reaches the API.
    assert [r.method for r in fake_compute.requests] == ["GET"]


async def test_unreachable_api_is_transient_with_its_cause(gcp_config: GcpConfig) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        gcp = GcpProvider(gcp_config, credentials=AnonymousCredentials(),
                          api_endpoint=f"http://127.0.0.1:{port}/compute/v1/")
        with trio.fail_after(20), pytest.raises(Transient) as info:
            await gcp.get(f"{PROJECT}/{ZONE}/px-a")
        gcp.close()
    assert isinstance(info.value.cause, OSError)
    assert is_transient(info.value)


async def test_list_spans_zones_and_pages(fake_compute: FakeCompute,
                                          gcp_factory: Callable[..., GcpProvider]) -> None:
    gcp = gcp_factory(page_size=2)
    mine = dict(LABELS)
    other = gc_labels(cluster="other", proxy_uid="u2", namespace="crawl", name="x")
    zones = ["europe-west1-b", "us-central1-a", "asia-east1-c"]
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(gcp.create, CreateRequest(
                    name=f"px-mine-{i}", placement=Placement(zone=zones[i % 3]), labels=mine))
            nursery.start_soon(gcp.create, CreateRequest(name="px-theirs", labels=other))
        found = await gcp.list_by_labels({"egressd-cluster": "prod",
                                          "egressd-managed-by": "egressd"})
    assert sorted(i.name for i in found) == [f"px-mine-{i}" for i in range(5)]
    assert {i.provider_id.split("/")[1] for i in found} == set(zones)
    assert fake_compute.count("GET", "/aggregated/instances$") == 3  # pages of 2


async def test_insert_operation_that_lost_a_race_adopts_the_winner(
        gcp: GcpProvider, fake_compute: FakeCompute) -> None:
    """Two inserts of one name both accepted: the loser's operation ends in
    RESOURCE_ALREADY_EXISTS (409), and create adopts the instance."""
    fake_compute.auto_finish = False
    fake_compute.insert_operation_error = {"errors": [{
        "code": "RESOURCE_ALREADY_EXISTS", "message": "The resource already exists"}],
        "httpErrorStatusCode": 409}
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gcp.create, request())
            await fake_compute.wait_for("GET", "/operations/")
            # The other insert's instance, made while ours was pending.
            winner = insert_body(gcp.config, request(), resolve_target(
                gcp.config, Placement(), project=PROJECT))
            fake_compute.add_instance(PROJECT, ZONE, winner)
            ip = fake_compute.start(PROJECT, ZONE, "px-abcdefghijklmnop")
            fake_compute.finish_operations()
        adopted = await gcp.get(f"{PROJECT}/{ZONE}/px-abcdefghijklmnop")
    assert (adopted.state, adopted.ip) == (InstanceState.RUNNING, ip)
    assert fake_compute.count("POST", "/instances$") == 1


async def test_delete_while_the_insert_runs_is_transient_then_succeeds(
        fake_compute: FakeCompute, gcp_factory: Callable[..., GcpProvider]) -> None:
    fake_compute.auto_finish = False
    gcp = gcp_factory(operation_timeout=0.05, operation_poll_interval=0.01)
    with trio.fail_after(20):
        created = await gcp.create(request())
        assert created.state is InstanceState.PROVISIONING
        with pytest.raises(Transient, match=r"HTTP 400: .* is not ready"):
            await gcp.delete(created.provider_id)
        fake_compute.finish_operations()
        await gcp.delete(created.provider_id)
    assert fake_compute.instances == {}


async def test_cloud_init_echoed_by_the_api_is_redacted(
        gcp: GcpProvider, fake_compute: FakeCompute, caplog: pytest.LogCaptureFixture) -> None:
    secret = "#cloud-config\nchpasswd:\n  list: |\n    root:hunter2-s3cret\n"
    fake_compute.inject(400, "invalid", message="Metadata has duplicate keys.", method="POST",
                        echo_metadata=True)
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(20), pytest.raises(Permanent) as info:
        await gcp.create(CreateRequest(name="px-leaky", cloud_init=secret, labels=LABELS))
    err = info.value
    assert "hunter2" in fake_compute.requests[-1].body["metadata"]["items"][0]["value"]
    for text in (str(err), repr(err), str(err.cause), repr(err.cause), caplog.text):
        assert "hunter2" not in text, text
    assert "Invalid value for field 'resource.metadata'" in str(err)
    assert "Metadata has duplicate keys." in str(err)


def test_redact_finds_raw_escaped_and_partial_copies() -> None:
    secret = "#cloud-config\nusers:\n  - name: ops\n    passwd: 'pa\"ss-w0rd'\n"
    echoed = [
        f"bad value {secret}",
        f"bad value {json.dumps(secret)}",
        "bad value 'passwd: \\'pa\\\"ss-w0rd\\''",  # a proto-text escaped line
        "Invalid value for field 'resource.metadata.items[0].value': '#cloud-config\\nusers:"
        " (truncated)'. Value is too large.",
    ]
    for text in echoed:
        clean = redact(text, secret)
        assert "ss-w0rd" not in clean and "users:" not in clean, clean
        assert clean.startswith(("bad value ", "Invalid value for field")), clean
    assert redact("nothing here", secret) == "nothing here"
    assert redact("x", "") == "x"


async def test_oversized_cloud_init_is_permanent_before_any_request(
        gcp: GcpProvider, fake_compute: FakeCompute) -> None:
    big = "#cloud-config\n" + "# padding\n" * 30_000
    with trio.fail_after(20), pytest.raises(Permanent, match=r"^cloud_init: \d+ bytes"):
        await gcp.create(CreateRequest(name="px-big", cloud_init=big))
    assert fake_compute.requests == []


async def test_placement_it_cannot_honour_never_reaches_the_api(
        gcp: GcpProvider, fake_compute: FakeCompute) -> None:
    with trio.fail_after(20):
        with pytest.raises(Permanent, match=r"^placement\.zone: "):
            await gcp.create(request(placement=Placement(zone="europe")))
        with pytest.raises(Permanent, match=r"^placement\.region: "):
            await gcp.create(request(placement=Placement(region="us-east1")))
    assert fake_compute.requests == []


async def test_each_worker_thread_has_its_own_http_connection(
        fake_compute: FakeCompute, gcp_factory: Callable[..., GcpProvider]) -> None:
    """httplib2 is not thread-safe: concurrent calls run on distinct threads, each
    with its own authorized HTTP object (and so its own keep-alive connection)."""
    gcp = gcp_factory(limiter=trio.CapacityLimiter(6))
    names = [f"px-vm-{i}" for i in range(6)]
    for name in names:
        fake_compute.add_instance(PROJECT, ZONE, insert_body(gcp.config, request(name),
                                  resolve_target(gcp.config, Placement(), project=PROJECT)))
        fake_compute.start(PROJECT, ZONE, name)
    got: dict[str, str] = {}

    async def read(name: str) -> None:
        got[name] = (await gcp.get(f"{PROJECT}/{ZONE}/{name}")).name

    with trio.fail_after(20):
        for _ in range(4):
            async with trio.open_nursery() as nursery:
                for name in names:
                    nursery.start_soon(read, name)
    assert got == {name: name for name in names}
    https = gcp._https
    # Six calls in flight at once run on six threads, so at least six objects.
    assert len(https) >= 6 and len({id(h) for h in https}) == len(https)
    # Each object keeps one connection alive across its thread's calls.
    assert len({r.connection for r in fake_compute.requests}) == len(https)


def test_an_empty_nat_ip_is_no_address() -> None:
    body = {"name": "px-a", "status": "RUNNING", "zone": f"zones/{ZONE}",
            "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT", "natIP": ""}]}]}
    instance = instance_from_api(PROJECT, body)
    assert (instance.state, instance.ip) == (InstanceState.PROVISIONING, None)
