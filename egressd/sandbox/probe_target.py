"""The sandbox's local TLS probe target: `GET /generate_204` answers 204 (docs/reference.md).

    target = ProbeTargetServer()
    url = await nursery.start(target.serve)     # https://127.0.0.1:PORT/generate_204
    target.write_ca(path)                        # for the daemon's --probe-ca-file

Its certificate comes from a trustme CA made for this process, so the
sample Proxies reach Ready with no internet access. Any other path is 404.
"""

from __future__ import annotations

import logging
import ssl

import h11
import trio
import trustme

log = logging.getLogger(__name__)

PROBE_PATH = "/generate_204"
MAX_HEAD = 16 * 1024
# A client that keeps a connection open without sending a request is dropped
# after this long (probes never reuse connections; curl closes at once).
IDLE_TIMEOUT = 30.0


class ProbeTargetServer:
    """An HTTPS server on loopback whose `/generate_204` answers 204 No Content."""

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.hits = 0
        """Requests answered on the probe path (tests read it)."""
        self._ca = trustme.CA()
        self._server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ca.issue_cert(host, "localhost").configure_cert(self._server_ssl)
        self._server_ssl.set_alpn_protocols(["http/1.1"])

    @property
    def ca_pem(self) -> bytes:
        """The CA that signed the server's certificate (PEM)."""
        return bytes(self._ca.cert_pem.bytes())

    @property
    def url(self) -> str:
        """The probe URL (after `serve` started)."""
        return f"https://{self.host}:{self.port}{PROBE_PATH}"

    def write_ca(self, path: str) -> str:
        """Write the CA (PEM) to `path`; returns the path."""
        with open(path, "wb") as handle:
            handle.write(self.ca_pem)
        return path

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Listen on a free port of `host` until cancelled; `started(probe URL)`."""
        listeners = await trio.open_tcp_listeners(0, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        tls = [trio.SSLListener(listener, self._server_ssl, https_compatible=True)
               for listener in listeners]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, tls)
            log.info("probe target listening", extra={"url": self.url})
            task_status.started(self.url)

    async def _handle(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        try:
            while True:
                more = False
                with trio.move_on_after(IDLE_TIMEOUT):
                    more = await self._answer(stream, conn)
                if not more:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return  # a client that hung up or spoke garbage: nothing to answer
        finally:
            await trio.aclose_forcefully(stream)

    async def _answer(self, stream: trio.SSLStream[trio.SocketStream],
                      conn: h11.Connection) -> bool:
        """Read one request and answer it; False when the connection is done."""
        request: h11.Request | None = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(MAX_HEAD)))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return False
        assert request is not None
        if request.target.split(b"?", 1)[0] == PROBE_PATH.encode():
            self.hits += 1
            response = h11.Response(status_code=204, headers=[])
            body = b""
        else:
            body = b"not found\n"
            response = h11.Response(status_code=404, headers=[
                ("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        await stream.send_all(conn.send(response) or b"")
        if body:
            await stream.send_all(conn.send(h11.Data(data=body)) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            return False
        conn.start_next_cycle()
        return True
