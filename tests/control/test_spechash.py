"""The spec hash: stable, sensitive to each input, insensitive to key order and empty forms."""

from __future__ import annotations

import hashlib

import pytest

from egressd.control.spechash import canonical_json, spec_hash
from egressd.model.proxy import Placement

BASE = {"provider": "gcp-eu", "placement": Placement("europe-west1-b", machine_type="e2-micro"),
        "cloud_init": "#cloud-config\npackages: [squid]\n", "port": 3128}


def test_stable_known_value() -> None:
    # Pinned: a change here replaces every Managed proxy of every cluster.
    doc = ('{"cloudInit":"#cloud-config\\npackages: [squid]\\n","placement":'
           '{"machineType":"e2-micro","zone":"europe-west1-b"},"port":3128,'
           '"provider":"gcp-eu"}')
    assert spec_hash(**BASE) == hashlib.sha256(doc.encode()).hexdigest()
    assert spec_hash(**BASE) == spec_hash(**BASE)
    assert len(spec_hash(**BASE)) == 64


@pytest.mark.parametrize("change", [
    {"provider": "gcp-us"},  # the instance lives on the old provider: a new one is needed
    {"placement": Placement("europe-west1-c", machine_type="e2-micro")},
    {"placement": Placement("europe-west1-b", machine_type="e2-small")},
    {"placement": Placement("europe-west1-b", region="europe-west1", machine_type="e2-micro")},
    {"placement": None},
    {"cloud_init": "#cloud-config\npackages: [tinyproxy]\n"},
    {"cloud_init": BASE["cloud_init"] + " "},
    {"cloud_init": ""},
    {"port": 3129},
])
def test_sensitive_to_each_input(change: dict[str, object]) -> None:
    assert spec_hash(**{**BASE, **change}) != spec_hash(**BASE)


def test_insensitive_to_key_order_and_empty_forms() -> None:
    as_map = spec_hash(provider="gcp-eu",
                       placement={"machineType": "e2-micro", "zone": "europe-west1-b"},
                       cloud_init=BASE["cloud_init"], port=3128)
    reordered = spec_hash(provider="gcp-eu",
                          placement={"zone": "europe-west1-b", "machineType": "e2-micro",
                                     "region": None},
                          cloud_init=BASE["cloud_init"], port=3128)
    assert as_map == reordered == spec_hash(**BASE)
    empty = {"provider": "p", "cloud_init": "x", "port": 1}
    assert spec_hash(placement=None, **empty) == spec_hash(
        placement=Placement(), **empty) == spec_hash(placement={}, **empty)


def test_canonical_json() -> None:
    assert canonical_json({"b": 1, "a": {"d": "é", "c": None}}) == '{"a":{"c":null,"d":"é"},"b":1}'
