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

# ----- ProxyPool (issue 13)

POOL_KIND = "ProxyPool"
POOL_PLURAL = "proxypools"
POOL_SINGULAR = "proxypool"
POOL_SHORT_NAMES = ("pxp",)
POOL_CRD_NAME = f"{POOL_PLURAL}.{GROUP}"
# Every Proxy a pool owns carries this label with the pool's name; it is the pool's
# selector (status.labelSelector, for the scale subresource and an HPA).
POOL_LABEL = f"{GROUP}/pool"
# The hash of the template a Proxy was made from (a rollout replaces the others).
POOL_TEMPLATE_HASH_LABEL = f"{GROUP}/pool-template-hash"
# Set on a Proxy the pool retires; the value is when draining started (RFC 3339).
DRAINING_ANNOTATION = f"{GROUP}/draining-since"
COND_DRAINING = "Draining"

DEFAULT_POOL_REPLICAS = 1
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_UNAVAILABLE = 1
DEFAULT_MAX_SURGE = 1
DEFAULT_DRAIN_TIMEOUT_SECONDS = 600
DEFAULT_POOL_FAILURE_THRESHOLD = 3
DEFAULT_TARGET_UTILIZATION = 70
DEFAULT_SCALE_UP_WINDOW_SECONDS = 60
DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS = 300
DEFAULT_MAX_REPLACEMENTS_PER_MINUTE = 1

# Pool condition types.
COND_AVAILABLE = "Available"
COND_PROGRESSING = "Progressing"
COND_REPLICA_FAILURE = "ReplicaFailure"
COND_PROVIDER_READY = "ProviderReady"
COND_SCALING_ACTIVE = "ScalingActive"
COND_SCALING_LIMITED = "ScalingLimited"
