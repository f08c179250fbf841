"""The Proxy CRD the server installs by default.

It comes from `egressd.model.crd.load_crd()` (the packaged manifest); while
that is missing, from `manifests/crd.yaml` of a source checkout; and as a
last resort from a minimal built-in definition with the same names, printer
columns and status subresource (no schema rules).
"""

from __future__ import annotations

import copy
import functools
import importlib
import pathlib
from typing import Any

import yaml

_COLUMNS = [
    {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Host", "type": "string", "jsonPath": ".status.host"},
    {"name": "Port", "type": "integer", "jsonPath": ".status.port"},
    {"name": "Healthy", "type": "string",
     "jsonPath": '.status.conditions[?(@.type=="Healthy")].status'},
    {"name": "Latency", "type": "integer", "jsonPath": ".status.latencyMs"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

MINIMAL_PROXY_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "proxies.crawl.example.com"},
    "spec": {
        "group": "crawl.example.com",
        "scope": "Namespaced",
        "names": {"plural": "proxies", "singular": "proxy", "kind": "Proxy",
                  "listKind": "ProxyList", "shortNames": ["px"]},
        "versions": [{
            "name": "v1alpha1", "served": True, "storage": True,
            "subresources": {"status": {}},
            "additionalPrinterColumns": _COLUMNS,
            "schema": {"openAPIV3Schema": {"type": "object",
                                           "x-kubernetes-preserve-unknown-fields": True}},
        }],
    },
}


def proxy_crd() -> dict[str, Any]:
    """The Proxy CRD as a dict (packaged, else from the checkout, else minimal)."""
    return copy.deepcopy(_proxy_crd())


# Parsing the YAML costs ~90 ms (pure-Python yaml); tests build many servers.
@functools.lru_cache(maxsize=1)
def _proxy_crd() -> dict[str, Any]:
    try:
        module = importlib.import_module("egressd.model.crd")
        crd: dict[str, Any] = module.load_crd()
        return crd
    except (ImportError, AttributeError, FileNotFoundError):
        pass
    manifest = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "crd.yaml"
    if manifest.is_file():
        for doc in yaml.safe_load_all(manifest.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                return doc
    return MINIMAL_PROXY_CRD
