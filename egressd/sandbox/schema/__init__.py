"""A CRD's structural schema enforced the way kube-apiserver enforces it.

The fake API server uses `CRDSchema` for any custom resource it serves:
`prune` drops unknown fields (reporting their paths, which the server turns
into `unknown field` warnings), `apply_defaults` fills structural defaults,
and `validate` runs the OpenAPI checks and then every `x-kubernetes-validations`
CEL rule (cel-python), returning errors worded as the API server words its
`StatusCause`s, so clients (kubectl, egressd's kube layer) see what a real
cluster would say. A typical write is `validate(apply_defaults(prune(obj)[0]))`.

Fidelity notes (deliberate gaps, recorded in docs/decisions.md):
* `metadata` is left to the server (ObjectMeta rules), as in Kubernetes; the
  root CEL `self` sees only `metadata.name` and `metadata.generateName`.
* `format` checks cover `date-time` and `date`; other formats pass.
* `allOf`/`anyOf`/`oneOf`/`not` are not evaluated (none of our CRDs use them);
  validation ratcheting of unchanged invalid fields is not emulated.
* Patterns run through Python's `re`, which agrees with RE2 on ordinary patterns.
"""

from egressd.sandbox.schema.crd import CRDSchema
from egressd.sandbox.schema.values import (
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    NOT_SUPPORTED,
    REQUIRED,
    RULES_NOT_CHECKED,
    TOO_LONG,
    TOO_MANY,
    TYPE_INVALID,
    FieldError,
    SchemaError,
    invalid_message,
)

__all__ = ["DUPLICATE", "FORBIDDEN", "INVALID", "NOT_SUPPORTED", "REQUIRED", "RULES_NOT_CHECKED",
           "TOO_LONG", "TOO_MANY", "TYPE_INVALID", "CRDSchema", "FieldError", "SchemaError",
           "invalid_message"]
