"""How `egressd run` stops (issue 19 item 5): SIGTERM → exit, as a process.

Each test runs the real command against the project's fake API server and
asserts the order of events (signal, Lease released or its failure logged, exit
0) and bounds with `trio.fail_after`: an idle stop must not wait out a long
grace, a stop with the API server down or a client trickling or not reading
must end within the grace plus a margin, never the renew deadline or the
kernel's own patience.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from egressd.sandbox.apiserver import FakeApiServer
from tests.test_app import ELECTION, kubeconfig

__all__ = ["kubeconfig"]  # the fixture, shared with test_app

TOKEN = "stop-test-token-0123456789"


@dataclass
class Daemon:
    proc: trio.Process
    lines: list[dict[str, object]] = field(default_factory=list)
    _waiting: dict[str, trio.Event] = field(default_factory=dict)

    def seen(self, message: str) -> dict[str, object] | None:
        return next((line for line in self.lines if line.get("msg") == message), None)

    async def wait(self, message: str) -> dict[str, object]:
        if self.seen(message) is None:
            await self._waiting.setdefault(message, trio.Event()).wait()
        found = self.seen(message)
        assert found is not None
        return found

    def messages(self) -> list[str]:
        return [str(line.get("msg")) for line in self.lines]

    async def read(self) -> None:
        assert self.proc.stderr is not None
        buffer = b""
        async for chunk in self.proc.stderr:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                try:
                    line = json.loads(raw)
                except ValueError:
                    line = {"msg": raw.decode(errors="replace")}
                self.lines.append(line)
                event = self._waiting.pop(str(line.get("msg")), None)
                if event is not None:
                    event.set()


@asynccontextmanager
async def daemon(nursery: trio.Nursery, kubeconfig: str, home: Path, *flags: str
                 ) -> AsyncIterator[Daemon]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "DISCOVERY_TOKEN": TOKEN}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "egressd", "run", "--kubeconfig", kubeconfig,
         "--discovery-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
         "--log-format", "json", "--log-level", "debug", *ELECTION, *flags],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    running = Daemon(proc)
    nursery.start_soon(running.read)
    try:
        yield running
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()


def host_port(url: object) -> tuple[str, int]:
    host, _, port = str(url).removeprefix("http://").rstrip("/").rpartition(":")
    return host, int(port)


async def keep_alive_client(url: object) -> trio.SocketStream:
    """A connection that made one request, read its answer and stays open (a scraper)."""
    stream = await trio.open_tcp_stream(*host_port(url))
    await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):  # head and JSON body
        answer += await stream.receive_some()
    assert answer.startswith(b"HTTP/1.1 200")
    return stream


async def close_at_end(sock: socket.socket) -> None:
    try:
        await trio.sleep_forever()
    finally:
        sock.close()


async def stop(running: Daemon, bound: float) -> int:
    running.proc.send_signal(signal.SIGTERM)
    begun = trio.current_time()
    with trio.fail_after(bound):
        code = await running.proc.wait()
    print(f"stop took {trio.current_time() - begun:.2f} s")  # shown with -s, never asserted
    return code


async def test_an_idle_leader_with_a_standby_and_a_keep_alive_client_stops_without_the_grace(
    kubeconfig: str, tmp_path: Path,
) -> None:
    # A 30 s grace: a stop that waited for the idle connection (Hypercorn's
    # graceful_timeout) or anything else grace-bound would blow the 10 s bound.
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            async with daemon(nursery, kubeconfig, tmp_path, "--shutdown-grace", "30s") as leader:
                await leader.wait("became leader")
                async with daemon(nursery, kubeconfig, tmp_path,
                                  "--shutdown-grace", "30s") as standby:
                    started = await standby.wait("egressd started")
                    scraper = await keep_alive_client(started["metrics"])
                    client = await keep_alive_client(
                        (await leader.wait("egressd started"))["discovery"])
                    assert await stop(leader, 10) == 0, leader.messages()
                    # The idle connections were closed, not left to the kernel.
                    with trio.fail_after(5):
                        assert await client.receive_some() == b""
                    messages = leader.messages()
                    assert messages.index("stopping") < messages.index(
                        "released the leader lease"), messages
                    # Handed over: the standby leads without waiting out the 15 s duration.
                    await standby.wait("became leader")
                    assert await stop(standby, 10) == 0
                    await scraper.aclose()
                    await client.aclose()
            nursery.cancel_scope.cancel()


async def test_a_leader_stops_within_the_grace_with_the_api_server_down(
    apiserver: FakeApiServer, kubeconfig: str, tmp_path: Path,
) -> None:
    # The renew deadline (10 s) used to bound the Lease release; the grace (2 s) must.
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async with daemon(nursery, kubeconfig, tmp_path, "--shutdown-grace", "2s") as leader:
                await leader.wait("egressd started")
                await leader.wait("became leader")
                apiserver.faults.refuse_connections(60)
                assert await stop(leader, 2 + 3) == 0, leader.messages()
                messages = leader.messages()
                failed = leader.seen("releasing the leader lease failed")
                # Cut by the grace, not left to the client's retries (which end later).
                assert failed is not None and failed["error"] == "no answer within 2 s", messages
                assert "released the leader lease" not in messages
            nursery.cancel_scope.cancel()


async def test_a_trickling_and_a_non_reading_client_are_cut_at_the_grace(
    apiserver: FakeApiServer, kubeconfig: str, tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async with daemon(nursery, kubeconfig, tmp_path, "--shutdown-grace", "2s") as leader:
                started = await leader.wait("egressd started")
                url = started["discovery"]
                # A body announced and sent one byte at a time, for ever.
                trickler = await trio.open_tcp_stream(*host_port(url))
                await trickler.send_all(
                    b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
                    b"Content-Length: 1000\r\n\r\n{")

                async def trickle() -> None:
                    try:
                        while True:
                            await trickler.send_all(b" ")
                            await trio.sleep(0.2)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return

                nursery.start_soon(trickle)
                # A client that asks and asks and never reads: the daemon's socket
                # buffers fill and Hypercorn's (shielded) write blocks.
                reader = socket.create_connection(host_port(url))
                nursery.start_soon(close_at_end, reader)
                reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                ask = (b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n") * 2000
                reader.setblocking(False)
                sent = 0
                with trio.move_on_after(3):
                    while sent < len(ask):
                        await trio.lowlevel.wait_writable(reader)
                        sent += reader.send(ask[sent:])
                assert await stop(leader, 2 + 3) == 0, leader.messages()
                await trickler.aclose()
            nursery.cancel_scope.cancel()
