"""The providers of the config, built once at the composition root and looked up by name.

Each provider is wrapped in `MeteredProvider` here, so every call is counted
and timed whatever the provider. The GCP module (and the Google client
libraries) is imported only when a gcp provider is configured: it costs
~60 ms and ~12 MB at start-up (NOTES.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import trio

from egressd.errors import ConfigError
from egressd.providers.config import GcpConfig, KubernetesConfig, ProvidersConfig
from egressd.providers.contract import Provider
from egressd.providers.errors import UnknownProvider
from egressd.providers.metrics import MeteredProvider

if TYPE_CHECKING:
    from egressd.kube.client import KubeClient


class ProviderRegistry:
    """The configured providers by name (each already metered)."""

    def __init__(self, providers: Mapping[str, Provider], *,
                 closers: tuple[Callable[[], None], ...] = ()) -> None:
        self._providers = dict(providers)
        self._closers = closers

    def get(self, name: str) -> Provider:
        """The provider called `name`; `UnknownProvider` (a `Permanent` error) if none is."""
        try:
            return self._providers[name]
        except KeyError:
            known = ", ".join(sorted(self._providers)) or "none configured"
            raise UnknownProvider(
                f"spec.provider: no provider named {name!r} in the providers config "
                f"(known: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._providers

    def __iter__(self) -> Iterator[str]:
        return iter(self._providers)

    def __len__(self) -> int:
        return len(self._providers)

    def items(self) -> list[tuple[str, Provider]]:
        """(name, provider) pairs in config order, e.g. for orphan GC."""
        return list(self._providers.items())

    def close(self) -> None:
        """Release what the providers hold (the GCP providers' connections). At shutdown."""
        for close in self._closers:
            close()


def build_registry(
    config: ProvidersConfig,
    *,
    kube_client: KubeClient | None = None,
    gcp_credentials: Any = None,
    gcp_api_endpoint: str | None = None,
    gcp_limiter: trio.CapacityLimiter | None = None,
) -> ProviderRegistry:
    """Build every configured provider. Blocking (it may read GCP credentials): call at start.

    `kube_client` is required when a kubernetes provider is configured.
    `gcp_credentials` / `gcp_api_endpoint` replace ADC and the public
    endpoint (tests, or a private endpoint). Raises `ConfigError` for a
    provider that cannot be built (no kube client, no Google credentials).
    """
    providers: dict[str, Provider] = {}
    closers: list[Callable[[], None]] = []
    for entry in config.providers:
        settings = entry.settings
        provider: Provider
        if isinstance(settings, KubernetesConfig):
            if kube_client is None:
                raise ConfigError(
                    f"provider {entry.name!r}: a kubernetes provider needs a Kubernetes client")
            from egressd.providers.kubernetes import KubernetesProvider

            provider = KubernetesProvider(settings, client=kube_client)
        else:
            assert isinstance(settings, GcpConfig)
            from egressd.providers.gcp import GcpProvider

            options: dict[str, Any] = {"api_endpoint": gcp_api_endpoint,
                                       "limiter": gcp_limiter}
            try:
                if gcp_credentials is not None:
                    gcp = GcpProvider(settings, credentials=gcp_credentials, **options)
                else:
                    gcp = GcpProvider.from_config(settings, **options)
            except ConfigError as exc:
                raise ConfigError(f"provider {entry.name!r}: {exc}") from exc
            closers.append(gcp.close)
            provider = gcp
        providers[entry.name] = MeteredProvider(provider, name=entry.name)
    return ProviderRegistry(providers, closers=tuple(closers))
