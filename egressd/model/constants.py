"""Names and defaults of the Proxy resource (docs/reference.md) that every layer shares.

The wire strings live here once, so a typo in a finalizer or a condition type
is a NameError, not a silent mismatch with the CRD.
"""

from __future__ import annotations

import enum

GROUP = "crawl.example.com"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Proxy"
PLURAL = "proxies"
SINGULAR = "proxy"
SHORT_NAMES = ("px",)
CRD_NAME = f"{PLURAL}.{GROUP}"

FINALIZER = f"{GROUP}/instance-cleanup"
SPEC_HASH_ANNOTATION = f"{GROUP}/spec-hash"
# Only Secrets with this label set to "true" are watched for cloud-init (docs/architecture.md).
CLOUD_INIT_LABEL = f"{GROUP}/cloud-init"

COND_PROVISIONED = "Provisioned"
COND_HEALTHY = "Healthy"

# Condition status values, as metav1.Condition spells them.
STATUS_TRUE = "True"
STATUS_FALSE = "False"
STATUS_UNKNOWN = "Unknown"
CONDITION_STATUSES = (STATUS_TRUE, STATUS_FALSE, STATUS_UNKNOWN)

# Key of the global entry in status.cooldowns (docs/reference.md).
GLOBAL_COOLDOWN_KEY = "*"

DEFAULT_MAX_LEASES = 10
DEFAULT_PORT = 3128
DEFAULT_PROBE_URL = "https://www.gstatic.com/generate_204"
DEFAULT_INTERVAL_SECONDS = 30
DEFAULT_TIMEOUT_SECONDS = 10
DEFAULT_SUCCESS_THRESHOLD = 1
DEFAULT_FAILURE_THRESHOLD = 3
DEFAULT_SECRET_KEY = "user-data"  # noqa: S105 - a Secret key name, not a secret
MAX_ATTRIBUTES = 32


class Mode(enum.StrEnum):
    """How a proxy comes to exist: provisioned by egressd, or already there."""

    MANAGED = "Managed"
    EXTERNAL = "External"


class Phase(enum.StrEnum):
    """The one-word summary in `status.phase` (derivation: docs/reference.md)."""

    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    READY = "Ready"
    UNHEALTHY = "Unhealthy"
    FAILED = "Failed"
    DELETING = "Deleting"
