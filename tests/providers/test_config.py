"""Strict parsing of the providers config, and `egressd check-config` (SPEC §4, §9)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from egressd.cli import main
from egressd.errors import ConfigError
from egressd.providers.config import (
    GcpConfig,
    KubernetesConfig,
    ProviderConfig,
    ProvidersConfig,
    ProvidersConfigError,
    load_providers_config,
    parse_providers_config,
)

SPEC_EXAMPLE = """\
providers:
  - name: gcp-eu
    type: gcp
    gcp: {project: my-project, zone: europe-west1-b, machineType: e2-micro,
          image: projects/debian-cloud/global/images/family/debian-12,
          network: default, networkTags: [egressd-proxy]}
  - name: in-cluster
    type: kubernetes
    kubernetes: {namespace: egressd-proxies, image: "ubuntu/squid:6.6-24.04_edge"}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ProvidersConfigError) as info:
        parse_providers_config(text)
    assert isinstance(info.value, ConfigError)
    return info.value.problems


def test_the_spec_example_parses() -> None:
    assert parse_providers_config(SPEC_EXAMPLE) == ProvidersConfig((
        ProviderConfig(name="gcp-eu", settings=GcpConfig(
            project="my-project", zone="europe-west1-b", machine_type="e2-micro",
            image="projects/debian-cloud/global/images/family/debian-12",
            network="default", network_tags=("egressd-proxy",))),
        ProviderConfig(name="in-cluster", settings=KubernetesConfig(
            namespace="egressd-proxies", image="ubuntu/squid:6.6-24.04_edge")),
    ))


def test_optional_fields_and_an_empty_list() -> None:
    config = parse_providers_config("""
providers:
  - name: g
    type: gcp
    gcp: {zone: us-central1-a, machineType: e2-small, image: img, subnetwork: s,
          credentialsFile: /etc/egressd/sa.json}
""")
    settings = config.providers[0].settings
    assert isinstance(settings, GcpConfig)
    assert (settings.project, settings.network, settings.network_tags) == (None, "default", ())
    assert (settings.subnetwork, settings.credentials_file) == ("s", "/etc/egressd/sa.json")
    assert config.providers[0].type == "gcp"
    assert parse_providers_config("providers: []\n") == ProvidersConfig(())
    assert parse_providers_config("providers:\n") == ProvidersConfig(())


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param(SPEC_EXAMPLE.replace("zone:", "zonee:"),
                 ["providers[0].gcp.zonee: unknown field",
                  "providers[0].gcp.zone: required field is missing"], id="unknown-key"),
    pytest.param(SPEC_EXAMPLE.replace("type: kubernetes", "type: aws"),
                 ["providers[1].type: unknown type 'aws' (one of gcp, kubernetes)"],
                 id="unknown-type"),
    pytest.param(SPEC_EXAMPLE.replace("name: in-cluster", "name: gcp-eu"),
                 ["providers[1].name: duplicate name 'gcp-eu' (first used by providers[0])"],
                 id="duplicate-name"),
    pytest.param("providers:\n  - name: k\n    type: kubernetes\n",
                 ["providers[0].kubernetes: required for type 'kubernetes' but missing"],
                 id="missing-block"),
    pytest.param("providers:\n  - name: k\n    kubernetes: {namespace: n, image: i}\n",
                 ["providers[0].type: required field is missing (one of gcp, kubernetes)"],
                 id="missing-type"),
    pytest.param(SPEC_EXAMPLE.replace("networkTags: [egressd-proxy]", "networkTags: egressd"),
                 ["providers[0].gcp.networkTags: expected a list of strings, got string"],
                 id="wrong-type-list"),
    pytest.param(SPEC_EXAMPLE.replace("project: my-project", "project: 12345"),
                 ["providers[0].gcp.project: expected a string, got integer"],
                 id="wrong-type-string"),
    pytest.param(SPEC_EXAMPLE.replace("name: gcp-eu", "name: [a]"),
                 ["providers[0].name: expected a string, got list"], id="wrong-type-name"),
    pytest.param("providers:\n  - name: k\n    type: kubernetes\n"
                 "    kubernetes: {namespace: n, image: i}\n    gcp: {}\n",
                 ["providers[0].gcp: not allowed for type 'kubernetes'"], id="other-block"),
    pytest.param(SPEC_EXAMPLE.replace("zone: europe-west1-b", "zone: europe"),
                 ["providers[0].gcp.zone: 'europe' is not a zone (like europe-west1-b)"],
                 id="bad-zone"),
    pytest.param(SPEC_EXAMPLE.replace("namespace: egressd-proxies", "namespace: Bad_NS"),
                 ["providers[1].kubernetes.namespace: 'Bad_NS' is not a namespace name "
                  "(a DNS label)"], id="bad-namespace"),
    pytest.param("providers:\n  - name: k\n    type: kubernetes\n    x: 1\n"
                 "    kubernetes: {namespace: n}\n",
                 ["providers[0].x: unknown field",
                  "providers[0].kubernetes.image: required field is missing"], id="entry-key"),
    pytest.param("providers: {a: 1}\n", ["providers: expected a list, got mapping"],
                 id="providers-not-a-list"),
    pytest.param("providers: []\nprovider: []\n", ["provider: unknown field"],
                 id="top-level-key"),
    pytest.param("{}\n", ["providers: required field is missing"], id="no-providers"),
    pytest.param("", ["empty file: expected a mapping with a 'providers' list"], id="empty"),
    pytest.param("- a\n", ["top level: expected a mapping with a 'providers' list, got list"],
                 id="top-level-list"),
    pytest.param("providers:\n  - name: a\n    name: b\n",
                 ["invalid YAML: line 3, column 5: duplicate key 'name'"], id="duplicate-key"),
    pytest.param("providers: [\n", None, id="bad-yaml"),
])
def test_each_kind_of_mistake_is_reported_with_its_path(
        text: str, expected: list[str] | None) -> None:
    found = problems(text)
    if expected is None:
        assert len(found) == 1 and found[0].startswith("invalid YAML: line 2")
    else:
        assert found == expected


def test_every_problem_is_listed_not_just_the_first() -> None:
    found = problems("""
providers:
  - name: a
    type: gcp
    gcp: {zonee: x, zone: 3, machineType: m, image: i, networkTags: [OK, 7]}
  - name: a
    type: tardis
  - type: kubernetes
    kubernetes: {namespace: ns, image: i, replicas: 2}
  - 42
""")
    assert found == [
        "providers[0].gcp.zonee: unknown field",
        "providers[0].gcp.zone: expected a string, got integer",
        "providers[0].gcp.networkTags[0]: 'OK' is not a network tag "
        "(lower-case letters, digits, '-')",
        "providers[0].gcp.networkTags[1]: expected a string, got integer",
        "providers[1].name: duplicate name 'a' (first used by providers[0])",
        "providers[1].type: unknown type 'tardis' (one of gcp, kubernetes)",
        "providers[2].name: required field is missing",
        "providers[2].kubernetes.replicas: unknown field",
        "providers[3]: expected a mapping, got integer",
    ]


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ProvidersConfigError) as info:
        load_providers_config(str(tmp_path / "missing.yaml"))
    assert info.value.problems == ["cannot read file: No such file or directory"]
    with pytest.raises(ProvidersConfigError) as info:
        load_providers_config(str(tmp_path))
    assert info.value.problems == ["cannot read file: Is a directory"]


# --- egressd check-config ----------------------------------------------------


def test_check_config_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(SPEC_EXAMPLE)
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("ok\n", "")


def test_check_config_prints_every_problem_and_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(SPEC_EXAMPLE.replace("zone:", "zonee:").replace("type: kubernetes",
                                                                    "type: aws"))
    assert main(["check-config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{path}: providers[0].gcp.zonee: unknown field",
        f"{path}: providers[0].gcp.zone: required field is missing",
        f"{path}: providers[1].type: unknown type 'aws' (one of gcp, kubernetes)",
    ]


def test_check_config_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read file" in capsys.readouterr().err


def test_check_config_as_a_command(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(SPEC_EXAMPLE)
    bad.write_text(SPEC_EXAMPLE.replace("name: in-cluster", "name: gcp-eu"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    ok = subprocess.run([sys.executable, "-m", "egressd", "check-config", str(good)],
                        capture_output=True, text=True, env=env, timeout=60)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "ok\n", "")
    failed = subprocess.run([sys.executable, "-m", "egressd", "check-config", str(bad)],
                            capture_output=True, text=True, env=env, timeout=60)
    assert failed.returncode == 2
    assert failed.stderr == (f"{bad}: providers[1].name: duplicate name 'gcp-eu' "
                             "(first used by providers[0])\n")
    assert "Traceback" not in failed.stderr
