"""Where the discovery API's bearer token comes from, and what a token must be.

A token that is guessable protects nothing: the shipped placeholder
(`change-me`, what an old `manifests/config.yaml` set) and anything shorter
than `MIN_TOKEN_LENGTH` stop the start with one line saying how to make one.
"""

from __future__ import annotations

from collections.abc import Mapping

from egressd.errors import ConfigError

TOKEN_ENV = "DISCOVERY_TOKEN"  # noqa: S105 - the variable's name, not a token
MIN_TOKEN_LENGTH = 16
PLACEHOLDERS = frozenset({"change-me", "changeme"})
HOW_TO_SET = ("set a random one, e.g. DISCOVERY_TOKEN=$(openssl rand -hex 32); in a cluster: "
              "kubectl -n egressd create secret generic egressd-discovery "
              "--from-literal=DISCOVERY_TOKEN=$(openssl rand -hex 32) "
              "(docs/reference.md, The discovery API)")


def check_token(token: str, *, source: str) -> str:
    """`token` if it can protect the API; else ConfigError naming `source`, never the token."""
    if token.lower() in PLACEHOLDERS:
        raise ConfigError(f"{source} is the placeholder {token!r}, not a token: {HOW_TO_SET}")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"{source} is {len(token)} characters, a token needs at least "
                          f"{MIN_TOKEN_LENGTH}: {HOW_TO_SET}")
    return token


def read_token(token_file: str | None, environ: Mapping[str, str]) -> str | None:
    """The token from `--discovery-token-file` if given, else `$DISCOVERY_TOKEN`, else None.

    Surrounding whitespace (a trailing newline in a mounted Secret) is dropped;
    an empty `$DISCOVERY_TOKEN` counts as none. Raises ConfigError if the file
    cannot be read or is empty, or if the token is weak (`check_token`).
    """
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ConfigError(f"--discovery-token-file {token_file}: {exc.strerror}") from None
        if not token:
            raise ConfigError(f"--discovery-token-file {token_file}: file is empty")
        return check_token(token, source=f"the token in --discovery-token-file {token_file}")
    token = environ.get(TOKEN_ENV, "").strip()
    return check_token(token, source=f"${TOKEN_ENV}") if token else None
