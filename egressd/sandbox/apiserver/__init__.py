"""A faithful fake Kubernetes API server: tests and `egressd sandbox` run against it.

Modules: `server` (FakeApiServer, serving and direct access), `app` (auth,
faults, dispatch), `routing` (URL to resource or document), `registry` (the
served types, CRDs included), `reads` (get, list), `watch` (watch streams),
`verbs` (create, replace, patch, apply, delete over HTTP), `writes` (the write
pipeline they share), `bodies` (request bodies and write parameters),
`respond` (rendering), `store` (objects, resourceVersion, history, watch
fan-out), `wire` (HTTP/1.1 over TLS with h11), `discovery`, `openapi`, `table`
(server-side printing), `patch`, `selectors`, `builtin` (kind rules),
`validation` (CRD schema enforcement, with `egressd.sandbox.schema`), `faults`,
`tls` (CA, kubeconfig), `crd` (the Proxy CRD installed by default), `errors`
(Status bodies).
"""

from egressd.sandbox.apiserver.errors import ApiError
from egressd.sandbox.apiserver.faults import FaultRule, Faults
from egressd.sandbox.apiserver.server import FakeApiServer, ServerNotRunning

__all__ = ["ApiError", "FakeApiServer", "FaultRule", "Faults", "ServerNotRunning"]
