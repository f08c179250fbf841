"""The deployment manifests hold together and keep their security promises (SPEC §10)."""

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

MANIFESTS = Path(__file__).parent.parent / "manifests"


def docs() -> list[dict[str, Any]]:
    out = []
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    for name in kustomization["resources"]:
        out.extend(d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d)
    return out


def find(kind: str) -> list[dict[str, Any]]:
    return [d for d in docs() if d["kind"] == kind]


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_deployment_is_non_root_read_only_and_probed() -> None:
    (deployment,) = find("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    token = next(e for e in container["env"] if e["name"] == "DISCOVERY_TOKEN")
    assert "secretKeyRef" in token["valueFrom"]


def test_rbac_grants_only_what_egressd_uses() -> None:
    (role,) = find("ClusterRole")
    grants = {(g, r): set(rule["verbs"]) for rule in role["rules"]
              for g in rule["apiGroups"] for r in rule["resources"]}
    # The cloud-init cache lists and watches; nothing gets a Secret by name.
    assert grants[("", "secrets")] == {"list", "watch"}
    # Cluster-wide Pods: list only (orphan GC); writes are per provider namespace.
    assert grants[("", "pods")] == {"list"}
    assert grants[("", "events")] == {"create", "patch"}
    assert "delete" not in grants[("crawl.example.com", "proxies")]
    assert all("*" not in verbs for verbs in grants.values())
    assert not any(r == "leases" for _, r in grants), "leases are a namespaced Role"


def test_each_provider_namespace_has_a_role_for_its_pod_writes() -> None:
    (config,) = find("ConfigMap")
    providers = yaml.safe_load(config["data"]["providers.yaml"])["providers"]
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in find("Role")}
    bound = {(d["metadata"]["namespace"], d["roleRef"]["name"]) for d in find("RoleBinding")
             if {"kind": "ServiceAccount", "name": "egressd", "namespace": "egressd"}
             in d["subjects"]}
    for entry in providers:
        if entry["type"] != "kubernetes":
            continue
        namespace = entry["kubernetes"]["namespace"]
        verbs = {verb for (ns, name), role in roles.items() if ns == namespace
                 and (ns, name) in bound for rule in role["rules"]
                 if "pods" in rule["resources"] for verb in rule["verbs"]}
        assert {"create", "delete", "get", "watch"} <= verbs, namespace


def test_the_provider_namespace_in_the_config_is_created() -> None:
    (config,) = find("ConfigMap")
    providers = yaml.safe_load(config["data"]["providers.yaml"])["providers"]
    namespaces = {d["metadata"]["name"] for d in find("Namespace")}
    for entry in providers:
        if entry["type"] == "kubernetes":
            assert entry["kubernetes"]["namespace"] in namespaces


def test_the_image_build_copies_what_package_symlinks_point_to() -> None:
    # egressd/model/crd.yaml is a symlink into manifests/: a build context without
    # manifests/ makes a wheel without the CRD.
    root = MANIFESTS.parent
    copied = {line.split()[1] for line in (root / "Containerfile").read_text().splitlines()
              if line.startswith("COPY ") and "--from" not in line}
    for link in (root / "egressd").rglob("*"):
        if link.is_symlink():
            target = link.resolve().relative_to(root)
            assert target.parts[0] in copied, f"{link} -> {target}: not copied"


def test_no_token_placeholder_is_applied_and_the_readme_creates_the_secret() -> None:
    """A Secret in the kustomization would be reset by every re-apply: the token
    Secret is made once by the README's command, and the Deployment reads that one."""
    assert not [d for d in find("Secret") if "DISCOVERY_TOKEN" in
                {**d.get("stringData", {}), **d.get("data", {})}]
    (deployment,) = find("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ref = next(e for e in container["env"]
               if e["name"] == "DISCOVERY_TOKEN")["valueFrom"]["secretKeyRef"]
    assert not ref.get("optional")  # Pods wait for it rather than start unauthenticated
    readme = (MANIFESTS.parent / "README.md").read_text()
    namespace = deployment["metadata"]["namespace"]
    command = (f"kubectl -n {namespace} create secret generic {ref['name']} \\\n"
               f"    --from-literal={ref['key']}=\"$(openssl rand -hex 32)\"")
    assert command in readme
    assert readme.index("kubectl apply -k manifests/") < readme.index(command)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_kustomization_renders_with_kubectl(tmp_path: Path) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(MANIFESTS)], capture_output=True,
                         text=True, timeout=60, check=False,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "KUBECONFIG": str(tmp_path / "none")})
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["kind"] for d in rendered) == sorted(d["kind"] for d in docs())
    assert "Secret" not in {d["kind"] for d in rendered}


def test_every_field_of_the_proxy_schema_is_described() -> None:
    """`kubectl explain proxy.spec` (and every field below) prints the CRD's descriptions."""
    (crd,) = [c for c in find("CustomResourceDefinition")
              if c["metadata"]["name"] == "proxies.crawl.example.com"]
    (version,) = crd["spec"]["versions"]
    missing = []

    def walk(node: dict[str, Any], path: str) -> None:
        if not str(node.get("description") or "").strip():
            missing.append(path)
        for name, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}.*")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(version["schema"]["openAPIV3Schema"], "proxy")
    assert missing == []
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert all(columns[name].get("priority") == 1 for name in ("Provider-ID", "IP"))
