"""Who a gateway client is and what it asks for: `Proxy-Authorization: Basic` (docs/gateway.md).

The password is a discovery API token, compared in constant time as the API's
bearer auth does. The username carries the options, comma-separated
`key=value` pairs that every proxy-URL client passes through untouched
(`http://session=abc,region=eu:TOKEN@host:port`): `session=ID` is the sticky
session, every other pair a label selector term. A username without `=` (`egressd`)
means no options. Nothing here does I/O; errors say what is wrong, never echo the
password.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
from collections.abc import Mapping

import attrs

SESSION_KEY = "session"
"""The username option naming a sticky session."""

MAX_USERNAME = 1024
"""Longest username accepted (the whole header is bounded by the head cap too)."""

_SESSION_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")
# Selector terms: the characters of Kubernetes label keys and values.
_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,252})?")
_VALUE = re.compile(r"[A-Za-z0-9._-]{0,63}")


@attrs.frozen(kw_only=True)
class ClientOptions:
    """What one gateway client asked for: a sticky session id and a selector."""

    session: str | None = None
    selector: Mapping[str, str] = attrs.field(factory=dict)


class Unauthenticated(Exception):
    """No `Proxy-Authorization`, a scheme other than Basic, or a wrong token (407)."""


class BadUsername(Exception):
    """The username's options do not parse (407, with this message as the reason)."""


def parse_username(username: str) -> ClientOptions:
    """The options of a username: `session=ID,k=v,...`, or none for a bare word.

    Raises BadUsername naming the first term that is wrong.
    """
    if len(username) > MAX_USERNAME:
        raise BadUsername(f"username longer than {MAX_USERNAME} characters")
    if "=" not in username and "," not in username:
        return ClientOptions()
    session: str | None = None
    selector: dict[str, str] = {}
    for term in username.split(","):
        key, sep, value = term.partition("=")
        if not sep or not key:
            raise BadUsername(f"username term {term!r} is not key=value")
        if key == SESSION_KEY:
            if session is not None:
                raise BadUsername("username names session twice")
            if not _SESSION_ID.fullmatch(value):
                raise BadUsername("session must be 1-128 characters of A-Z a-z 0-9 . _ ~ -")
            session = value
            continue
        if key in selector:
            raise BadUsername(f"username names {key!r} twice")
        if not _KEY.fullmatch(key) or not _VALUE.fullmatch(value):
            raise BadUsername(f"username term {term!r} is not a label selector term")
        selector[key] = value
    return ClientOptions(session=session, selector=selector)


def authenticate(header: bytes | None, *, token: str) -> ClientOptions:
    """Check a `Proxy-Authorization` value against `token`; return the username's options.

    Raises Unauthenticated (no header, not Basic, undecodable, wrong password)
    or BadUsername. The token is checked first, so an unauthenticated client
    learns nothing about the username grammar.
    """
    if not header:
        raise Unauthenticated("proxy authentication required")
    scheme, _, encoded = header.strip().partition(b" ")
    if scheme.lower() != b"basic":
        raise Unauthenticated("only Basic proxy authentication is supported")
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise Unauthenticated("Proxy-Authorization is not valid Basic credentials") from None
    username, sep, password = decoded.partition(":")
    # compare_digest: the time taken does not reveal how much of the token matched.
    if not sep or not hmac.compare_digest(password.encode(), token.encode()):
        raise Unauthenticated("wrong proxy credentials")
    return parse_username(username)
