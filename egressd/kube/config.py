"""Where the Kubernetes API is and how to authenticate to it (docs/reference.md, flags).

`load_config` turns a kubeconfig (file, context, client certificates, bearer
tokens, exec plugins) or the in-cluster service account into one immutable
`KubeConfig`. Parsing is the `kubernetes` package's own loaders, not a
re-implementation; they block (files, exec plugins), so they run in a worker
thread. Only the loaders are used: the package's sync `ApiClient` is not.

The bearer token is the one moving part: `Credentials` caches the header and
asks the loader's refresh hook again at most once per `refresh_interval`
(exec plugins re-run near expiry, the in-cluster token file is re-read on
rotation), and `reload()` re-runs the whole loader after a 401.

The package runs exec plugins with no timeout, so every loader call is
abandoned on cancellation (shutdown never waits for a hung plugin) and a
refresh gives up after `refresh_timeout`, keeping the last token.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio
import yaml

from egressd.errors import ConfigError, EgressdError

log = logging.getLogger(__name__)

SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
SERVICE_PORT_ENV = "KUBERNETES_SERVICE_PORT"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# The kubernetes package's loader treats an exec token as expired 5 minutes
# early and the in-cluster loader re-reads its file once a minute: asking more
# often than this only re-runs exec plugins for nothing (NOTES.md).
DEFAULT_REFRESH_INTERVAL = 60.0
# How long a refresh or reload may take (an exec plugin fetching a token over
# the network) before the last token is used again.
DEFAULT_REFRESH_TIMEOUT = 30.0


class CredentialRefreshTimeout(EgressdError):
    """A token refresh or reload took longer than its timeout (a hung exec plugin)."""


def _normalize_auth(value: str | None) -> str | None:
    """The Authorization header for a loader's api key.

    kubeconfig tokens come as `Bearer x`, in-cluster ones as `bearer x`;
    username/password comes as a ready `Basic ...` header.
    """
    if not value:
        return None
    scheme, sep, rest = value.partition(" ")
    if sep and scheme.lower() == "bearer":
        return f"Bearer {rest.strip()}"
    return value


class Credentials:
    """The refreshing bearer token of one connection (never logged, never in a repr).

    `load` builds a fresh `kubernetes.client.Configuration` (blocking); the
    cached one's refresh hook runs in a worker thread.
    """

    def __init__(
        self,
        load: Callable[[], Any],
        configuration: Any,
        *,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        refresh_timeout: float = DEFAULT_REFRESH_TIMEOUT,
    ) -> None:
        self._load = load
        self._configuration = configuration
        self._refresh_interval = refresh_interval
        self._refresh_timeout = refresh_timeout
        self._header: str | None = None
        self._fetched_at: float | None = None
        self._generation = 0
        self._lock = trio.Lock()
        self._limiter = trio.CapacityLimiter(1)

    def __repr__(self) -> str:
        return "<Credentials>"

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking loader call; abandoned (not awaited) on cancel or timeout.

        The one-thread limiter keeps an abandoned call that is still running
        from overlapping the next one (they share the Configuration).
        """
        with trio.move_on_after(self._refresh_timeout):
            return await trio.to_thread.run_sync(
                fn, *args, limiter=self._limiter, abandon_on_cancel=True)
        raise CredentialRefreshTimeout(
            f"no answer within {self._refresh_timeout:g} s (a hung exec plugin?)")

    @property
    def generation(self) -> int:
        """Bumped by every `reload()`; lets a 401 tell whether someone already reloaded."""
        return self._generation

    async def header(self) -> str | None:
        """The current Authorization header value, or None when the config has no token."""
        async with self._lock:
            now = trio.current_time()
            if self._fetched_at is None or now - self._fetched_at >= self._refresh_interval:
                cfg = self._configuration
                try:
                    raw = await self._in_thread(cfg.get_api_key_with_prefix, "BearerToken")
                except Exception as exc:
                    # A token file caught mid-rotation or a failing exec plugin:
                    # keep the last token; a 401 will force a full reload.
                    log.warning("refreshing Kubernetes credentials failed",
                                extra={"error": repr(exc)})
                else:
                    self._header = _normalize_auth(raw)
                self._fetched_at = trio.current_time()
            return self._header

    async def reload(self, *, seen_generation: int) -> str | None:
        """Re-run the loader (re-read token files, re-run exec plugins) after a 401.

        When another request already reloaded since `seen_generation`, its
        result is reused instead of reloading again.
        """
        async with self._lock:
            if self._generation == seen_generation:
                try:
                    cfg = await self._in_thread(self._load)
                    raw = await self._in_thread(cfg.get_api_key_with_prefix, "BearerToken")
                except Exception as exc:
                    # ConfigError from the loader, or whatever its refresh hook
                    # raises: the caller sees the 401 it already has.
                    log.warning("reloading Kubernetes credentials failed",
                                extra={"error": repr(exc)})
                    return self._header
                self._configuration = cfg
                self._header = _normalize_auth(raw)
                self._fetched_at = trio.current_time()
                self._generation += 1
            return self._header


@attrs.frozen
class KubeConfig:
    """How to reach one API server: address, TLS material and credentials."""

    server: str
    """Base URL (`https://host:port`), no trailing slash."""
    ca_file: str | None
    """PEM file of the CA that signs the server's certificate (None: system CAs)."""
    ca_data: str | None
    """The same CA bundle, read at load time (temp files may not outlive the loader)."""
    client_cert_file: str | None
    client_key_file: str | None
    verify: bool
    """False only when the kubeconfig says insecure-skip-tls-verify."""
    tls_server_name: str | None
    """Name to verify the server certificate against, when not the URL's host."""
    proxy_url: str | None
    """HTTP proxy to reach the server through (kubeconfig `proxy-url`)."""
    namespace: str | None
    """The context's (or service account's) namespace, if it names one."""
    source: str
    """Where this came from, for messages: `in-cluster` or `kubeconfig PATH (context C)`."""
    credentials: Credentials = attrs.field(eq=False, repr=False)


def _configuration() -> Any:
    from kubernetes.client import Configuration

    return Configuration()


def _read_optional(path: str | None) -> str | None:
    if not path:
        return None
    with open(path) as f:
        return f.read()


def _from_configuration(
    cfg: Any, *, load: Callable[[], Any], namespace: str | None, source: str,
    refresh_interval: float, refresh_timeout: float,
) -> KubeConfig:
    try:
        ca_data = _read_optional(cfg.ssl_ca_cert)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read CA file {cfg.ssl_ca_cert}: {exc}") from None
    return KubeConfig(
        server=str(cfg.host).rstrip("/"),
        ca_file=cfg.ssl_ca_cert or None,
        ca_data=ca_data,
        client_cert_file=cfg.cert_file or None,
        client_key_file=cfg.key_file or None,
        verify=bool(cfg.verify_ssl),
        tls_server_name=cfg.tls_server_name or None,
        proxy_url=cfg.proxy or None,
        namespace=namespace,
        source=source,
        credentials=Credentials(load, cfg, refresh_interval=refresh_interval,
                                refresh_timeout=refresh_timeout),
    )


def _kubeconfig_loader(path: str, context: str | None, source: str) -> Callable[[], Any]:
    def load() -> Any:
        from kubernetes.config import ConfigException, kube_config

        cfg = _configuration()
        try:
            kube_config.load_kube_config(
                config_file=path, context=context, client_configuration=cfg,
                persist_config=False)  # type: ignore[no-untyped-call]
        except (ConfigException, yaml.YAMLError, OSError, KeyError, TypeError,
                ValueError, AttributeError) as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if not cfg.host or cfg.host == "http://localhost":
            raise ConfigError(f"{source}: the cluster has no server address")
        return cfg

    return load


def _context_namespace(path: str, context: str | None, source: str, cfg: Any) -> str | None:
    """The context's namespace; also rejects what the package's loader lets through.

    The loader quietly ignores a context whose user is not in the file, and an
    exec plugin that fails (it only logs); kubectl refuses both, and a daemon
    running without credentials would only see 401s.
    """
    from kubernetes.config import kube_config

    try:
        contexts, current = kube_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=path)
        merged = kube_config.KubeConfigMerger(path).config  # type: ignore[no-untyped-call]
        users = [node.value for node in merged.value.get("users") or []]
    except Exception:  # the loader already validated the file; these checks are extra
        return None
    wanted = context or (current or {}).get("name")
    body: dict[str, Any] = next(
        (ctx.get("context") or {} for ctx in contexts or [] if ctx.get("name") == wanted), {})
    user_name = body.get("user")
    if user_name:
        user = next((u.get("user") or {} for u in users
                     if isinstance(u, dict) and u.get("name") == user_name), None)
        if user is None:
            raise ConfigError(
                f'{source}: user "{user_name}" was not found for context "{wanted}"')
        exec_spec = user.get("exec")
        if isinstance(exec_spec, dict) and not cfg.api_key.get("BearerToken") and not (
                cfg.cert_file):
            raise ConfigError(
                f"{source}: exec plugin {exec_spec.get('command')!r} of user "
                f'"{user_name}" gave no credentials (its error is logged above)')
    ns = body.get("namespace")
    return str(ns) if ns else None


def _load_kubeconfig_sync(
    path: str, context: str | None, refresh_interval: float, refresh_timeout: float
) -> KubeConfig:
    source = f"kubeconfig {path}" + (f" (context {context})" if context else "")
    for one in path.split(os.pathsep):
        if not os.path.isfile(os.path.expanduser(one)):
            raise ConfigError(f"{source}: file {one} not found")
    expanded = os.pathsep.join(os.path.expanduser(p) for p in path.split(os.pathsep))
    load = _kubeconfig_loader(expanded, context, source)
    cfg = load()
    return _from_configuration(
        cfg, load=load, namespace=_context_namespace(expanded, context, source, cfg),
        source=source,
        refresh_interval=refresh_interval, refresh_timeout=refresh_timeout)


def _load_incluster_sync(
    *, environ: Mapping[str, str], token_file: str, ca_file: str, namespace_file: str | None,
    refresh_interval: float, refresh_timeout: float,
) -> KubeConfig:
    source = "in-cluster config"

    def load() -> Any:
        from kubernetes.config import ConfigException
        from kubernetes.config.incluster_config import InClusterConfigLoader

        cfg = _configuration()
        try:
            loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
                token_filename=token_file, cert_filename=ca_file, environ=environ)
            loader.load_and_set(cfg)  # type: ignore[no-untyped-call]
        except (ConfigException, OSError) as exc:
            raise ConfigError(f"{source}: {exc} (token {token_file}, CA {ca_file})") from None
        return cfg

    cfg = load()
    namespace: str | None = None
    if namespace_file and os.path.isfile(namespace_file):
        with open(namespace_file) as f:
            namespace = f.read().strip() or None
    return _from_configuration(
        cfg, load=load, namespace=namespace, source=source, refresh_interval=refresh_interval,
        refresh_timeout=refresh_timeout)


def in_cluster(environ: Mapping[str, str]) -> bool:
    """True when the process runs in a Pod (the service env variables are set)."""
    return bool(environ.get(SERVICE_HOST_ENV)) and bool(environ.get(SERVICE_PORT_ENV))


async def load_incluster_config(
    *,
    environ: Mapping[str, str] | None = None,
    token_file: str = f"{SERVICE_ACCOUNT_DIR}/token",
    ca_file: str = f"{SERVICE_ACCOUNT_DIR}/ca.crt",
    namespace_file: str | None = f"{SERVICE_ACCOUNT_DIR}/namespace",
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
    refresh_timeout: float = DEFAULT_REFRESH_TIMEOUT,
) -> KubeConfig:
    """The service account's config; raises ConfigError naming what is missing."""
    env = dict(os.environ if environ is None else environ)
    return await trio.to_thread.run_sync(lambda: _load_incluster_sync(
        environ=env, token_file=token_file, ca_file=ca_file, namespace_file=namespace_file,
        refresh_interval=refresh_interval, refresh_timeout=refresh_timeout),
        abandon_on_cancel=True)


async def load_config(
    *,
    kubeconfig: str | None,
    context: str | None,
    environ: Mapping[str, str] | None = None,
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
    refresh_timeout: float = DEFAULT_REFRESH_TIMEOUT,
) -> KubeConfig:
    """The connection to use (docs/reference.md `--kubeconfig`, `--context`).

    An explicit kubeconfig wins; without one, in-cluster config when the
    service environment is present, else `$KUBECONFIG`, else `~/.kube/config`.
    Raises ConfigError naming the file or context when it is missing, malformed
    or names an unknown context. Loading runs exec plugins with no timeout of
    their own: bound it at the call site; a cancelled load is abandoned.
    """
    env = os.environ if environ is None else environ
    if kubeconfig is None and context is None and in_cluster(env):
        return await load_incluster_config(environ=env, refresh_interval=refresh_interval,
                                           refresh_timeout=refresh_timeout)
    path = kubeconfig or env.get("KUBECONFIG") or "~/.kube/config"
    return await trio.to_thread.run_sync(
        lambda: _load_kubeconfig_sync(path, context, refresh_interval, refresh_timeout),
        abandon_on_cancel=True)
