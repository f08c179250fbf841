"""`egressd-lease` run as a shell runs it, against the real egressd of `world`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from client_world import World

from tests.health.peers import closed_port

CLI = str(Path(sys.executable).with_name("egressd-lease"))


def run(world: World | None, *args: str, token: str | None = None, url: str | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["NO_PROXY"] = env["no_proxy"] = ""  # the site is on loopback: it must be proxied
    env["EGRESSD_URL"] = url or (world.discovery_url if world else "")
    env["EGRESSD_TOKEN"] = token or (world.token if world else "")
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False, cwd=cwd)


def cooldown(world: World, proxy_key: str, target: str) -> str | None:
    name = proxy_key.split("/", 1)[1]
    view = next(v for v in world.proxy_views() if v["name"] == name)
    entry = view["cooldowns"].get(target)
    return None if entry is None else str(entry["reason"])


needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


@needs_curl
def test_the_command_goes_through_the_lease_and_ok_is_reported(world: World) -> None:
    before = world.reports("ok")
    done = run(world, "--selector", "pool=test", "--target", "cli.test", "--",
               "sh", "-c", f'curl -sS -f {world.site_url}/ok/cli && echo "via $EGRESSD_PROXY"')
    assert done.returncode == 0, done.stderr
    [hit] = world.site.hits_for("/ok/cli")
    assert done.stdout.strip().endswith(f"via default/{world.proxy_by_egress(hit.peer).name}")
    assert world.reports("ok") == before + 1
    assert world.active_leases() == 0


def test_exit_75_reports_rate_limited_and_is_the_exit_status(world: World) -> None:
    done = run(world, "--target", "cli-limited.test", "--",
               "sh", "-c", 'echo "$EGRESSD_PROXY"; [ -n "$HTTPS_PROXY" ] && [ "$http_proxy" = '
                           '"$HTTP_PROXY" ] && exit 75')
    assert done.returncode == 75, done.stderr
    assert cooldown(world, done.stdout.strip(), "cli-limited.test") == "rate_limited"
    assert world.active_leases() == 0


def test_exit_77_reports_banned_and_report_overrides_the_table(world: World) -> None:
    banned = run(world, "--target", "cli-banned.test", "--", "sh", "-c",
                 'echo "$EGRESSD_PROXY"; exit 77')
    assert banned.returncode == 77
    assert cooldown(world, banned.stdout.strip(), "cli-banned.test") == "banned"
    custom = run(world, "--target", "cli-custom.test", "--report", "3=banned", "--",
                 "sh", "-c", 'echo "$EGRESSD_PROXY"; exit 3')
    assert custom.returncode == 3
    assert cooldown(world, custom.stdout.strip(), "cli-custom.test") == "banned"


@needs_curl
def test_a_curl_timeout_through_the_proxy_reports_proxy_error(world: World) -> None:
    before = world.reports("proxy_error")
    done = run(world, "--target", "cli-slow.test", "--",
               "curl", "-sS", "-m", "0.5", f"{world.site_url}/slow")
    assert done.returncode == 28
    assert world.reports("proxy_error") == before + 1
    assert world.active_leases() == 0


def test_a_signal_and_a_missing_command_still_release(world: World) -> None:
    before = {r: world.reports(r) for r in ("ok", "banned", "rate_limited", "proxy_error")}
    killed = run(world, "--", "sh", "-c", "kill -TERM $$")
    assert killed.returncode == 128 + 15
    missing = run(world, "--", "no-such-command-egressd")
    assert missing.returncode == 127
    assert "no-such-command-egressd: command not found" in missing.stderr
    assert {r: world.reports(r) for r in before} == before  # neither is reported
    assert world.active_leases() == 0


def test_a_wrong_token_is_one_line_and_exit_2(world: World) -> None:
    done = run(world, "--", "true", token="wrong-token")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "refused the token" in line and "EGRESSD_TOKEN" in line
    assert "wrong-token" not in line


def test_no_egressd_and_no_proxy_are_one_line_and_exit_69(world: World) -> None:
    unreachable = run(None, "--timeout", "2", "--", "true",
                      url=f"http://127.0.0.1:{closed_port()}", token="t")
    assert unreachable.returncode == 69
    assert len(unreachable.stderr.splitlines()) == 1 and "unreachable" in unreachable.stderr
    none = run(world, "--selector", "pool=nowhere", "--", "true")
    assert none.returncode == 69
    assert "considered 0" in none.stderr


def test_usage_errors_exit_2() -> None:
    assert run(None, "--selector", "novalue", "--", "true").returncode == 2
    assert run(None).returncode == 2


@needs_curl
def test_the_documented_shell_quick_start_reports_a_429(world: World, tmp_path: Path) -> None:
    # docs/client.md and README, verbatim but for the URL and the target.
    script = (
        f'code=$(curl -sS -o page.html -w "%{{http_code}}" {world.site_url}/limited) || exit $?\n'
        '  case $code in 2??) exit 0;; 429) exit 75;; 403) exit 77;; *) exit 1;; esac')
    done = run(world, "--selector", "pool=test", "--target", "cli-quickstart.test", "--",
               "sh", "-c", f'echo "$EGRESSD_PROXY"; {script}', cwd=tmp_path)
    assert done.returncode == 75, done.stderr
    assert cooldown(world, done.stdout.strip(), "cli-quickstart.test") == "rate_limited"
    assert (tmp_path / "page.html").read_text() == "slow down"


EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("example", ["requests_lease.py", "httpx_lease.py"])
def test_the_examples_run_as_documented(world: World, example: str) -> None:
    env = {**os.environ, "EGRESSD_URL": world.discovery_url, "EGRESSD_TOKEN": world.token}
    limited = subprocess.run([sys.executable, str(EXAMPLES / example),
                              f"{world.site_url}/limited"],
                             env=env, capture_output=True, text=True, timeout=60, check=False)
    assert limited.returncode == 75, limited.stderr
    assert "429 via default/" in limited.stdout and "rate_limited" in limited.stdout
    hit = world.site.hits_for("/limited")[-1]
    assert limited.stdout.split(" via ")[1].startswith(
        f"default/{world.proxy_by_egress(hit.peer).name}")
    assert world.active_leases() == 0
