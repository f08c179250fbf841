"""What the discovery and ops apps share: JSON responses and JSON-shaped framework errors."""

from __future__ import annotations

import json
import re
from typing import Any

from quart import Response
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from egressd.http.wire import ApiError, codec


def json_response(body: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(body, separators=(",", ":")), status=status, content_type="application/json")


def no_content() -> Response:
    """A 204: no body, so no content type either (Quart would say text/html)."""
    response = Response(b"", status=204)
    del response.headers["Content-Type"]
    return response


def reply(value: object, status: int = 200) -> Response:
    """A wire class (`egressd.http.wire`) as a JSON answer."""
    return json_response(codec.unstructure(value), status)


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def new_app(name: str) -> QuartTrio:
    """A Quart-Trio app whose every error answer is `{"error": code, "message": text}`."""
    app = QuartTrio(name)
    # Errors escape to the recovery middleware (outermost), which logs and answers 500.
    app.config["PROPAGATE_EXCEPTIONS"] = True
    # The body cap is the middleware's (64 KiB); Quart's own limit must not pre-empt it.
    app.config["MAX_CONTENT_LENGTH"] = None
    # Quart's response timeout cannot cut a stalled socket write (Hypercorn shields it);
    # all it can cut is Hypercorn's bookkeeping after the write, which leaves the
    # keep-alive connection waiting forever for a next request it will never read.
    app.config["RESPONSE_TIMEOUT"] = None

    @app.errorhandler(ApiError)
    async def api_error(err: ApiError) -> Response:
        return json_response(err.body(), err.status)

    @app.errorhandler(HTTPException)
    async def http_error(err: HTTPException) -> Response:
        # Quart's own 404, 405, 400...: same shape as ours.
        response = json_response(
            {"error": _snake(err.name), "message": err.description or err.name}, err.code or 500)
        allow = getattr(err, "valid_methods", None)
        if allow:
            response.headers["Allow"] = ", ".join(allow)
        return response

    return app
