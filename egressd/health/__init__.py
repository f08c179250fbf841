"""Probing every proxy through itself and keeping a verdict per proxy (SPEC §6)."""
