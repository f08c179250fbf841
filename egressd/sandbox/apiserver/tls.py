"""The server's TLS identity (a trustme CA and a certificate for 127.0.0.1) and kubeconfig.

kubectl never sends a bearer token over plain http, so the server is HTTPS
only; clients trust the generated CA through `ca_pem`, `ca_file` or the
kubeconfig's certificate-authority-data.
"""

from __future__ import annotations

import base64
import os
import ssl

import attrs
import trustme
import yaml


@attrs.frozen
class Identity:
    """A CA and the server context it signed."""

    ca_pem: bytes
    server_context: ssl.SSLContext

    @classmethod
    def generate(cls) -> Identity:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        # HTTP/1.1 only: Go clients fall back from h2 when it is not offered.
        context.set_alpn_protocols(["http/1.1"])
        return cls(ca_pem=ca.cert_pem.bytes(), server_context=context)

    def client_context(self) -> ssl.SSLContext:
        """An SSLContext that trusts this server (for httpx and friends)."""
        return ssl.create_default_context(cadata=self.ca_pem.decode())


def kubeconfig(*, server: str, ca_pem: bytes, token: str, context: str,
               namespace: str = "default") -> str:
    """A kubeconfig (YAML text) with one cluster, user and context named `context`."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": context, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context,
                                                   "namespace": namespace}}],
        "current-context": context,
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write_private(path: str, text: str | bytes) -> None:
    """Write a file only its owner can read (it holds a token)."""
    data = text.encode() if isinstance(text, str) else text
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
