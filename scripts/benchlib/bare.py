"""The bare baseline: Hypercorn + Quart-Trio with the discovery API's two lease routes,
answering constant JSON (no middleware, no store, no cache).

    python -m benchlib.bare PORT

What egressd's stack can do at best on this machine: P1's ratios divide by it.
`GET /lag` answers the loop watchdog's p99 and max over its last 10 s (not a
lease route: wrk never calls it).
"""

from __future__ import annotations

import json
import sys

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart import Response, request
from quart_trio import QuartTrio

from egressd.watchdog import LoopWatchdog

GRANT = json.dumps({
    "leaseId": "bare-lease-0000000000000000", "proxyUrl": "http://127.0.0.1:3128",
    "expiresAt": "2030-01-01T00:00:00Z", "activeLeases": 1,
    "proxy": {"namespace": "bench", "name": "px-00000", "host": "127.0.0.1", "port": 3128,
              "attributes": {"bench": "true", "zone": "z0"}, "healthy": True,
              "latencyMs": 5, "activeLeases": 1, "maxLeases": 10, "phase": "Ready",
              "cooldowns": {}},
}, separators=(",", ":"))


def create_app(watchdog: LoopWatchdog) -> QuartTrio:
    app = QuartTrio("bench.bare")

    @app.get("/lag")
    async def lag() -> Response:
        # The same loop watchdog as the daemon's: what lateness the stack alone shows.
        return Response(json.dumps({"lag_p99_ms": watchdog.p99() * 1000,
                                    "lag_max_ms": watchdog.max() * 1000}),
                        content_type="application/json")

    @app.post("/v1/leases")
    async def acquire() -> Response:
        await request.get_data()  # read the body, as the real route does
        return Response(GRANT, status=201, content_type="application/json")

    @app.delete("/v1/leases/<lease_id>")
    async def release(lease_id: str) -> Response:
        return Response("", status=204)

    return app


def main() -> None:
    config = Config()
    config.bind = [f"127.0.0.1:{int(sys.argv[1])}"]
    config.accesslog = None
    config.loglevel = "WARNING"  # no 'Running on' line in the bench's output
    trio.run(_serve, config)


async def _serve(config: Config) -> None:
    watchdog = LoopWatchdog()
    async with trio.open_nursery() as nursery:
        await nursery.start(watchdog.run)
        await serve(create_app(watchdog), config)


if __name__ == "__main__":
    main()
