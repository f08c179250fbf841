"""The ops app on `--metrics-addr` (docs/reference.md): `/metrics`, `/healthz`, `/readyz`."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from quart import Response
from quart_trio import QuartTrio

from egressd.http import middleware
from egressd.http.common import json_response, new_app
from egressd.http.source import ProxySource
from egressd.metrics import REGISTRY


def create_ops_app(source: ProxySource) -> QuartTrio:
    """Liveness is the process answering; readiness is the proxy cache having synced."""
    app = new_app("egressd.ops")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(REGISTRY), status=200, content_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        if source.synced.is_set():
            return json_response({"status": "ready"})
        return json_response(
            {"error": "not_ready", "message": "the proxy cache has not synced yet"}, 503)

    app.asgi_app = middleware.recovery(app.asgi_app)  # type: ignore[method-assign,assignment]
    return app
