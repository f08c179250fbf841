"""Every tunable of `egressd run`, as one frozen `Settings` value (docs/reference.md).

Each field is a flag (`--max-lease-ttl`) and an environment variable
(`EGRESSD_MAX_LEASE_TTL`); a flag wins over the environment, the environment
over the default. Each field's docstring is its `help` metadata, which is also
what `egressd run --help` prints, so the two cannot drift.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from egressd.durations import format_duration, parse_duration

ENV_PREFIX = "EGRESSD_"


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"invalid boolean {text!r} (use true or false)")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise ValueError(f"must be longer than 0s, got {text!r}")
    return value


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"invalid choice {text!r} (choose from {', '.join(choices)})")
        return text

    return parse


def _addr(text: str) -> str:
    _host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid address {text!r} (use HOST:PORT or :PORT)")
    return text


def _opt_str(text: str) -> str | None:
    return text or None


def _opt_addr(text: str) -> str | None:
    return _addr(text) if text else None


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must be at least 0, got {value}")
    return value


def _statuses(text: str) -> frozenset[int]:
    """`403,451` as a set of HTTP status codes; empty text is none."""
    out: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            continue
        code = int(part)
        if not 100 <= code <= 599:
            raise ValueError(f"invalid HTTP status {code}")
        out.add(code)
    return frozenset(out)


def setting(default: Any, help: str, parse: Callable[[str], Any] = str) -> Any:
    """A Settings field: its default, its docstring (`help`) and its string parser."""
    return attrs.field(default=default, metadata={"help": help, "parse": parse})


@attrs.frozen(kw_only=True)
class Settings:
    """The configuration of one egressd process."""

    # Kubernetes connection
    kubeconfig: str | None = setting(
        None, "Path of a kubeconfig file; unset means in-cluster config, then ~/.kube/config.",
        _opt_str)
    context: str | None = setting(None, "kubeconfig context to use (default: current).", _opt_str)
    namespace: str = setting("", "Watch Proxies in this namespace only (default: all).")
    cluster_name: str = setting(
        "default", "Name of this cluster, stamped on every instance for orphan GC.")

    # Providers
    providers_config: str | None = setting(
        None, "YAML file listing the providers (docs/providers.md).", _opt_str)

    # Discovery API
    discovery_addr: str = setting(":8090", "Address the discovery API listens on.", _addr)
    discovery_token_file: str | None = setting(
        None, "File holding the discovery API bearer token (else $DISCOVERY_TOKEN).", _opt_str)
    default_lease_ttl: float = setting(
        300.0, "Lease TTL when a request omits ttlSeconds.", _positive_duration)
    max_lease_ttl: float = setting(
        3600.0, "Longest lease TTL a client may ask for.", _positive_duration)
    cooldown: float = setting(
        600.0, "Cooldown after a rate_limited report without Retry-After.", _positive_duration)
    ban_cooldown: float = setting(3600.0, "Cooldown after a banned report.", _positive_duration)
    max_cooldown: float = setting(
        3600.0, "Upper bound on a cooldown taken from a client's retryAfterSeconds.",
        _positive_duration)
    max_cooldowns_per_proxy: int = setting(
        64, "Per-target cooldowns one proxy keeps at most; the soonest-ending goes first.",
        _positive_int)
    shutdown_grace: float = setting(
        10.0, "How long in-flight HTTP requests may finish at shutdown.", parse_duration)
    listen_backlog: int = setting(
        1024, "Connections queued for accept on each HTTP and gateway socket "
        "(capped by net.core.somaxconn).", _positive_int)

    # Gateway (docs/gateway.md)
    gateway_addr: str | None = setting(
        None, "Address of the forward-proxy gateway (HOST:PORT; unset = no gateway).",
        _opt_addr)
    gateway_retries: int = setting(
        2, "Other proxies a tunnel tries after its upstream proxy failed.", _non_negative_int)
    gateway_max_tunnels: int = setting(
        1024, "Gateway connections at most; past it a client gets 503.", _positive_int)
    gateway_idle_timeout: float = setting(
        300.0, "A gateway tunnel with no byte either way for this long is closed.",
        _positive_duration)
    gateway_handshake_timeout: float = setting(
        10.0, "Longest a gateway client may take to send its request head.",
        _positive_duration)
    gateway_connect_timeout: float = setting(
        10.0, "Longest one upstream proxy may take to open a tunnel.", _positive_duration)
    gateway_session_idle: float = setting(
        300.0, "A sticky session with no tunnel for this long forgets its proxy.",
        _positive_duration)
    gateway_ban_statuses: frozenset[int] = setting(
        frozenset(), "HTTP statuses of plain-http answers reported as banned (e.g. 403,451).",
        _statuses)

    # Ops endpoints
    metrics_addr: str = setting(":8080", "Address of /metrics, /healthz and /readyz.", _addr)

    # Reconciler
    workers: int = setting(4, "Reconciler workers.", _positive_int)
    provisioning_poll: float = setting(
        5.0, "How often a provisioning instance is polled.", _positive_duration)
    ready_resync: float = setting(
        300.0, "How often a settled Proxy is reconciled again.", _positive_duration)
    quota_retry: float = setting(
        300.0, "Retry delay after a provider quota error.", _positive_duration)
    immediate_retry: float = setting(
        1.0, "Delay before the next step of a multi-step reconcile.", _positive_duration)
    gc_interval: float = setting(
        600.0, "How often orphaned instances are collected.", _positive_duration)
    orphan_min_age: float = setting(
        600.0, "Instances younger than this are never collected as orphans.", parse_duration)

    # Health engine
    probe_concurrency: int = setting(64, "Probes in flight at most.", _positive_int)
    probe_ca_file: str | None = setting(
        None, "Extra CA bundle (PEM) trusted for probe targets.", _opt_str)

    # Leader election
    leader_elect: bool = setting(
        True, "Campaign for the leader Lease before reconciling, so one replica acts at a "
        "time; --leader-elect=false (or --no-leader-elect) runs unelected and warns.", _bool)
    leader_election_namespace: str = setting(
        "", "Namespace of the leader election Lease (default: own namespace or default).")
    leader_lease_duration: float = setting(
        15.0, "How long a leader's Lease is valid without renewal.", _positive_duration)
    leader_renew_deadline: float = setting(
        10.0, "How long a leader keeps trying to renew before it steps down.",
        _positive_duration)
    leader_retry_period: float = setting(
        2.0, "How often a candidate tries to acquire or renew the Lease.", _positive_duration)

    # Logs
    log_level: str = setting(
        "info", "Log level.", _choice("debug", "info", "warning", "error"))
    log_format: str = setting("text", "Log format.", _choice("text", "json"))


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per Settings field; values stay strings until `settings_from`.

    A boolean field's flag also works bare (`--leader-elect` = true) and has a
    `--no-` form (`--no-leader-elect` = false).
    """
    for field in attrs.fields(Settings):
        default = field.default
        shown = format_duration(default) if isinstance(default, float) else default
        if isinstance(default, frozenset):
            shown = ",".join(map(str, sorted(default)))
        help_text = f"{field.metadata['help']} [{env_name(field.name)}; default {shown!r}]"
        if field.metadata["parse"] is _bool:
            parser.add_argument(flag_name(field.name), dest=field.name, default=None,
                                nargs="?", const="true", metavar="true|false", help=help_text)
            parser.add_argument("--no-" + flag_name(field.name)[2:], dest=field.name,
                                action="store_const", const="false",
                                help=f"Same as {flag_name(field.name)}=false.")
            continue
        parser.add_argument(
            flag_name(field.name),
            dest=field.name,
            default=None,
            metavar=field.name.upper(),
            help=help_text,
        )


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Build Settings from parsed flags, then the environment, then the defaults.

    Raises ValueError naming the flag or variable when a value does not parse.
    """
    values: dict[str, Any] = {}
    for field in attrs.fields(Settings):
        raw: str | None = getattr(args, field.name, None)
        source = flag_name(field.name)
        if raw is None:
            raw = environ.get(env_name(field.name))
            source = env_name(field.name)
        if raw is None:
            continue
        try:
            values[field.name] = field.metadata["parse"](raw)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    return Settings(**values)


def parse_settings(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Parse `egressd run` arguments (for tests and embedding)."""
    parser = argparse.ArgumentParser(prog="egressd run")
    add_flags(parser)
    args = parser.parse_args(list(argv))
    return settings_from(args, os.environ if environ is None else environ)
