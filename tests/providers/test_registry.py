"""The contract's values and errors, the metrics wrapper, and the registry built from config."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from google.auth.credentials import AnonymousCredentials

from egressd.errors import ConfigError
from egressd.kube.client import KubeClient
from egressd.kube.resources import NAMESPACES
from egressd.metrics import REGISTRY
from egressd.providers import (
    CreateRequest,
    Instance,
    InstanceState,
    NotFound,
    Permanent,
    Provider,
    ProviderError,
    QuotaExceeded,
    Transient,
    UnknownProvider,
    is_not_found,
    is_permanent,
    is_quota,
    is_transient,
)
from egressd.providers.config import parse_providers_config
from egressd.providers.metrics import MeteredProvider
from egressd.providers.registry import build_registry
from tests.providers.fake_compute import FakeCompute

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def test_running_needs_an_ip() -> None:
    with pytest.raises(ValueError, match="Running without an ip"):
        Instance(provider_id="a/b", name="b", state=InstanceState.RUNNING, created_at=NOW)
    ok = Instance(provider_id="a/b", name="b", state=InstanceState.PROVISIONING, created_at=NOW,
                  labels={"k": "v"})
    assert ok.ip is None
    with pytest.raises(TypeError):
        ok.labels["k"] = "w"  # type: ignore[index]


def test_cloud_init_stays_out_of_the_repr() -> None:
    assert "s3cret" not in repr(CreateRequest(name="px-a", cloud_init="password: s3cret"))


def test_error_kinds_compose() -> None:
    cause = ConnectionResetError("reset by peer")
    try:
        raise Transient("get a/b: reset", retry_after=2) from cause
    except ProviderError as exc:
        err = exc
    assert isinstance(err, Transient) and is_transient(err)
    assert err.cause is cause and err.retry_after == 2
    assert QuotaExceeded("no CPUs").retry_after == 300
    assert is_quota(QuotaExceeded("x")) and not is_transient(QuotaExceeded("x"))
    assert is_permanent(UnknownProvider("x")) and not is_transient(Permanent("x"))
    assert is_not_found(NotFound("x")) and not is_transient(NotFound("x"))
    assert is_transient(RuntimeError("unmapped")), "an unmapped error is retried with backoff"


class Scripted:
    """A provider whose calls take `seconds` (trio time) and then raise `error`, if any."""

    def __init__(self, seconds: float, error: Exception | None = None) -> None:
        self.seconds = seconds
        self.error = error

    async def _run(self) -> None:
        await trio.sleep(self.seconds)
        if self.error is not None:
            raise self.error

    async def create(self, request: CreateRequest, /) -> Instance:
        await self._run()
        return Instance(provider_id=f"x/{request.name}", name=request.name,
                        state=InstanceState.PROVISIONING, created_at=NOW)

    async def get(self, provider_id: str, /) -> Instance:
        await self._run()
        raise AssertionError("unreachable in these tests")

    async def delete(self, provider_id: str, /) -> None:
        await self._run()

    async def list_by_labels(self, labels: Mapping[str, str], /) -> list[Instance]:
        await self._run()
        return []


def calls(provider: str, op: str, result: str) -> float:
    return REGISTRY.get_sample_value("egressd_provider_calls_total",
                                     {"provider": provider, "op": op, "result": result}) or 0.0


def seconds(provider: str, op: str) -> float:
    return REGISTRY.get_sample_value("egressd_provider_call_duration_seconds_sum",
                                     {"provider": provider, "op": op}) or 0.0


@pytest.mark.parametrize(("error", "result"), [
    (None, "ok"),
    (NotFound("gone"), "not_found"),
    (Permanent("no"), "permanent"),
    (QuotaExceeded("full"), "quota_exceeded"),
    (Transient("flaky"), "transient"),
    (OSError("unmapped"), "transient"),
])
async def test_every_call_is_counted_and_timed(autojump_clock: trio.testing.MockClock,
                                               error: Exception | None, result: str) -> None:
    name = f"scripted-{type(error).__name__}"
    metered = MeteredProvider(Scripted(3.0, error), name=name)
    assert isinstance(metered, Provider)
    before = calls(name, "delete", result)
    if error is None:
        await metered.delete("x/y")
        assert (await metered.create(CreateRequest(name="px-a"))).name == "px-a"
        assert await metered.list_by_labels({}) == []
        assert calls(name, "create", "ok") == 1 and calls(name, "list", "ok") == 1
    else:
        with pytest.raises(type(error)):
            await metered.delete("x/y")
    assert calls(name, "delete", result) == before + 1
    assert seconds(name, "delete") == pytest.approx(3.0)


async def test_a_cancelled_call_is_counted_as_cancelled(
        autojump_clock: trio.testing.MockClock) -> None:
    metered = MeteredProvider(Scripted(60.0), name="scripted-cancel")
    with trio.move_on_after(5):
        await metered.get("x/y")
    assert calls("scripted-cancel", "get", "cancelled") == 1
    assert seconds("scripted-cancel", "get") == pytest.approx(5.0)


BOTH = """
providers:
  - name: pods
    type: kubernetes
    kubernetes: {namespace: egressd-proxies, image: "ubuntu/squid:6.6-24.04_edge"}
  - name: gce
    type: gcp
    gcp: {project: p1, zone: europe-west1-b, machineType: e2-micro, image: img}
"""


async def test_registry_builds_and_meters_every_provider(
        kube_client: KubeClient, fake_compute: FakeCompute) -> None:
    registry = build_registry(parse_providers_config(BOTH), kube_client=kube_client,
                              gcp_credentials=AnonymousCredentials(),
                              gcp_api_endpoint=fake_compute.endpoint)
    try:
        assert list(registry) == ["pods", "gce"] and len(registry) == 2 and "gce" in registry
        assert all(isinstance(p, MeteredProvider) for _, p in registry.items())
        with pytest.raises(UnknownProvider, match=r"no provider named 'aws'.*known: gce, pods"):
            registry.get("aws")
        with trio.fail_after(20):
            await kube_client.create(NAMESPACES, {"metadata": {"name": "egressd-proxies"}})
            pod = await registry.get("pods").create(CreateRequest(name="px-reg"))
            vm = await registry.get("gce").create(CreateRequest(name="px-reg"))
        assert pod.provider_id == "egressd-proxies/px-reg"
        assert vm.provider_id == "p1/europe-west1-b/px-reg"
        assert calls("pods", "create", "ok") >= 1 and calls("gce", "create", "ok") >= 1
    finally:
        registry.close()


def test_kubernetes_provider_needs_a_client() -> None:
    with pytest.raises(ConfigError, match="'pods': a kubernetes provider needs"):
        build_registry(parse_providers_config(BOTH))


def test_gcp_without_credentials_stops_at_start(tmp_path: Path) -> None:
    config = parse_providers_config(BOTH.replace(
        "image: img}", f"image: img, credentialsFile: {tmp_path}/missing.json}}"))
    with pytest.raises(ConfigError, match="'gce': no usable Google credentials"):
        build_registry(config, kube_client=object())  # type: ignore[arg-type]


def test_gcp_client_is_imported_only_when_configured(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(BOTH.split("  - name: gce")[0])
    script = (
        "import sys\n"
        "from egressd.providers.config import load_providers_config\n"
        "from egressd.providers.registry import build_registry\n"
        f"build_registry(load_providers_config({str(path)!r}), kube_client=object())\n"
        "print(sorted(m for m in sys.modules if m.startswith(('googleapiclient', 'google.auth',"
        " 'egressd.providers.gcp'))))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
