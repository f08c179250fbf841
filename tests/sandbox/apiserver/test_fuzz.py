"""Property: no request body makes the fake API server answer 5xx, and a 4xx changes nothing.

Hypothesis mutates valid objects of every served kind (a value of the wrong
type, a member dropped or added) and sends them with every verb and body
type to one long-lived server, so objects created by earlier examples are
updated, patched and deleted by later ones. Requests go to the server's
request handler in-process (the HTTP layer is exercised by the other tests):
hundreds of examples stay well under a second each.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egressd.sandbox.apiserver import FakeApiServer
from egressd.sandbox.apiserver.wire import Request, Response

STAMP = "2026-01-01T00:00:00Z"
SAMPLES: dict[str, dict[str, Any]] = {
    "/apis/crawl.example.com/v1alpha1/namespaces/default/proxies": {
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "a", "labels": {"a": "b"}, "finalizers": ["x/y"]},
        "spec": {"mode": "Managed", "provider": "p", "port": 3128, "maxLeases": 3,
                 "cloudInit": {"secretRef": {"name": "s", "key": "k"}},
                 "attributes": {"r": "eu"},
                 "healthCheck": {"intervalSeconds": 30, "timeoutSeconds": 5}},
        "status": {"phase": "Ready", "conditions": [
            {"type": "Healthy", "status": "True", "lastTransitionTime": STAMP}],
            "cooldowns": {"*": {"until": STAMP, "reason": "banned"}}}},
    "/api/v1/namespaces/default/pods": {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.5"}},
    "/api/v1/namespaces/default/secrets": {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
        "data": {"a": "YQ=="}, "stringData": {"b": "c"}, "type": "Opaque"},
    "/api/v1/namespaces/default/events": {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
        "involvedObject": {"kind": "Proxy", "name": "a", "namespace": "default"},
        "reason": "R", "message": "m", "type": "Normal", "count": 1,
        "source": {"component": "egressd"}, "lastTimestamp": STAMP},
    "/apis/coordination.k8s.io/v1/namespaces/default/leases": {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
        "spec": {"holderIdentity": "h", "leaseDurationSeconds": 15, "renewTime": STAMP}},
    "/api/v1/namespaces": {"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": "team"}},
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions": {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.org"},
        "spec": {"group": "example.org", "scope": "Namespaced",
                 "names": {"plural": "widgets", "kind": "Widget"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "additionalPrinterColumns": [
                                   {"name": "Size", "type": "integer", "jsonPath": ".spec.size"}],
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": {"type": "object", "properties": {
                                       "size": {"type": "integer", "minimum": 0}},
                                       "x-kubernetes-validations": [
                                           {"rule": "self.size < 10"}]}}}}}]}},
}
CONTENT_TYPES = ["application/json", "application/merge-patch+json",
                 "application/json-patch+json", "application/strategic-merge-patch+json",
                 "application/apply-patch+yaml", "application/yaml"]

junk = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
    | st.sampled_from(["", STAMP, "$patch", "delete", "replace", "a", "v1", "Proxy"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["a", "name", "spec", "$patch", "type", "status",
                                       "metadata", "items", "properties"])
                      | st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


def _mutated(data: st.DataObject, sample: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(sample)
    # A fresh name half the time, so broken objects get past AlreadyExists and are stored
    # if the server lets them through.
    if data.draw(st.booleans()):
        body["metadata"]["name"] += f"-{data.draw(st.integers(0, 10**6))}"
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(body)
        if data.draw(st.booleans()):  # metadata is every kind's, and read by every list
            paths = [p for p in paths if p[0] == "metadata"] or paths
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent: Any = body
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if action == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.text(max_size=8))] = data.draw(junk)
        else:
            parent[path[-1]] = data.draw(junk)
    return body


SERVER = FakeApiServer(token="t")


async def _send(method: str, path: str, *, body: bytes = b"", content_type: str = "",
                query: dict[str, str] | None = None, accept: str = "application/json"
                ) -> Response:
    headers = {"authorization": "Bearer t", "content-type": content_type, "accept": accept}
    reply = await SERVER.app.handle(Request(method=method, path=path, query=query or {},
                                            headers=headers, body=body))
    assert isinstance(reply, Response)
    return reply


@settings(max_examples=250, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_no_body_makes_a_5xx_and_a_4xx_changes_nothing(data: st.DataObject) -> None:
    collection = data.draw(st.sampled_from(sorted(SAMPLES)))
    sample = SAMPLES[collection]
    item = f"{collection}/{sample['metadata']['name']}"
    seed = data.draw(st.booleans())  # often there is something to update, patch or delete
    method = data.draw(st.sampled_from(["POST", "PUT", "PATCH", "DELETE"]))
    path = collection if method == "POST" else item + data.draw(st.sampled_from(["", "/status"]))
    content_type = data.draw(st.sampled_from(CONTENT_TYPES))
    body: Any = _mutated(data, sample)
    if content_type == "application/json-patch+json" and data.draw(st.booleans()):
        target = data.draw(st.sampled_from(_paths(sample)))
        body = [{"op": data.draw(st.sampled_from(["add", "remove", "replace", "test", "move"])),
                 "path": "/" + "/".join(str(k) for k in target), "value": data.draw(junk),
                 "from": "/metadata/name"}]
    raw = json.dumps(body).encode() if data.draw(st.integers(0, 9)) else data.draw(st.binary())
    query = {"fieldManager": "fuzz"} if data.draw(st.booleans()) else {}

    async def example() -> None:
        if seed:
            await _send("POST", collection, body=json.dumps(sample).encode(),
                        content_type="application/json")
        before = SERVER.resource_version
        reply = await _send(method, path, body=raw, content_type=content_type, query=query)
        assert reply.status < 500, reply.body
        status = json.loads(reply.body)
        if reply.status >= 400:
            assert status["kind"] == "Status" and status["code"] == reply.status
            assert SERVER.resource_version == before, status
        # Whatever was stored must not break reads: selectors and Table rendering walk it.
        for accept in ("application/json", "application/json;as=Table;v=v1;g=meta.k8s.io"):
            listed = await _send("GET", collection, query={"labelSelector": "a!=b,!z"},
                                 accept=accept)
            assert listed.status == 200, listed.body

    trio.run(example)
