"""Settings: every SPEC §9 flag, its environment variable, defaults and bad values."""

import attrs
import pytest

from egressd.settings import Settings, env_name, flag_name, parse_settings

SPEC_FLAGS = [
    "--kubeconfig", "--context", "--namespace", "--providers-config", "--cluster-name",
    "--discovery-addr", "--discovery-token-file", "--metrics-addr", "--max-lease-ttl",
    "--cooldown", "--ban-cooldown", "--max-cooldown", "--workers", "--probe-concurrency",
    "--probe-ca-file", "--gc-interval", "--leader-elect", "--leader-election-namespace",
    "--log-level", "--log-format",
]


def test_every_spec_flag_is_a_documented_field() -> None:
    flags = {flag_name(f.name): f for f in attrs.fields(Settings)}
    for flag in SPEC_FLAGS:
        assert flag in flags, flag
    for field in flags.values():
        assert field.metadata["help"].strip(), field.name


def test_defaults_match_the_spec() -> None:
    s = parse_settings([], environ={})
    assert s.namespace == ""
    assert s.discovery_addr == ":8090"
    assert s.metrics_addr == ":8080"
    assert s.max_lease_ttl == 3600
    assert s.default_lease_ttl == 300
    assert s.cooldown == 600
    assert s.ban_cooldown == 3600
    assert s.max_cooldown == 3600
    assert s.workers == 4
    assert s.gc_interval == 600
    assert s.provisioning_poll == 5
    assert s.ready_resync == 300
    assert s.quota_retry == 300
    assert s.immediate_retry == 1
    assert s.leader_elect is True
    assert (s.leader_lease_duration, s.leader_renew_deadline, s.leader_retry_period) == (15, 10, 2)
    assert s.log_format == "text"


def test_flags_win_over_environment_which_wins_over_defaults() -> None:
    env = {env_name("cooldown"): "2m", env_name("workers"): "8", env_name("leader_elect"): "false"}
    s = parse_settings(["--cooldown", "30s"], environ=env)
    assert s.cooldown == 30
    assert s.workers == 8
    assert s.leader_elect is False
    assert parse_settings(["--leader-elect"], environ=env).leader_elect is True


@pytest.mark.parametrize(("argv", "expected"), [
    ([], True), (["--leader-elect"], True), (["--leader-elect=true"], True),
    (["--leader-elect=false"], False), (["--leader-elect", "false"], False),
    (["--no-leader-elect"], False), (["--no-leader-elect", "--leader-elect"], True),
])
def test_a_boolean_flag_is_bare_valued_or_negated(argv: list[str], expected: bool) -> None:
    assert parse_settings(argv, environ={}).leader_elect is expected


def test_settings_are_frozen() -> None:
    s = parse_settings([], environ={})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        s.workers = 9  # type: ignore[misc]


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--cooldown", "ten"], {}, "--cooldown"),
        (["--max-lease-ttl", "0s"], {}, "--max-lease-ttl"),
        (["--workers", "0"], {}, "--workers"),
        (["--log-format", "xml"], {}, "--log-format"),
        (["--discovery-addr", "8090"], {}, "--discovery-addr"),
        ([], {"EGRESSD_BAN_COOLDOWN": "1y"}, "EGRESSD_BAN_COOLDOWN"),
        ([], {"EGRESSD_LEADER_ELECT": "maybe"}, "EGRESSD_LEADER_ELECT"),
    ],
)
def test_bad_values_name_the_flag(argv: list[str], env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=f"^{named}: "):
        parse_settings(argv, environ=env)
