"""The gateway's pure parts: the username grammar, answer heads, Retry-After, sessions."""

from __future__ import annotations

import base64
import email.utils

import pytest

from egressd.gateway.options import (
    BadUsername,
    ClientOptions,
    Unauthenticated,
    authenticate,
    parse_username,
)
from egressd.gateway.sessions import Sessions
from egressd.gateway.tunnel import retry_after
from egressd.gateway.wire import BadHead, parse_response


@pytest.mark.parametrize("username,options", [
    ("egressd", ClientOptions()),
    ("", ClientOptions()),
    ("session=abc", ClientOptions(session="abc")),
    ("region=eu", ClientOptions(selector={"region": "eu"})),
    ("session=a.b-c_d~e,region=eu,tier=", ClientOptions(
        session="a.b-c_d~e", selector={"region": "eu", "tier": ""})),
    ("example.com/zone=x", ClientOptions(selector={"example.com/zone": "x"})),
])
def test_the_username_grammar(username: str, options: ClientOptions) -> None:
    assert parse_username(username) == options


def test_a_long_username_is_refused() -> None:
    with pytest.raises(BadUsername, match="longer than"):
        parse_username("a=" + "b" * 2000)


def test_the_password_is_the_token_and_the_rest_is_not_read_without_it() -> None:
    def basic(text: str) -> bytes:
        return b"Basic " + base64.b64encode(text.encode())

    assert authenticate(basic("session=x:tok-1234"), token="tok-1234").session == "x"
    assert authenticate(basic("u:pa:ss"), token="pa:ss") == ClientOptions()  # ':' in a token
    with pytest.raises(Unauthenticated):
        authenticate(basic("a,,b=:wrong"), token="tok-1234")  # bad username, bad token: 407
    with pytest.raises(BadUsername):
        authenticate(basic("a,,b=:tok-1234"), token="tok-1234")


def test_answer_heads_are_parsed_strictly() -> None:
    head = parse_response(b"HTTP/1.1 429 Too Many\r\nRetry-After:  30 \r\nX-A: b\r\n\r\n")
    assert (head.status_code, head.reason) == (429, b"Too Many")
    assert head.headers == [(b"retry-after", b"30"), (b"x-a", b"b")]
    assert parse_response(b"HTTP/1.0 200\r\n\r\n").status_code == 200
    for bad in (b"HTTP/2 200 OK\r\n\r\n", b"SSH-2.0\r\n\r\n", b"HTTP/1.1 20 x\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n", b"HTTP/1.1 200 OK\r\nnocolon\r\n\r\n",
                b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n"):
        with pytest.raises(BadHead):
            parse_response(bad)


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert retry_after(b"120") == 120.0
    assert retry_after(None) is None
    assert retry_after(b"soon") is None
    date = email.utils.formatdate(1_800_000_090, usegmt=True).encode()
    assert retry_after(date, now=1_800_000_000) == pytest.approx(90)
    assert retry_after(date, now=1_800_000_100) == 0.0


def test_sessions_idle_out_only_without_tunnels_and_are_capped() -> None:
    now = [0.0]
    sessions = Sessions(idle=10.0, clock=lambda: now[0], limit=2)
    sessions.opened("a", "ns/p1")
    now[0] = 50.0
    assert sessions.proxy("a") == "ns/p1"  # a tunnel is open: never idle
    sessions.closed("a")
    now[0] = 59.0
    assert sessions.proxy("a") == "ns/p1"
    now[0] = 60.5
    assert sessions.proxy("a") is None
    sessions.opened("b", "ns/p1")
    sessions.closed("b")
    sessions.opened("c", "ns/p2")
    sessions.opened("d", "ns/p3")  # over the cap: the least recently used idle one goes
    assert sessions.proxy("b") is None
    assert (sessions.proxy("c"), sessions.proxy("d")) == ("ns/p2", "ns/p3")
