"""The Proxy resource as frozen attrs values, and the one cattrs converter (pure, no I/O)."""
