"""Deterministic instance names and the GC label set (docs/providers.md).

The name depends only on the Proxy's uid and spec hash, so a crash between
create and the status write re-finds the same instance and a replacement gets
a new one. Label values must be valid for both Kubernetes and GCP labels.
"""

from __future__ import annotations

import base64
import hashlib
import re

MANAGED_BY = "egressd-managed-by"
CLUSTER = "egressd-cluster"
PROXY_UID = "egressd-proxy-uid"
PROXY = "egressd-proxy"
MANAGED_BY_VALUE = "egressd"

MAX_LABEL_VALUE = 63
# Characters allowed in both a GCP label value ([a-z0-9_-], no upper case) and
# a Kubernetes one ([A-Za-z0-9_.-], starting and ending alphanumeric).
_NOT_ALLOWED = re.compile(r"[^a-z0-9_-]")
_EDGE = re.compile(r"^[^a-z0-9]+|[^a-z0-9]+$")
# Suffix appended when a value is shortened: "-" + 8 hex digits of its SHA-256,
# so two long values sharing a 63-character prefix still get distinct labels.
_HASH_CHARS = 8


def instance_name(proxy_uid: str, spec_hash: str) -> str:
    """`px-` + the first 16 characters of the lower-case base32 of SHA-256(`uid/hash`).

    Base32's alphabet (a-z, 2-7) keeps the name a valid DNS label and GCE name.
    """
    digest = hashlib.sha256(f"{proxy_uid}/{spec_hash}".encode()).digest()
    return "px-" + base64.b32encode(digest).decode("ascii").lower()[:16]


def label_value(text: str) -> str:
    """`text` made into a label value valid for both Kubernetes and GCP.

    Lower-cased, `.` and every other disallowed character become `-`, leading
    and trailing non-alphanumerics are dropped, and a value longer than 63
    characters is cut and ends in a short hash of the original. Idempotent.
    """
    value = _EDGE.sub("", _NOT_ALLOWED.sub("-", text.lower()))
    if len(value) <= MAX_LABEL_VALUE:
        return value
    digest = hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]
    head = _EDGE.sub("", value[: MAX_LABEL_VALUE - _HASH_CHARS - 1])
    return f"{head}-{digest}" if head else digest


def gc_labels(*, cluster: str, proxy_uid: str, namespace: str, name: str) -> dict[str, str]:
    """The labels every instance carries, so orphan GC can find and attribute it."""
    return {
        MANAGED_BY: MANAGED_BY_VALUE,
        CLUSTER: label_value(cluster),
        PROXY_UID: label_value(proxy_uid),
        PROXY: label_value(f"{namespace}_{name}"),
    }


def cluster_selector(cluster: str) -> dict[str, str]:
    """The labels that select every instance this cluster's egressd manages."""
    return {MANAGED_BY: MANAGED_BY_VALUE, CLUSTER: label_value(cluster)}
