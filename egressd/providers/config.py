"""The providers config (`--providers-config FILE`, SPEC §4), parsed strictly.

Every mistake is collected, not just the first, each with its path inside the
file (`providers[1].gcp.zonee: unknown field`), so one `egressd check-config`
run shows all of them. Wire names are camelCase (`machineType`); the parsed
values are frozen attrs classes with snake_case fields.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import yaml

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


class ProvidersConfigError(ConfigError):
    """The providers config cannot be used; `problems` lists every mistake with its path."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid providers config: " + "; ".join(self.problems))


@attrs.frozen(kw_only=True)
class GcpConfig:
    """A GCP Compute Engine provider: where and how its VMs are made."""

    project: str | None = None
    """The project; unset means the project of the Application Default Credentials."""
    zone: str
    """Default zone; a Proxy's `placement.zone` overrides it."""
    machine_type: str
    """Default machine type (`e2-micro`); `placement.machineType` overrides it."""
    image: str
    """Boot image, e.g. `projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64`."""
    network: str = "default"
    """VPC network name or URL."""
    subnetwork: str | None = None
    """Subnetwork name or URL (needed for custom-mode networks)."""
    network_tags: tuple[str, ...] = ()
    """Network tags on every VM, to pair with a firewall rule."""
    credentials_file: str | None = None
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

    namespace: str
    """Namespace the Pods are created in."""
    image: str
    """Container image with Squid and a POSIX shell (e.g. `ubuntu/squid:6.6-24.04_edge`)."""
    allowed_sources: tuple[str, ...] = PRIVATE_SOURCES
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


# --- the schema -----------------------------------------------------------

Check = Callable[[Any], str | None]


@attrs.frozen
class _Field:
    wire: str
    attr: str
    kind: str  # "str" or "str-list"
    required: bool
    check: Check | None = None
    min_items: int = 0


def _matches(pattern: re.Pattern[str], what: str) -> Check:
    def check(value: Any) -> str | None:
        return None if pattern.match(value) else f"{value!r} is not {what}"

    return check


def _non_empty(value: Any) -> str | None:
    return None if value.strip() else "must not be empty"


def _cidr(value: Any) -> str | None:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return f"{value!r} is not an IP address or CIDR"
    return None


_GCP_FIELDS = (
    _Field("project", "project", "str", False, _non_empty),
    _Field("zone", "zone", "str", True, _matches(ZONE_RE, "a zone (like europe-west1-b)")),
    _Field("machineType", "machine_type", "str", True, _non_empty),
    _Field("image", "image", "str", True, _non_empty),
    _Field("network", "network", "str", False, _non_empty),
    _Field("subnetwork", "subnetwork", "str", False, _non_empty),
    _Field("networkTags", "network_tags", "str-list", False,
           _matches(_TAG_RE, "a network tag (lower-case letters, digits, '-')")),
    _Field("credentialsFile", "credentials_file", "str", False, _non_empty),
)
_KUBERNETES_FIELDS = (
    _Field("namespace", "namespace", "str", True,
           _matches(_DNS_LABEL_RE, "a namespace name (a DNS label)")),
    _Field("image", "image", "str", True, _non_empty),
    _Field("allowedSources", "allowed_sources", "str-list", False, _cidr, min_items=1),
)
_BLOCKS: dict[str, tuple[tuple[_Field, ...], type[GcpConfig] | type[KubernetesConfig]]] = {
    GCP: (_GCP_FIELDS, GcpConfig),
    KUBERNETES: (_KUBERNETES_FIELDS, KubernetesConfig),
}
_ENTRY_KEYS = ("name", "type", *TYPES)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "list", dict: "mapping"}.get(type(value), type(value).__name__)


def _block(raw: Any, fields: Sequence[_Field], path: str,  # noqa: C901 -- its owner splits it (issue 10)
           problems: list[str]) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        problems.append(f"{path}: expected a mapping, got {_type_name(raw)}")
        return None
    known = {f.wire for f in fields}
    for key in raw:
        if key not in known:
            problems.append(f"{path}.{key}: unknown field")
    values: dict[str, Any] = {}
    ok = True
    for f in fields:
        where = f"{path}.{f.wire}"
        if f.wire not in raw:
            if f.required:
                problems.append(f"{where}: required field is missing")
                ok = False
            continue
        value = raw[f.wire]
        if f.kind == "str":
            if not isinstance(value, str):
                problems.append(f"{where}: expected a string, got {_type_name(value)}")
                ok = False
                continue
            problem = f.check(value) if f.check else None
            if problem:
                problems.append(f"{where}: {problem}")
                ok = False
                continue
            values[f.attr] = value
        else:
            if not isinstance(value, list):
                problems.append(f"{where}: expected a list of strings, got {_type_name(value)}")
                ok = False
                continue
            if len(value) < f.min_items:
                problems.append(f"{where}: needs at least {f.min_items} item(s)")
                ok = False
            items: list[str] = []
            for i, item in enumerate(value):
                if not isinstance(item, str):
                    problems.append(f"{where}[{i}]: expected a string, got {_type_name(item)}")
                    ok = False
                elif f.check and (problem := f.check(item)):
                    problems.append(f"{where}[{i}]: {problem}")
                    ok = False
                else:
                    items.append(item)
            values[f.attr] = tuple(items)
    return values if ok else None


def _entry(raw: Any, path: str, problems: list[str]) -> ProviderConfig | None:  # noqa: C901 -- its owner splits it (issue 10)
    if not isinstance(raw, dict):
        problems.append(f"{path}: expected a mapping, got {_type_name(raw)}")
        return None
    for key in raw:
        if key not in _ENTRY_KEYS:
            problems.append(f"{path}.{key}: unknown field")
    name = raw.get("name")
    if "name" not in raw:
        problems.append(f"{path}.name: required field is missing")
    elif not isinstance(name, str):
        problems.append(f"{path}.name: expected a string, got {_type_name(name)}")
        name = None
    elif not _NAME_RE.match(name):
        problems.append(f"{path}.name: {name!r} is not a valid name "
                        "(letters, digits, '-', '_', '.'; alphanumeric at both ends)")
        name = None
    kind = raw.get("type")
    if "type" not in raw:
        problems.append(f"{path}.type: required field is missing (one of {', '.join(TYPES)})")
        kind = None
    elif not isinstance(kind, str):
        problems.append(f"{path}.type: expected a string, got {_type_name(kind)}")
        kind = None
    elif kind not in TYPES:
        problems.append(f"{path}.type: unknown type {kind!r} (one of {', '.join(TYPES)})")
        kind = None
    # A block for a type other than the declared one is a mistake, not ignored.
    for other in TYPES:
        if other in raw and kind is not None and other != kind:
            problems.append(f"{path}.{other}: not allowed for type {kind!r}")
    if kind is None:
        return None
    if kind not in raw:
        problems.append(f"{path}.{kind}: required for type {kind!r} but missing")
        return None
    fields, cls = _BLOCKS[kind]
    values = _block(raw[kind], fields, f"{path}.{kind}", problems)
    if values is None or name is None:
        return None
    return ProviderConfig(name=name, settings=cls(**values))


def providers_config_from(data: Any) -> ProvidersConfig:  # noqa: C901 -- its owner splits it (issue 10)
    """Validate decoded YAML; raise `ProvidersConfigError` listing every problem."""
    problems: list[str] = []
    if data is None:
        raise ProvidersConfigError(["empty file: expected a mapping with a 'providers' list"])
    if not isinstance(data, dict):
        raise ProvidersConfigError(
            [f"top level: expected a mapping with a 'providers' list, got {_type_name(data)}"])
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
        problems.append(f"providers: expected a list, got {_type_name(raw_list)}")
    else:
        first_seen: dict[str, int] = {}
        for i, raw in enumerate(raw_list):
            path = f"providers[{i}]"
            name = raw.get("name") if isinstance(raw, dict) else None
            if isinstance(name, str):
                if name in first_seen:
                    problems.append(
                        f"{path}.name: duplicate name {name!r} (first used by "
                        f"providers[{first_seen[name]}])")
                else:
                    first_seen[name] = i
            entry = _entry(raw, path, problems)
            if entry is not None:
                entries.append(entry)
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
    """Read and parse the providers config file at `path` (SPEC §4)."""
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
