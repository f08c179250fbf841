"""Where the discovery API's bearer token comes from (SPEC §7)."""

from __future__ import annotations

from collections.abc import Mapping

from egressd.errors import ConfigError

TOKEN_ENV = "DISCOVERY_TOKEN"  # noqa: S105 - the variable's name, not a token


def read_token(token_file: str | None, environ: Mapping[str, str]) -> str | None:
    """The token from `--discovery-token-file` if given, else `$DISCOVERY_TOKEN`, else None.

    Surrounding whitespace (a trailing newline in a mounted Secret) is dropped;
    an empty token counts as none. Raises ConfigError if the file cannot be read.
    """
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ConfigError(f"--discovery-token-file {token_file}: {exc.strerror}") from None
        if not token:
            raise ConfigError(f"--discovery-token-file {token_file}: file is empty")
        return token
    return environ.get(TOKEN_ENV, "").strip() or None
