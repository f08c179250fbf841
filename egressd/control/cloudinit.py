"""Step 3 of a Managed pass (docs/architecture.md): the cloud-init text an instance is built from.

Inline text, or a key of a Secret in the Proxy's namespace read from the
labelled-Secret cache. A missing Secret or key, or a value that is not base64
UTF-8, is `Unresolved` with a message that names the Secret and key, never
the content (docs/reference.md).
"""

from __future__ import annotations

import base64
import binascii

from egressd.kube.informer import Informer
from egressd.model.constants import CLOUD_INIT_LABEL
from egressd.model.proxy import Proxy


class Unresolved(Exception):
    """The cloud-init's Secret or key is missing or unreadable (the message says which)."""


def resolve_cloud_init(proxy: Proxy, secrets: Informer) -> str:
    """The inline text, or the Secret key's decoded value; "" without a cloudInit."""
    cloud_init = proxy.spec.cloud_init
    if cloud_init is None:
        return ""
    if cloud_init.inline is not None:
        return cloud_init.inline
    ref = cloud_init.secret_ref
    assert ref is not None  # the CRD requires exactly one of the two
    secret_key = f"{proxy.metadata.namespace}/{ref.name}"
    secret = secrets.get(secret_key)
    if secret is None:
        raise Unresolved(f"Secret {secret_key} not found (it must be labelled "
                         f"{CLOUD_INIT_LABEL}=true)")
    value = (secret.get("data") or {}).get(ref.key)
    if not isinstance(value, str):
        raise Unresolved(f"Secret {secret_key} has no key {ref.key!r}")
    try:
        return base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise Unresolved(
            f"Secret {secret_key} key {ref.key!r} is not base64 UTF-8 text") from None
