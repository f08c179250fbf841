"""Sticky sessions: which proxy each `session=ID` keeps, until it idles out.

A session remembers a proxy, not a lease: each tunnel of the session holds
its own lease on that proxy (so capacity, reports and X-Egressd-Lease stay per
tunnel), and the gateway asks for the remembered proxy first. A session with
no tunnel open for `idle` seconds forgets its proxy. Entries are kept in
last-use order, so forgetting idle ones costs only the ones forgotten, and
their number is capped (the least recently used inactive one goes first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import attrs
import trio

MAX_SESSIONS = 100_000
"""Sessions remembered at most (bounded memory against a client inventing ids)."""


@attrs.define
class _Entry:
    key: str
    open: int = 0
    last_used: float = 0.0


class Sessions:
    """The session table of one gateway; every method is synchronous (atomic on trio)."""

    def __init__(self, *, idle: float, clock: Callable[[], float] = trio.current_time,
                 limit: int = MAX_SESSIONS) -> None:
        self._idle = idle
        self._clock = clock
        self._limit = limit
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()

    def proxy(self, session: Hashable) -> str | None:
        """The proxy key `session` keeps, or None (new, or idled out)."""
        self._forget_idle()
        entry = self._entries.get(session)
        return entry.key if entry is not None else None

    def opened(self, session: Hashable, key: str) -> None:
        """A tunnel of `session` now runs through proxy `key` (which it keeps from now on)."""
        entry = self._entries.get(session)
        if entry is None:
            entry = _Entry(key=key)
            self._entries[session] = entry
            if len(self._entries) > self._limit:
                self._evict()
        entry.key = key
        entry.open += 1
        entry.last_used = self._clock()
        self._entries.move_to_end(session)

    def closed(self, session: Hashable) -> None:
        """A tunnel of `session` ended; the idle time counts from the last one's end."""
        entry = self._entries.get(session)
        if entry is None:
            return
        entry.open = max(0, entry.open - 1)
        entry.last_used = self._clock()
        self._entries.move_to_end(session)

    def forget(self, session: Hashable) -> None:
        self._entries.pop(session, None)

    def __len__(self) -> int:
        self._forget_idle()
        return len(self._entries)

    def _forget_idle(self) -> None:
        now = self._clock()
        entries = self._entries
        # Oldest first; one with tunnels open is moved to the back (it is in use).
        for _ in range(len(entries)):
            session, entry = next(iter(entries.items()))
            if entry.last_used + self._idle > now:
                return
            if entry.open:
                entry.last_used = now
                entries.move_to_end(session)
            else:
                del entries[session]

    def _evict(self) -> None:
        for session, entry in self._entries.items():
            if not entry.open:
                del self._entries[session]
                return
