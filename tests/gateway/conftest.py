"""Fixtures for the gateway tests: a trustme CA, TLS targets, real Squid and tinyproxy."""

from __future__ import annotations

from tests.health.fixtures import ca, client_ssl, server_ssl, squid, tinyproxy

__all__ = ["ca", "client_ssl", "server_ssl", "squid", "tinyproxy"]
