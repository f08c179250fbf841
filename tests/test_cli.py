"""The `egressd` command as a user runs it: exit codes and one-line errors."""

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
