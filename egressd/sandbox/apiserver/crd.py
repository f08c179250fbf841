"""The Proxy CRD the server installs by default: the packaged manifest.

It is `egressd.model.crd.load_crd()` (manifests/crd.yaml), so the sandbox
enforces exactly the schema and CEL rules operators apply to a cluster. A
missing or broken manifest is an error at start, never a silently
schema-less server.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from egressd.model.crd import load_crd, load_pool_crd


def proxy_crd() -> dict[str, Any]:
    """The Proxy CRD as a dict (a fresh copy: callers may mutate it)."""
    return copy.deepcopy(_proxy_crd())


# Parsing the YAML costs ~90 ms (pure-Python yaml); tests build many servers.
@functools.lru_cache(maxsize=1)
def _proxy_crd() -> dict[str, Any]:
    return load_crd()


def pool_crd() -> dict[str, Any]:
    """The ProxyPool CRD as a dict (a fresh copy)."""
    return copy.deepcopy(_pool_crd())


@functools.lru_cache(maxsize=1)
def _pool_crd() -> dict[str, Any]:
    return load_pool_crd()
