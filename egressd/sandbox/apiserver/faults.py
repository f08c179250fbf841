"""Fault injection for reliability tests: failing requests, cut watches, refusals.

`server.faults.fail_next(2, code=503, resource="proxies")` answers the next
two matching requests with that error; `cut_watches()` ends open watch
streams (cleanly, or mid-chunk with `abrupt=True`); `refuse_connections(5)`
closes the listener and every connection and listens again on the same
port after five (trio) seconds; `drop_bookmarks` stops BOOKMARK events;
`rotate_token()` makes the old token a 401.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import attrs

from egressd.sandbox.apiserver.errors import ApiError, injected
from egressd.sandbox.apiserver.store import Store
from egressd.sandbox.apiserver.wire import Request


@attrs.define(eq=False)
class FaultRule:
    """Answer matching requests with `code` while `remaining` > 0."""

    code: int
    remaining: int
    method: str | None = None
    path: str | None = None
    resource: str | None = None
    watch: bool | None = None
    retry_after: int | None = None
    message: str | None = None
    # For watches: answer 200 and deliver the error as an ERROR event.
    as_watch_event: bool = False
    hits: int = 0

    def matches(self, request: Request, *, resource: str | None, is_watch: bool) -> bool:
        return (self.remaining > 0
                and (self.method is None or self.method.upper() == request.method)
                and (self.path is None or self.path in request.path)
                and (self.resource is None or self.resource == resource)
                and (self.watch is None or self.watch == is_watch))


class Faults:
    """The fault switches of one FakeApiServer."""

    def __init__(self, store: Store, *, refuse: Callable[[float], None],
                 rotate: Callable[[], str]) -> None:
        self._store = store
        self._refuse = refuse
        self._rotate = rotate
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()
        self.drop_bookmarks = False

    def fail_next(self, count: int = 1, *, code: int, method: str | None = None,
                  path: str | None = None, resource: str | None = None,
                  watch: bool | None = None, retry_after: int | None = None,
                  message: str | None = None, as_watch_event: bool = False) -> FaultRule:
        """Answer the next `count` matching requests with `code` (a Status body).

        Matching is by method, a substring of the path, the resource plural,
        and whether the request is a watch. 429 and 503 may carry Retry-After.
        """
        rule = FaultRule(code=code, remaining=count, method=method, path=path,
                         resource=resource, watch=watch, retry_after=retry_after,
                         message=message, as_watch_event=as_watch_event)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Forget every pending rule and switch bookmarks back on."""
        with self._lock:
            self._rules.clear()
        self.drop_bookmarks = False

    def take(self, request: Request, *, resource: str | None, is_watch: bool
             ) -> tuple[ApiError, FaultRule] | None:
        """The injected error for this request, if a rule matches (consumes one)."""
        with self._lock:
            for rule in self._rules:
                if rule.matches(request, resource=resource, is_watch=is_watch):
                    rule.remaining -= 1
                    rule.hits += 1
                    if rule.remaining <= 0:
                        self._rules.remove(rule)
                    return injected(rule.code, retry_after=rule.retry_after,
                                    message=rule.message), rule
        return None

    def cut_watches(self, resource: str | None = None, *, abrupt: bool = False) -> int:
        """End open watch streams (of one resource plural, or all); returns how many."""
        watchers = self._store.watchers(resource)
        for watcher in watchers:
            self._store.close_watcher(watcher, abrupt=abrupt)
        return len(watchers)

    def refuse_connections(self, seconds: float) -> None:
        """Drop every connection and refuse new ones for `seconds` (trio clock)."""
        self._refuse(seconds)

    def rotate_token(self) -> str:
        """Switch to a new bearer token (the old one gets 401); returns it."""
        return self._rotate()
