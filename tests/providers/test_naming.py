"""Instance names and GC labels (SPEC §4), including a property test of label values."""

from __future__ import annotations

import base64
import hashlib
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from egressd.providers import gc_labels, instance_name, label_value
from egressd.providers.naming import cluster_selector

# Kubernetes: at most 63, empty or alphanumeric at both ends, [-A-Za-z0-9_.] inside.
K8S_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# GCP: at most 63, lower-case letters, digits, '_' and '-' (no upper case).
GCP_VALUE = re.compile(r"^[a-z0-9_-]*$")
GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def test_instance_name_is_px_and_16_base32_chars_of_the_sha256() -> None:
    uid, spec_hash = "6a1d2f3e-0000-4000-8000-000000000001", "e3b0c442" * 8
    digest = hashlib.sha256(f"{uid}/{spec_hash}".encode()).digest()
    expected = "px-" + base64.b32encode(digest).decode().lower()[:16]
    assert instance_name(uid, spec_hash) == expected == "px-7qs2e73u7cp4ojbx"


@given(st.text(), st.text())
def test_instance_names_are_deterministic_valid_and_differ_with_the_spec(
        uid: str, spec_hash: str) -> None:
    name = instance_name(uid, spec_hash)
    assert name == instance_name(uid, spec_hash)
    assert len(name) == 19
    assert GCE_NAME.match(name)  # also a valid DNS label (Pod name)
    assert name != instance_name(uid, spec_hash + "x")


def test_gc_labels() -> None:
    assert gc_labels(cluster="Prod.EU", proxy_uid="6A1D-77", namespace="crawl",
                     name="eu.proxy-1") == {
        "egressd-managed-by": "egressd",
        "egressd-cluster": "prod-eu",
        "egressd-proxy-uid": "6a1d-77",
        "egressd-proxy": "crawl_eu-proxy-1",
    }
    assert cluster_selector("Prod.EU") == {"egressd-managed-by": "egressd",
                                           "egressd-cluster": "prod-eu"}


def test_long_values_are_cut_with_a_hash_so_they_stay_distinct() -> None:
    a = label_value("crawl_" + "a" * 80 + "-one")
    b = label_value("crawl_" + "a" * 80 + "-two")
    assert len(a) == len(b) == 63
    assert a != b
    assert a.startswith("crawl_aaaa")


@given(st.text())
def test_label_values_are_valid_for_kubernetes_and_gcp(text: str) -> None:
    value = label_value(text)
    assert len(value) <= 63
    assert K8S_VALUE.match(value), value
    assert GCP_VALUE.match(value), value
    assert label_value(value) == value  # idempotent: a label read back maps to itself


_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


def dns_name(inner: str, max_inner: int) -> st.SearchStrategy[str]:
    """Kubernetes-style names: alphanumeric at both ends, `inner` characters between."""
    return st.builds(lambda a, mid, b: a + mid + b, st.sampled_from(_ALNUM),
                     st.text(inner, max_size=max_inner), st.sampled_from(_ALNUM))


@settings(max_examples=50)
@given(dns_name(_ALNUM + "-", 61), dns_name(_ALNUM + "-.", 120))
def test_proxy_label_keeps_short_namespace_and_name(namespace: str, name: str) -> None:
    value = gc_labels(cluster="c", proxy_uid="u", namespace=namespace, name=name)["egressd-proxy"]
    if len(namespace) + 1 + len(name) <= 63:
        assert value == f"{namespace}_{name.replace('.', '-')}"
    assert K8S_VALUE.match(value) and GCP_VALUE.match(value) and len(value) <= 63
