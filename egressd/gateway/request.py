"""What a gateway client asks for: a CONNECT `host:port`, or an absolute-form `http://` URL.

The target of a tunnel is its host, lower case, without port: the lease's
target, so per-target cooldowns and capacity apply to it (docs/reference.md).
"""

from __future__ import annotations

import re
import urllib.parse

import attrs
import h11

from egressd.gateway import answers

_HOST = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9_-]*[a-z0-9])?)*\.?")
MAX_HOST = 253


@attrs.frozen(kw_only=True)
class Ask:
    """A parsed proxy request. `connect` is True for a tunnel, False for plain http."""

    connect: bool
    host: str
    port: int
    request: h11.Request

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _host(raw: str) -> str:
    host = raw.lower()
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        if not inner or not re.fullmatch(r"[0-9a-f:.]+", inner):
            raise answers.bad_request(f"invalid host {raw!r}")
        return inner
    if len(host) > MAX_HOST or not _HOST.fullmatch(host):
        raise answers.bad_request(f"invalid host {raw!r}")
    return host.rstrip(".")


def _port(raw: str) -> int:
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise answers.bad_request(f"invalid port {raw!r}")
    return int(raw)


def parse_ask(req: h11.Request) -> Ask:
    """The host and port `req` asks for; Refusal 400 when it is no proxy request."""
    try:
        target = req.target.decode("ascii")
    except UnicodeDecodeError:
        raise answers.bad_request("request target is not ASCII") from None
    if req.method == b"CONNECT":
        host, sep, port = target.rpartition(":")
        if not sep or not host:
            raise answers.bad_request("CONNECT needs host:port")
        return Ask(connect=True, host=_host(host), port=_port(port), request=req)
    low = target[:8].lower()
    if low.startswith("https://"):
        raise answers.bad_request("for https, send CONNECT host:443 (use the URL as a proxy)")
    if not low.startswith("http://"):
        raise answers.bad_request(
            "not a proxy request: send CONNECT host:port or an absolute http:// URL")
    parts = urllib.parse.urlsplit(target)
    try:
        url_port = parts.port or 80
    except ValueError:
        raise answers.bad_request("invalid port in the URL") from None
    if not parts.hostname:
        raise answers.bad_request("no host in the URL")
    host = parts.netloc.rpartition("@")[2]
    if host.rpartition(":")[2].isdigit() and not host.endswith("]"):
        host = host.rpartition(":")[0]
    return Ask(connect=False, host=_host(host), port=url_port, request=req)
