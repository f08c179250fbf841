"""One watch stream: decoding newline-delimited watch events into `WatchEvent`s.

The client opens the HTTP stream (`KubeClient.watch`); this module turns its
lines into events, turns an in-stream `ERROR` event into the typed API error
(a `410 Gone` there means "relist"), and maps a cut connection to
`WatchCut` so the informer can resume from its last resourceVersion.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import trio

from egressd.kube.errors import ApiUnavailable, bad_json, error_from_status
from egressd.kube.resources import resource_version

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"
BOOKMARK = "BOOKMARK"


@attrs.frozen
class WatchEvent:
    """One change: type ADDED, MODIFIED, DELETED or BOOKMARK, and the object."""

    type: str
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        return resource_version(self.object)


class WatchCut(ApiUnavailable):
    """The watch connection broke mid-stream; resume from the last seen version."""


class WatchStream:
    """Async iterator over the events of one open watch response."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._lines: AsyncIterator[str] = response.aiter_lines()

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            try:
                line = await self._lines.__anext__()
            except httpx.TransportError as exc:
                raise WatchCut(f"watch stream cut: {exc!r}") from exc
            if not line.strip():
                continue
            return decode_event(line, status=self._response.status_code)

    async def aclose(self) -> None:
        """Close the response and finish httpx's chain of line/byte generators.

        Closing only the outermost generator would leave the inner ones
        suspended, and trio warns about every unfinished async generator
        that is garbage collected; once the connection is closed, one more
        read ends the whole chain with an error.
        """
        await self._response.aclose()
        with trio.move_on_after(1.0), contextlib.suppress(Exception):
            async for _ in self._lines:
                pass


def decode_event(line: str, *, status: int = 200) -> WatchEvent:
    """One watch line as an event; an ERROR event raises its typed API error."""
    try:
        data = json.loads(line)
    except ValueError:
        raise bad_json(status, line.encode()) from None
    if not isinstance(data, dict) or not isinstance(data.get("object"), dict):
        raise bad_json(status, line.encode())
    kind = str(data.get("type") or "")
    obj: dict[str, Any] = data["object"]
    if kind == "ERROR":
        code = obj.get("code")
        raise error_from_status(code if isinstance(code, int) else 500, obj)
    meta = obj.get("metadata")
    # Every object event must name its object (the cache is keyed by it); a
    # bookmark carries only a resourceVersion.
    if not isinstance(meta, dict) or (kind != BOOKMARK and not meta.get("name")):
        raise bad_json(status, line.encode())
    return WatchEvent(kind, obj)
