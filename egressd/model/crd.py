"""The Proxy CRD (manifests/crd.yaml) as a dict, read from the installed package.

`egressd/model/crd.yaml` is a git symlink to `../../manifests/crd.yaml`, so the
manifest operators apply and the copy the sandbox installs are one file.
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Any

import yaml


@functools.cache
def _crd_text() -> str:
    return importlib.resources.files("egressd.model").joinpath("crd.yaml").read_text("utf-8")


def load_crd() -> dict[str, Any]:
    """A fresh copy of the CRD (callers may mutate it)."""
    crd = yaml.safe_load(_crd_text())
    if not isinstance(crd, dict):
        raise TypeError("egressd/model/crd.yaml is not a YAML mapping")
    return crd
