"""The Proxy and ProxyPool CRDs (manifests/crd.yaml, manifests/proxypool-crd.yaml) as
dicts, read from the installed package.

`egressd/model/crd.yaml` and `egressd/model/proxypool-crd.yaml` are git symlinks into
`../../manifests/`, so the manifests operators apply and the copies the sandbox
installs are one file each.
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Any

import yaml

PROXY_CRD_FILE = "crd.yaml"
POOL_CRD_FILE = "proxypool-crd.yaml"


@functools.cache
def _crd_text(name: str) -> str:
    return importlib.resources.files("egressd.model").joinpath(name).read_text("utf-8")


def _load(name: str) -> dict[str, Any]:
    crd = yaml.safe_load(_crd_text(name))
    if not isinstance(crd, dict):
        raise TypeError(f"egressd/model/{name} is not a YAML mapping")
    return crd


def load_crd() -> dict[str, Any]:
    """A fresh copy of the Proxy CRD (callers may mutate it)."""
    return _load(PROXY_CRD_FILE)


def load_pool_crd() -> dict[str, Any]:
    """A fresh copy of the ProxyPool CRD (callers may mutate it)."""
    return _load(POOL_CRD_FILE)
