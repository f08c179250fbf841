"""HTTP/1.1 heads as the gateway reads and writes them, with h11 checking the syntax.

A head is read up to its blank line and no further (bounded by a size cap:
`HeadTooLarge` is the client's 431), then parsed by h11; the bytes after it
are handed back untouched, because after a CONNECT they are the tunnel's first
bytes (a TLS ClientHello sent without waiting) and after a plain-http request
they are its body. Bodies are never parsed: they are relayed as bytes.

The gateway's own answers are small and final (`Connection: close`), written
here so that every refusal has the same shape: a JSON body
`{"error": code, "message": text, ...}` as the discovery API's errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import h11
import trio

READ_SIZE = 65536
"""Bytes asked for per read while a head is incomplete."""


class HeadTooLarge(Exception):
    """The head did not end within the size cap (431 for a client)."""


class BadHead(Exception):
    """The head is not valid HTTP/1.1 (400 for a client)."""


class PeerClosed(Exception):
    """The peer closed before its head was complete."""


@attrs.frozen
class ResponseHead:
    """A proxy's answer head: status, reason and headers (names in lower case)."""

    status_code: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]


@attrs.frozen
class Head:
    """A parsed head (an h11 Request, or a ResponseHead) and the bytes after it."""

    event: h11.Request | ResponseHead
    rest: bytes


_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-9][0-9][0-9])(?: ([^\r\n]*))?\r?\n")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def parse_response(raw: bytes) -> ResponseHead:
    """An answer head from an upstream proxy, parsed strictly but without h11.

    h11 parses an answer only after a request sent through the same state
    machine, which costs more than the rest of a tunnel's setup (issue 15 item 8);
    this keeps its rules that matter here: an HTTP/1.x status line, header
    names that are tokens, no line folding. Values are kept as sent.
    """
    match = _STATUS_LINE.match(raw)
    if match is None:
        raise BadHead("malformed status line")
    headers: list[tuple[bytes, bytes]] = []
    for line in raw[match.end():].split(b"\n"):
        line = line.rstrip(b"\r")
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise BadHead(f"malformed header line {line[:40]!r}")
        headers.append((name.lower(), value.strip(b" \t")))
    return ResponseHead(status_code=int(match.group(1)), reason=match.group(2) or b"",
                        headers=headers)


def _head_end(buf: bytearray, start: int) -> int:
    """Index just past the blank line ending a head in `buf`, or -1."""
    crlf = buf.find(b"\r\n\r\n", max(0, start - 3))
    lf = buf.find(b"\n\n", max(0, start - 1))
    ends = [i + 4 for i in (crlf,) if i >= 0] + [i + 2 for i in (lf,) if i >= 0]
    return min(ends) if ends else -1


async def read_head(stream: trio.abc.ReceiveStream, *, role: type[h11.SERVER] | type[h11.CLIENT],
                    limit: int, first: bytes = b"") -> Head:
    """Read one head from `stream` (a request for `h11.SERVER`, a response for `h11.CLIENT`).

    Raises HeadTooLarge past `limit` bytes, BadHead if h11 refuses it,
    PeerClosed on EOF first. Interim (1xx) responses are skipped.
    """
    buf = bytearray(first)
    scanned = 0
    while True:
        end = _head_end(buf, scanned)
        if end >= 0:
            if end > limit:
                raise HeadTooLarge(f"head larger than {limit} bytes")
            raw = bytes(buf[:end])
            head = _parse(raw, limit=limit) if role is h11.SERVER else parse_response(raw)
            if isinstance(head, ResponseHead) and head.status_code < 200:
                del buf[:end]  # an interim (1xx) answer: the final one follows
                scanned = 0
                continue
            return Head(event=head, rest=bytes(buf[end:]))
        if len(buf) > limit:
            raise HeadTooLarge(f"head larger than {limit} bytes")
        scanned = len(buf)
        data = await stream.receive_some(READ_SIZE)
        if not data:
            raise PeerClosed("closed before the end of the head")
        buf += data


def _parse(raw: bytes, *, limit: int) -> h11.Request:
    """A client's request head, parsed by h11 (untrusted input gets the careful parser)."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limit + 1)
    try:
        conn.receive_data(raw)
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise BadHead(str(exc) or "malformed head") from None
    if not isinstance(event, h11.Request):
        raise BadHead("malformed head")
    return event


def header(event: h11.Request | ResponseHead, name: bytes) -> bytes | None:
    """The value of header `name` (lower case), or None; a repeated header is BadHead."""
    found: bytes | None = None
    for key, value in event.headers:
        if key == name:
            if found is not None:
                raise BadHead(f"{name.decode()} given twice")
            found = value
    return found


# Hop-by-hop headers (RFC 9110 §7.6.1) and ours: never forwarded upstream.
_HOP = frozenset({b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization",
                  b"proxy-authenticate", b"te", b"trailer", b"upgrade"})


def forward_request(req: h11.Request, *, authorization: bytes | None) -> bytes:
    """The head of a plain-http request as sent on to the upstream proxy.

    Absolute-form target kept (the upstream is a proxy too); hop-by-hop and
    the client's Proxy-Authorization dropped; `Connection: close`, so the
    answer ends with the connection and its body can be relayed as bytes.
    """
    lines = [b"%s %s HTTP/1.1\r\n" % (req.method, req.target)]
    lines.extend(b"%s: %s\r\n" % (k, v) for k, v in req.headers if k not in _HOP)
    if authorization is not None:
        lines.append(b"Proxy-Authorization: " + authorization + b"\r\n")
    lines.append(b"Connection: close\r\n\r\n")
    return b"".join(lines)


def forward_response(resp: ResponseHead, *, extra: Iterable[tuple[str, str]] = ()) -> bytes:
    """The head of an upstream answer as sent to the client: hop-by-hop headers replaced
    by `Connection: close` (the gateway serves one request per connection), plus `extra`."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (resp.status_code, resp.reason)]
    lines.extend(b"%s: %s\r\n" % (k, v) for k, v in resp.headers if k not in _HOP)
    lines.extend(f"{k}: {v}\r\n".encode("latin-1") for k, v in extra)
    lines.append(b"Connection: close\r\n\r\n")
    return b"".join(lines)


def connect_request(authority: str, *, authorization: bytes | None) -> bytes:
    """A CONNECT for `authority` (`host:port`) to an upstream proxy."""
    auth = b"Proxy-Authorization: " + authorization + b"\r\n" if authorization else b""
    a = authority.encode("ascii")
    return b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (a, a, auth)


_REASONS = {200: "Connection established", 400: "Bad Request", 405: "Method Not Allowed",
            407: "Proxy Authentication Required", 408: "Request Timeout",
            431: "Request Header Fields Too Large", 502: "Bad Gateway",
            503: "Service Unavailable", 504: "Gateway Timeout"}


def answer(status: int, *, headers: Iterable[tuple[str, str]] = (),
           body: Mapping[str, Any] | None = None) -> bytes:
    """A complete answer from the gateway itself; a body is JSON."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"]
    lines.extend(f"{k}: {v}\r\n" for k, v in headers)
    payload = b""
    if body is not None:
        payload = json.dumps(body, separators=(",", ":")).encode() + b"\n"
        lines.append("Content-Type: application/json\r\n")
    if status != 200:
        lines.append(f"Content-Length: {len(payload)}\r\nConnection: close\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1") + payload


def error(status: int, code: str, message: str, *, headers: Iterable[tuple[str, str]] = (),
          extra: Mapping[str, Any] | None = None) -> bytes:
    """A refusal with the API's error shape."""
    return answer(status, headers=headers,
                  body={"error": code, "message": message, **(extra or {})})
