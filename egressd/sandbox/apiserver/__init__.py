"""A faithful fake Kubernetes API server: tests and `egressd sandbox` run against it.

Modules: `server` (FakeApiServer, serving and direct access), `app` (routing
and verbs), `store` (objects, resourceVersion, history, watch fan-out),
`wire` (HTTP/1.1 over TLS with h11), `discovery`, `openapi`, `table`
(server-side printing), `patch`, `selectors`, `builtin` (kind rules),
`validation` (CRD schema enforcement), `faults`, `tls` (CA, kubeconfig),
`crd` (the Proxy CRD installed by default), `errors` (Status bodies).
"""

from egressd.sandbox.apiserver.errors import ApiError
from egressd.sandbox.apiserver.faults import FaultRule, Faults
from egressd.sandbox.apiserver.server import FakeApiServer, ServerNotRunning

__all__ = ["ApiError", "FakeApiServer", "FaultRule", "Faults", "ServerNotRunning"]
