"""KubeClient against the fake API server over HTTPS with a token: verbs, errors, retries."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from egressd.kube import errors
from egressd.kube.client import KubeClient, RetryPolicy, open_client
from egressd.kube.config import load_config, load_incluster_config
from egressd.kube.resources import PROXIES, SECRETS, Resource
from egressd.kube.watch import ADDED, BOOKMARK, DELETED, MODIFIED, decode_event
from egressd.sandbox.apiserver import FakeApiServer
from tests.fixtures.kube import FAST_RETRY, write_kubeconfig


def secret(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "stringData": {"k": "v"}}


def external_proxy(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"mode": "External", "endpoint": {"host": "10.0.0.7", "port": 3128}}}


async def test_crud_roundtrip(kube_client: KubeClient) -> None:
    with trio.fail_after(10):
        created = await kube_client.create(SECRETS, secret("a", tier="x"), namespace="default")
        assert created["metadata"]["uid"]
        await kube_client.create(SECRETS, secret("b", tier="y"), namespace="default")

        got = await kube_client.get(SECRETS, "a", namespace="default")
        assert got["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]

        listed = await kube_client.list(SECRETS, namespace="default", label_selector="tier=x")
        assert [o["metadata"]["name"] for o in listed.items] == ["a"]
        assert listed.items[0]["kind"] == "Secret"  # filled in for list items
        assert int(listed.resource_version) >= int(created["metadata"]["resourceVersion"])
        by_field = await kube_client.list(SECRETS, field_selector="metadata.name=b")
        assert [o["metadata"]["name"] for o in by_field.items] == ["b"]

        patched = await kube_client.merge_patch(
            SECRETS, "a", {"metadata": {"labels": {"extra": "1"}}}, namespace="default")
        assert patched["metadata"]["labels"] == {"tier": "x", "extra": "1"}

        ops = [{"op": "test", "path": "/metadata/labels/extra", "value": "1"},
               {"op": "replace", "path": "/metadata/labels/extra", "value": "2"}]
        patched = await kube_client.json_patch(SECRETS, "a", ops, namespace="default")
        assert patched["metadata"]["labels"]["extra"] == "2"

        replaced = await kube_client.replace(
            SECRETS, "a", {**patched, "data": {"k": "d2Vi"}}, namespace="default")
        assert replaced["data"] == {"k": "d2Vi"}

        assert await kube_client.delete(SECRETS, "a", namespace="default") is None
        with pytest.raises(errors.NotFound) as missing:
            await kube_client.get(SECRETS, "a", namespace="default")
        assert missing.value.status == 404
        assert missing.value.reason == "NotFound"
        assert "a" in missing.value.message


async def test_status_patch_and_finalizer_delete(kube_client: KubeClient) -> None:
    with trio.fail_after(10):
        proxy = await kube_client.create(PROXIES, external_proxy("px1"), namespace="default")
        assert proxy["spec"]["port"] == 3128  # CRD defaults applied
        status = await kube_client.patch_status(
            PROXIES, "px1", {"status": {"phase": "Ready"}}, namespace="default")
        assert status["status"]["phase"] == "Ready"
        # The status subresource ignores spec, the main resource ignores status.
        again = await kube_client.merge_patch(
            PROXIES, "px1", {"status": {"phase": "Failed"},
                             "metadata": {"finalizers": ["crawl.example.com/instance-cleanup"]}},
            namespace="default")
        assert again["status"]["phase"] == "Ready"
        held = await kube_client.delete(PROXIES, "px1", namespace="default")
        assert held is not None and held["metadata"]["deletionTimestamp"]
        await kube_client.json_patch(
            PROXIES, "px1", [{"op": "remove", "path": "/metadata/finalizers"}],
            namespace="default")
        with pytest.raises(errors.NotFound):
            await kube_client.get(PROXIES, "px1", namespace="default")


async def test_error_types(kube_client: KubeClient, apiserver: FakeApiServer) -> None:
    with trio.fail_after(10):
        a = await kube_client.create(SECRETS, secret("a"), namespace="default")
        with pytest.raises(errors.AlreadyExists) as exists:
            await kube_client.create(SECRETS, secret("a"), namespace="default")
        assert isinstance(exists.value, errors.Conflict)

        await kube_client.merge_patch(SECRETS, "a", {"metadata": {"labels": {"v": "2"}}},
                                      namespace="default")
        with pytest.raises(errors.Conflict) as stale:
            await kube_client.replace(SECRETS, "a", a, namespace="default")
        assert not isinstance(stale.value, errors.AlreadyExists)

        with pytest.raises(errors.Invalid):  # a failed JSON patch test op is 422
            await kube_client.json_patch(
                SECRETS, "a", [{"op": "test", "path": "/metadata/name", "value": "zz"}],
                namespace="default")
        with pytest.raises(errors.Invalid) as invalid:  # CRD validation
            await kube_client.create(
                PROXIES, {"metadata": {"name": "bad"}, "spec": {"mode": "External"}},
                namespace="default")
        assert invalid.value.message

        apiserver.faults.fail_next(1, code=410, resource="secrets")
        with pytest.raises(errors.Gone):
            await kube_client.list(SECRETS, namespace="default")

        apiserver.faults.fail_next(1, code=403, resource="secrets", message="rbac says no")
        with pytest.raises(errors.Forbidden) as forbidden:
            await kube_client.get(SECRETS, "a", namespace="default")
        assert "rbac says no" in forbidden.value.message

        apiserver.faults.fail_next(1, code=422, resource="secrets")
        with pytest.raises(errors.Invalid):
            await kube_client.get(SECRETS, "a", namespace="default")


async def test_retries_5xx_then_succeeds(kube_client: KubeClient,
                                         apiserver: FakeApiServer) -> None:
    with trio.fail_after(10):
        await kube_client.create(SECRETS, secret("a"), namespace="default")
        rule = apiserver.faults.fail_next(2, code=503, resource="secrets")
        got = await kube_client.get(SECRETS, "a", namespace="default")
        assert got["metadata"]["name"] == "a"
        assert rule.hits == 2

        rule = apiserver.faults.fail_next(100, code=500, resource="secrets")
        with pytest.raises(errors.ServerError) as server_error:
            await kube_client.get(SECRETS, "a", namespace="default")
        assert server_error.value.status == 500
        assert rule.hits == FAST_RETRY.attempts  # bounded
        apiserver.faults.clear()


async def test_retry_after_wins_when_longer(kube_client: KubeClient,
                                            apiserver: FakeApiServer) -> None:
    with trio.fail_after(10):
        await kube_client.create(SECRETS, secret("a"), namespace="default")
        apiserver.faults.fail_next(1, code=429, resource="secrets", retry_after=1)
        start = trio.current_time()
        await kube_client.get(SECRETS, "a", namespace="default")
        # FAST_RETRY's own backoff is 0.05 s: only the server's hint explains the wait.
        assert trio.current_time() - start >= 1.0

        apiserver.faults.fail_next(100, code=429, resource="secrets", retry_after=0)
        with pytest.raises(errors.TooManyRequests) as throttled:
            await kube_client.get(SECRETS, "a", namespace="default")
        assert throttled.value.retry_after == 0
        apiserver.faults.clear()


def test_retry_delay_boundaries() -> None:
    policy = RetryPolicy(attempts=9, base_delay=1.0, max_delay=8.0, max_retry_after=20.0)
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0), (9, 8.0)]:
        for _ in range(20):
            assert 0.8 * base <= policy.delay(attempt) <= 1.2 * base
    # A Retry-After shorter than the backoff does not shorten it.
    assert policy.delay(4, 0.5) >= 0.8 * 8.0
    assert policy.delay(2, 0.0) >= 0.8 * 2.0
    # A longer one wins, up to max_retry_after.
    assert policy.delay(1, 5.0) == 5.0
    assert policy.delay(4, 15.0) == 15.0
    assert policy.delay(1, 600.0) == 20.0


@pytest.mark.parametrize(("header", "seconds"), [
    (None, None), ("3", 3.0), (" 1.5 ", 1.5), ("0", 0.0), ("-1", None), ("soon", None),
    ("Wed, 21 Oct 2015 07:28:00 GMT", None),
])
def test_retry_after_header(header: str | None, seconds: float | None) -> None:
    assert errors.parse_retry_after(header) == seconds


async def test_connection_refused_is_retried(kube_config: Any,
                                             apiserver: FakeApiServer) -> None:
    patient = RetryPolicy(attempts=30, base_delay=0.05, max_delay=0.1)
    with trio.fail_after(10):
        async with open_client(kube_config, retry=patient) as client:
            await client.create(SECRETS, secret("a"), namespace="default")
            apiserver.faults.refuse_connections(0.5)
            got = await client.get(SECRETS, "a", namespace="default")
            assert got["metadata"]["name"] == "a"
        async with open_client(kube_config, retry=RetryPolicy(attempts=1)) as client:
            apiserver.faults.refuse_connections(5)
            with pytest.raises(errors.ApiUnavailable):
                await client.get(SECRETS, "a", namespace="default")


async def test_401_rereads_a_rotated_token_file(apiserver: FakeApiServer,
                                                tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(apiserver.token)
    path = write_kubeconfig(tmp_path / "config", server=apiserver.url,
                            ca_pem=apiserver.ca_pem, user={"tokenFile": str(token_file)})
    cfg = await load_config(kubeconfig=str(path), context=None)
    with trio.fail_after(10):
        async with open_client(cfg, retry=FAST_RETRY) as client:
            await client.list(SECRETS)
            token_file.write_text(apiserver.faults.rotate_token())
            await client.list(SECRETS)  # 401, reload, replay
            assert cfg.credentials.generation == 1
            apiserver.faults.rotate_token()  # the file keeps the old token now
            with pytest.raises(errors.Unauthorized):
                await client.list(SECRETS)


async def test_watch_events_and_gone(kube_client: KubeClient,
                                     apiserver: FakeApiServer) -> None:
    with trio.fail_after(10):
        start = await kube_client.list(SECRETS, namespace="default")
        async with kube_client.watch(SECRETS, namespace="default",
                                     resource_version=start.resource_version,
                                     timeout_seconds=30) as stream:
            await kube_client.create(SECRETS, secret("w"), namespace="default")
            await kube_client.merge_patch(SECRETS, "w", {"metadata": {"labels": {"a": "b"}}},
                                          namespace="default")
            await kube_client.delete(SECRETS, "w", namespace="default")
            seen = []
            async for event in stream:
                if event.type != BOOKMARK:
                    seen.append((event.type, event.object["metadata"]["name"]))
                if event.type == DELETED:
                    break
        assert seen == [(ADDED, "w"), (MODIFIED, "w"), (DELETED, "w")]
        apiserver.compact()
        with pytest.raises(errors.Gone):
            async with kube_client.watch(SECRETS, resource_version=start.resource_version,
                                         timeout_seconds=30) as stream:
                async for _ in stream:
                    pass


async def test_watch_bookmarks(tmp_path: Path, nursery: trio.Nursery) -> None:
    server = FakeApiServer(bookmark_interval=0.2)
    await nursery.start(server.serve)
    server.write_kubeconfig(tmp_path / "config")
    cfg = await load_config(kubeconfig=str(tmp_path / "config"), context=None)
    with trio.fail_after(10):
        async with open_client(cfg, retry=FAST_RETRY) as client:
            start = await client.list(SECRETS)
            await client.create(SECRETS, secret("elsewhere"), namespace="kube-system")
            async with client.watch(SECRETS, namespace="default",
                                    resource_version=start.resource_version,
                                    timeout_seconds=30) as stream:
                async for event in stream:
                    assert event.type == BOOKMARK
                    # A bookmark carries only the version: newer than the list's.
                    assert int(event.resource_version) > int(start.resource_version)
                    break


async def _serve_garbage(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
                         ) -> None:
    """A plain-HTTP server answering HTML: what a misrouted proxy or load balancer sends."""
    async def handle(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some()
            if not chunk:
                return
            data += chunk
        status = b"502 Bad Gateway" if b"/api/v1/pods" in data else b"200 OK"
        body = b"<html><body>" + b"x" * 1000 + b"</body></html>"
        if b"/api/v1/secrets" in data:  # JSON, but an item with no metadata
            body = (b'{"kind":"SecretList","metadata":{"resourceVersion":"5"},'
                    b'"items":[{"data":{"k":"c2VjcmV0"}}]}')
        await stream.send_all(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/html\r\n"
                              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        task_status.started(listeners[0].socket.getsockname()[1])


async def test_non_json_answer_is_a_typed_error(tmp_path: Path, nursery: trio.Nursery) -> None:
    port = await nursery.start(_serve_garbage)
    ca = trustme.CA()
    path = write_kubeconfig(tmp_path / "config", server=f"http://127.0.0.1:{port}",
                            ca_pem=ca.cert_pem.bytes(), user={})
    cfg = await load_config(kubeconfig=str(path), context=None)
    with trio.fail_after(10):
        async with open_client(cfg, retry=FAST_RETRY) as client:
            with pytest.raises(errors.BadResponse) as bad:
                await client.get(SECRETS, "x", namespace="default")
            assert bad.value.body.startswith(b"<html><body>xxx")
            assert len(bad.value.body) == errors.BODY_PREVIEW_BYTES
            with pytest.raises(errors.ServerError) as gateway:
                await client.list(Resource("", "v1", "pods", "Pod"))
            assert gateway.value.status == 502
            assert gateway.value.message.startswith("<html>")
            with pytest.raises(errors.BadResponse) as shapeless:
                await client.list(SECRETS)
            # The preview shows the list's shape, never its items (Secret data).
            assert b"SecretList" in shapeless.value.body
            assert b"c2VjcmV0" not in shapeless.value.body


@pytest.mark.parametrize("line", [
    "not json", "[1, 2]", '{"type": "ADDED"}', '{"type": "ADDED", "object": {"kind": "Secret"}}',
    '{"type": "MODIFIED", "object": {"metadata": {"namespace": "default"}}}',
])
def test_malformed_watch_lines_are_typed_errors(line: str) -> None:
    with pytest.raises(errors.BadResponse) as bad:
        decode_event(line)
    assert bad.value.body == line.encode()[:errors.BODY_PREVIEW_BYTES]


def test_watch_lines_decode() -> None:
    bookmark = decode_event('{"type": "BOOKMARK", "object": {"kind": "Secret", '
                            '"metadata": {"resourceVersion": "12"}}}')
    assert (bookmark.type, bookmark.resource_version) == (BOOKMARK, "12")
    added = decode_event('{"type": "ADDED", "object": {"metadata": {"name": "a", '
                         '"resourceVersion": "13"}}}')
    assert (added.type, added.resource_version) == (ADDED, "13")
    with pytest.raises(errors.Gone) as gone:
        decode_event('{"type": "ERROR", "object": {"kind": "Status", "code": 410, '
                     '"reason": "Expired", "message": "too old resource version: 1 (5)"}}')
    assert "too old" in gone.value.message


@pytest.mark.parametrize(("status", "reason", "cls"), [
    (400, "BadRequest", errors.BadRequest), (401, "Unauthorized", errors.Unauthorized),
    (403, "Forbidden", errors.Forbidden), (404, "NotFound", errors.NotFound),
    (409, "Conflict", errors.Conflict), (409, "AlreadyExists", errors.AlreadyExists),
    (410, "Expired", errors.Gone), (422, "Invalid", errors.Invalid),
    (429, "TooManyRequests", errors.TooManyRequests), (500, "InternalError", errors.ServerError),
    (503, "ServiceUnavailable", errors.ServerError), (418, "Teapot", errors.ApiError),
])
def test_error_mapping(status: int, reason: str, cls: type[errors.ApiError]) -> None:
    body = f'{{"kind":"Status","code":{status},"reason":"{reason}","message":"m"}}'.encode()
    err = errors.error_from_response(status, body, retry_after=3.0)
    assert type(err) is cls
    assert (err.status, err.reason, err.message) == (status, reason, "m")
    if isinstance(err, errors.TooManyRequests):
        assert err.retry_after == 3.0


async def test_incluster_config_follows_a_rotated_token_file(apiserver: FakeApiServer,
                                                             tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(apiserver.token)
    host, _, port = apiserver.url.removeprefix("https://").rpartition(":")
    cfg = await load_incluster_config(
        environ={"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port},
        token_file=str(token_file), ca_file=apiserver.ca_file, namespace_file=None)
    with trio.fail_after(10):
        async with open_client(cfg, retry=FAST_RETRY) as client:
            await client.list(SECRETS)
            # The kubelet rotates the projected token: the old one is refused now.
            token_file.write_text(apiserver.faults.rotate_token())
            created = await client.create(SECRETS, secret("after-rotation"),
                                          namespace="default")
            assert created["metadata"]["name"] == "after-rotation"
            assert cfg.credentials.generation == 1


@pytest.mark.parametrize(("name", "ok"), [("localhost", True), ("wrong.example", False)])
async def test_tls_server_name_is_what_gets_verified(apiserver: FakeApiServer, tmp_path: Path,
                                                     name: str, ok: bool) -> None:
    path = write_kubeconfig(tmp_path / "config", server=apiserver.url, ca_pem=apiserver.ca_pem,
                            user={"token": apiserver.token})
    text = path.read_text().replace("server:", f"tls-server-name: {name}\n    server:")
    path.write_text(text)
    cfg = await load_config(kubeconfig=str(path), context=None)
    assert cfg.tls_server_name == name
    with trio.fail_after(10):
        async with open_client(cfg, retry=RetryPolicy(attempts=1)) as client:
            if ok:
                await client.list(SECRETS)
            else:
                with pytest.raises(errors.ApiUnavailable, match="certificate"):
                    await client.list(SECRETS)
