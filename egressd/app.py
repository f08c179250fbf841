"""The composition root of `egressd run`: everything read from disk before any task starts.

Files named by flags are read here, once, so a mistake in any of them stops
the process at start with one line naming the flag and the path (SPEC §4,
§9), before a nursery or a connection exists.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import attrs

from egressd.errors import ConfigError
from egressd.health.probe import make_ssl_context
from egressd.http.auth import read_token
from egressd.providers.config import ProvidersConfig, ProvidersConfigError, load_providers_config
from egressd.settings import Settings


@attrs.frozen
class Inputs:
    """What `egressd run` read at start: settings plus the contents of their files."""

    settings: Settings
    discovery_token: str | None = attrs.field(repr=False)
    providers: ProvidersConfig
    probe_ssl_context: ssl.SSLContext


def _check_readable(flag: str, path: str | None) -> None:
    if not path:
        return
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: {exc.strerror}") from None


def load_inputs(settings: Settings, environ: Mapping[str, str]) -> Inputs:
    """Read every file the settings name; raise ConfigError naming the first bad one.

    A providers config with several mistakes raises `ProvidersConfigError`,
    whose `problems` lists them all.
    """
    _check_readable("--kubeconfig", settings.kubeconfig)
    token = read_token(settings.discovery_token_file, environ)
    providers = ProvidersConfig()
    if settings.providers_config:
        try:
            providers = load_providers_config(settings.providers_config)
        except ProvidersConfigError as exc:
            exc.problems = [f"--providers-config {settings.providers_config}: {p}"
                            for p in exc.problems]
            raise
    return Inputs(
        settings=settings,
        discovery_token=token,
        providers=providers,
        probe_ssl_context=make_ssl_context(settings.probe_ca_file),
    )
