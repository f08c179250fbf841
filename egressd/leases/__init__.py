"""Leases and cooldowns (SPEC §7)."""
