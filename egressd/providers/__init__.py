"""Providers create and delete instances; they know nothing of Proxy (SPEC §4)."""
