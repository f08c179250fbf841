"""Providers create and delete instances; they know nothing of Proxy (docs/providers.md).

The contract, error kinds and naming are re-exported here; the concrete
providers (`kubernetes`, `gcp`) and the config/registry are imported from
their modules so that the GCP client library loads only when configured.
"""

from egressd.providers.contract import (
    CreateRequest,
    Instance,
    InstanceState,
    Placement,
    Provider,
)
from egressd.providers.errors import (
    NotConfigured,
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
    UnknownProvider,
    is_not_configured,
    is_not_found,
    is_permanent,
    is_quota,
    is_transient,
)
from egressd.providers.naming import cluster_selector, gc_labels, instance_name, label_value

__all__ = [
    "CreateRequest",
    "Instance",
    "InstanceState",
    "NotConfigured",
    "NotFound",
    "Permanent",
    "Placement",
    "Provider",
    "ProviderError",
    "QuotaExceeded",
    "Transient",
    "UnknownProvider",
    "cluster_selector",
    "gc_labels",
    "instance_name",
    "is_not_configured",
    "is_not_found",
    "is_permanent",
    "is_quota",
    "is_transient",
    "label_value",
]
