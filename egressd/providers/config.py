"""The providers config (`--providers-config FILE`, docs/providers.md), parsed strictly.

Every mistake is collected, not just the first, each with its path inside the
file (`providers[1].gcp.zonee: unknown field`), so one `egressd check-config`
run shows all of them. The blocks are read by the house codec (`egressd.codec`):
wire names are camelCase (`machineType`), each field's rule is an `Annotated`
check beside its type, and the parsed values are frozen attrs classes. Only the
entry's `type` → block dispatch is written here by hand.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import attrs
import yaml

from egressd.codec import (
    CIDR,
    NON_EMPTY,
    TYPE_WORDS,
    Check,
    Codec,
    Doc,
    WireError,
    matches,
    min_items,
)
from egressd.errors import ConfigError

GCP = "gcp"
KUBERNETES = "kubernetes"
TYPES = (GCP, KUBERNETES)

# A GCE zone is <region>-<letter>, a region <continent>-<area><digit>
# (europe-west1-b, us-central1-a, northamerica-northeast2-c).
ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
# GCE network tags and Kubernetes namespaces are both RFC 1035/1123 labels.
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_TAG_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

Text = Annotated[str, NON_EMPTY]
NetworkTag = Annotated[str, matches(_TAG_RE, "a network tag (lower-case letters, digits, '-')")]
Cidr = Annotated[str, CIDR]


class ProvidersConfigError(ConfigError):
    """The providers config cannot be used; `problems` lists every mistake with its path."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid providers config: " + "; ".join(self.problems))


@attrs.frozen(kw_only=True)
class GcpConfig:
    """A GCP Compute Engine provider: where and how its VMs are made."""

    project: Text | None = None
    """The project; unset means the project of the Application Default Credentials."""
    zone: Annotated[str, matches(ZONE_RE, "a zone (like europe-west1-b)")]
    """Default zone; a Proxy's `placement.zone` overrides it."""
    machine_type: Text
    """Default machine type (`e2-micro`); `placement.machineType` overrides it."""
    image: Text
    """Boot image, e.g. `projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64`."""
    network: Text = "default"
    """VPC network name or URL."""
    subnetwork: Text | None = None
    """Subnetwork name or URL (needed for custom-mode networks)."""
    network_tags: tuple[NetworkTag, ...] = ()
    """Network tags on every VM, to pair with a firewall rule."""
    credentials_file: Text | None = None
    """A service-account key file; unset means Application Default Credentials."""


# Clients a kubernetes-provider proxy serves by default: private and CGNAT
# ranges cover Pod and node CIDRs on common clusters. Never "all": even inside
# a cluster an open proxy is an open door.
PRIVATE_SOURCES = (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8",
    "fc00::/7", "fe80::/10", "::1",
)


@attrs.frozen(kw_only=True)
class KubernetesConfig:
    """A Kubernetes provider: Squid Pods in one namespace."""

    namespace: Annotated[str, matches(_DNS_LABEL_RE, "a namespace name (a DNS label)")]
    """Namespace the Pods are created in."""
    image: Text
    """Container image with Squid and a POSIX shell (e.g. `ubuntu/squid:6.6-24.04_edge`)."""
    allowed_sources: Annotated[tuple[Cidr, ...], min_items(1)] = PRIVATE_SOURCES
    """CIDRs allowed to use the proxies (default: private and CGNAT ranges)."""


@attrs.frozen(kw_only=True)
class ProviderConfig:
    """One entry of the config: a named provider and its type's settings."""

    name: str
    settings: GcpConfig | KubernetesConfig

    @property
    def type(self) -> str:
        """`gcp` or `kubernetes`."""
        return GCP if isinstance(self.settings, GcpConfig) else KUBERNETES


@attrs.frozen
class ProvidersConfig:
    """Every configured provider, in file order; names are unique."""

    providers: tuple[ProviderConfig, ...] = ()

    def names(self) -> list[str]:
        """The provider names, in file order."""
        return [p.name for p in self.providers]


# --- parsing --------------------------------------------------------------

codec = Codec(words=TYPE_WORDS, forbid_extra_keys=True, null_is_absent=False)
"""Config files are strict: an unknown key or a `null` is a mistake, not a default."""

_KNOWN_TYPE = Check(lambda v: None if v in TYPES else
                    f"unknown type {v!r} (one of {', '.join(TYPES)})")
_BLOCKS: dict[str, type[GcpConfig] | type[KubernetesConfig]] = {
    GCP: GcpConfig, KUBERNETES: KubernetesConfig}


@attrs.frozen(kw_only=True)
class _Entry:
    """An entry as written: its type's block is read once the type is known to be valid."""

    name: Annotated[str, matches(_NAME_RE, "a valid name (letters, digits, '-', '_', '.'; "
                                           "alphanumeric at both ends)")]
    type: Annotated[str, _KNOWN_TYPE, Doc("one of gcp, kubernetes")] | None = None
    gcp: Mapping[str, Any] | None = None
    kubernetes: Mapping[str, Any] | None = None


def _entry(raw: Any, path: str, problems: list[str]) -> ProviderConfig | None:
    try:
        entry: _Entry | None = codec.structure(raw, _Entry, path=path)
    except WireError as exc:
        problems.extend(str(p) for p in exc.problems)
        entry = None
    if not isinstance(raw, dict):
        return None
    if "type" not in raw:
        problems.append(f"{path}.type: required field is missing (one of {', '.join(TYPES)})")
        return None
    kind = raw["type"]
    if kind not in TYPES:
        return None  # the codec said why
    # A block for a type other than the declared one is a mistake, not ignored.
    for other in TYPES:
        if other != kind and other in raw:
            problems.append(f"{path}.{other}: not allowed for type {kind!r}")
    if kind not in raw:
        problems.append(f"{path}.{kind}: required for type {kind!r} but missing")
        return None
    try:
        settings: GcpConfig | KubernetesConfig = codec.structure(
            raw[kind], _BLOCKS[kind], path=f"{path}.{kind}")
    except WireError as exc:
        problems.extend(str(p) for p in exc.problems)
        return None
    return None if entry is None else ProviderConfig(name=entry.name, settings=settings)


def _entries(raw_list: list[Any], problems: list[str]) -> list[ProviderConfig]:
    entries: list[ProviderConfig] = []
    first_seen: dict[str, int] = {}
    for i, raw in enumerate(raw_list):
        path = f"providers[{i}]"
        name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(name, str):
            if name in first_seen:
                problems.append(f"{path}.name: duplicate name {name!r} (first used by "
                                f"providers[{first_seen[name]}])")
            else:
                first_seen[name] = i
        entry = _entry(raw, path, problems)
        if entry is not None:
            entries.append(entry)
    return entries


def providers_config_from(data: Any) -> ProvidersConfig:
    """Validate decoded YAML; raise `ProvidersConfigError` listing every problem."""
    problems: list[str] = []
    if data is None:
        raise ProvidersConfigError(["empty file: expected a mapping with a 'providers' list"])
    if not isinstance(data, dict):
        raise ProvidersConfigError([
            "top level: expected a mapping with a 'providers' list, got "
            f"{TYPE_WORDS.got(data)}"])
    for key in data:
        if key != "providers":
            problems.append(f"{key}: unknown field")
    raw_list = data.get("providers")
    entries: list[ProviderConfig] = []
    if "providers" not in data:
        problems.append("providers: required field is missing")
    elif raw_list is None:
        pass  # `providers:` with nothing after it: no providers, like `providers: []`.
    elif not isinstance(raw_list, list):
        problems.append(f"providers: expected a list, got {TYPE_WORDS.got(raw_list)}")
    else:
        entries = _entries(raw_list, problems)
    if problems:
        raise ProvidersConfigError(problems)
    return ProvidersConfig(tuple(entries))


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_providers_config(text: str) -> ProvidersConfig:
    """Parse YAML text; raise `ProvidersConfigError` for bad YAML or any invalid entry."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ProvidersConfigError([f"invalid YAML: {_yaml_problem(exc)}"]) from None
    return providers_config_from(data)


def load_providers_config(path: str) -> ProvidersConfig:
    """Read and parse the providers config file at `path` (docs/providers.md)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ProvidersConfigError([f"cannot read file: {reason}"]) from None
    return parse_providers_config(text)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = exc.problem or str(exc)
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return str(exc)


def by_name(config: ProvidersConfig) -> Mapping[str, ProviderConfig]:
    """The entries keyed by name."""
    return {p.name: p for p in config.providers}
