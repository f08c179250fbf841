"""The `egressd` command as a user runs it: exit codes and one-line errors."""

import pathlib
import subprocess
import sys

import pytest

from egressd import __version__


def egressd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egressd", *args],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )


def test_version() -> None:
    out = egressd("version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"egressd {__version__}"


def test_run_help_lists_flags_with_their_environment_variables() -> None:
    out = egressd("run", "--help")
    assert out.returncode == 0
    assert "--max-lease-ttl" in out.stdout
    assert "EGRESSD_MAX_LEASE_TTL" in out.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["run", "--cooldown", "soon"], "--cooldown: invalid duration 'soon'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "required: command"),
        (["check-config", "/nonexistent/providers.yaml"], "/nonexistent/providers.yaml"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], needle: str) -> None:
    out = egressd(*args)
    assert out.returncode == 2
    assert needle in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 3  # argparse's usage line + the error


def test_bad_environment_value_exits_2_naming_the_variable() -> None:
    import os

    env = dict(os.environ, EGRESSD_WORKERS="many")
    out = egressd("run", env=env)
    assert out.returncode == 2
    assert out.stderr.startswith("egressd: error: EGRESSD_WORKERS:")
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("flag", "content", "needle"),
    [
        ("--discovery-token-file", None, "--discovery-token-file {path}: No such file"),
        ("--discovery-token-file", "\n", "--discovery-token-file {path}: file is empty"),
        ("--probe-ca-file", None, "--probe-ca-file {path}: "),
        ("--probe-ca-file", "not a certificate", "--probe-ca-file {path}: "),
        ("--kubeconfig", None, "--kubeconfig {path}: No such file"),
        ("--providers-config", None, "--providers-config {path}: cannot read file"),
        ("--providers-config", "providers:\n  - name: a\n    type: nope\n",
         "--providers-config {path}: providers[0].type: "),
    ],
)
def test_run_stops_at_start_on_a_bad_file(
    tmp_path: pathlib.Path, flag: str, content: str | None, needle: str
) -> None:
    path = tmp_path / "input"
    if content is not None:
        path.write_text(content)
    out = egressd("run", flag, str(path), env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 2, out.stderr
    assert needle.format(path=path) in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_run_with_good_files_goes_on_to_the_cluster_connection(tmp_path: pathlib.Path) -> None:
    # Every named file is fine, so start-up gets as far as the kubeconfig lookup, which
    # fails cleanly here (no kubeconfig, not in a cluster) — and never prints the token.
    token = tmp_path / "token"
    token.write_text("s3cret-0123456789\n")  # 16+ characters: strong enough
    out = egressd("run", "--discovery-token-file", str(token),
                  env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 2, out.stderr
    assert "kubeconfig" in out.stderr
    assert "s3cret" not in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(("token", "said"), [
    ("change-me", "is the placeholder 'change-me', not a token"),
    ("short-token", "is 11 characters, a token needs at least 16"),
])
def test_a_weak_discovery_token_stops_the_start_saying_how_to_set_one(
        token: str, said: str, tmp_path: pathlib.Path) -> None:
    """What an old manifests/config.yaml shipped, or a guessable one: refused at start,
    before any connection (no kubeconfig is needed to find out)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    by_env = egressd("run", env={**env, "DISCOVERY_TOKEN": token})
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    by_file = egressd("run", "--discovery-token-file", str(token_file), env=env)
    for out, source in ((by_env, "$DISCOVERY_TOKEN"),
                        (by_file, f"the token in --discovery-token-file {token_file}")):
        assert out.returncode == 2, out.stderr
        (line,) = out.stderr.splitlines()
        assert line.startswith(f"egressd: error: {source} {said}: set a random one"), line
        assert "kubectl -n egressd create secret generic egressd-discovery" in line
        assert "docs/reference.md" in line
        if token != "change-me":
            assert token not in line  # a real (if weak) token is never printed
