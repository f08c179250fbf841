"""A website for the client's tests, served by trio and h11 on loopback: it answers by
path, and it can tell the proxies apart by the address they connect from (each test
proxy has its own egress address, like the fleet's distinct egress IPs).

    /ok/...        200, a small HTML page
    /limited       429 with Retry-After: 7
    /banned        403, "Access denied"
    /slow          never answers (the client's timeout fires)
    /crawl/N       (on CRAWL_HOST) a page linking to /crawl/0 … /crawl/PAGES-1;
                   the first egress address that fetches a crawl page is rate-limited
                   (429, Retry-After 30) from its second crawl request on, the second
                   is banned (403) from its second on, every other address gets 200
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import h11
import trio

PAGES = 12
CRAWL_HOST = "127.0.0.77"
# More names for the same site: cooldowns are per host name, so a test that bans
# proxies for one name leaves the others' tests alone.
SITE_NAMES = (CRAWL_HOST, "127.0.0.78", "127.0.0.79", "127.0.0.80")
LIMITED_RETRY_AFTER = 7


@dataclass
class Hit:
    path: str
    peer: str
    status: int


@dataclass
class Site:
    port: int = 0
    ports: dict[str, int] = field(default_factory=dict)  # the other addresses it serves on
    hits: list[Hit] = field(default_factory=list)
    crawl_peers: list[str] = field(default_factory=list)
    crawl_counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hits_for(self, prefix: str) -> list[Hit]:
        with self.lock:
            return [h for h in self.hits if h.path.startswith(prefix)]

    def _crawl_status(self, peer: str) -> tuple[int, list[tuple[str, str]]]:
        if peer not in self.crawl_peers:
            self.crawl_peers.append(peer)
        count = self.crawl_counts[peer] = self.crawl_counts.get(peer, 0) + 1
        rank = self.crawl_peers.index(peer)
        if rank == 0 and count > 1:
            return 429, [("Retry-After", "30")]
        if rank == 1 and count > 1:
            return 403, []
        return 200, []

    def answer(self, path: str, peer: str) -> tuple[int, list[tuple[str, str]], bytes] | None:
        """Status, headers and body for `path` seen from `peer`; None: never answer."""
        headers: list[tuple[str, str]] = []
        with self.lock:
            if path.startswith("/ok"):
                status, body = 200, b"<html><body>ok</body></html>"
            elif path == "/limited":
                status, body = 429, b"slow down"
                headers.append(("Retry-After", str(LIMITED_RETRY_AFTER)))
            elif path == "/banned":
                status, body = 403, b"Access denied"
            elif path == "/slow":
                self.hits.append(Hit(path, peer, 0))
                return None
            elif path.startswith("/crawl/"):
                status, headers = self._crawl_status(peer)
                links = "".join(f'<a href="/crawl/{n}">{n}</a>' for n in range(PAGES))
                body = f"<html><body><h1>{path}</h1>{links}</body></html>".encode()
            else:
                status, body = 404, b"no such page"
            self.hits.append(Hit(path, peer, status))
        return status, headers, body

    async def serve(self, *, task_status: trio.TaskStatus[Site] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        for host in SITE_NAMES:
            more = await trio.open_tcp_listeners(0, host=host)
            self.ports[host] = more[0].socket.getsockname()[1]
            listeners += more
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(self)

    async def _handle(self, stream: trio.SocketStream) -> None:
        peer = stream.socket.getpeername()[0]
        conn = h11.Connection(h11.SERVER)
        try:
            request = None
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(bytes(data))
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            assert request is not None
            target = request.target.decode()
            path = "/" + target.split("://", 1)[-1].split("/", 1)[-1] if "://" in target \
                else target
            answer = self.answer(path, peer)
            if answer is None:
                await trio.sleep_forever()
                return
            status, headers, body = answer
            headers += [("Content-Type", "text/html"), ("Content-Length", str(len(body))),
                        ("Connection", "close")]
            await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers))
                                  or b"")
            await stream.send_all(conn.send(h11.Data(data=body)) or b"")
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
        except (trio.BrokenResourceError, h11.RemoteProtocolError):
            pass
        finally:
            await trio.aclose_forcefully(stream)
