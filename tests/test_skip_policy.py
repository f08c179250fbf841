"""The CI skip policy (tests/skip_policy.py), run on small test files by pytester."""

from __future__ import annotations

import pytest

from tests.skip_policy import missing_tool

SKIPS = '''
import shutil
import pytest

def test_squid_in_the_body():
    pytest.skip("squid is not installed (apt-get install squid)")

@pytest.mark.skipif(True, reason="kubectl is not installed (1.32 expected at /usr/bin/kubectl)")
def test_kubectl_by_mark():
    pass

def test_other_reason():
    pytest.skip("needs a GPU")

def test_runs():
    pass
'''

MODULE_SKIP = '''
import pytest
pytest.skip("curl is not installed (apt-get install curl)", allow_module_level=True)

def test_never():
    pass
'''


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    def go(ci: str | None, source: str) -> pytest.RunResult:
        if ci is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", ci)
        pytester.makepyfile(test_sample=source)
        return pytester.runpytest("-p", "tests.skip_policy", "-p", "no:cacheprovider")
    return go


def test_outside_ci_a_missing_tool_is_a_skip(run) -> None:
    run(None, SKIPS).assert_outcomes(passed=1, skipped=3)
    run("false", SKIPS).assert_outcomes(passed=1, skipped=3)


def test_in_ci_a_missing_tool_fails_the_run(run) -> None:
    result = run("true", SKIPS)
    # The body's skip is a failure, the mark's (in setup) an error; other skips stay skips.
    result.assert_outcomes(passed=1, skipped=1, failed=1, errors=1)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*CI=true and squid is missing*apt-get install squid*",
                                 "*CI=true and kubectl is missing*"])


def test_in_ci_a_module_skipped_for_a_missing_tool_fails(run) -> None:
    result = run("true", MODULE_SKIP)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*CI=true and curl is missing*"])
    run(None, MODULE_SKIP).assert_outcomes(skipped=1)


@pytest.mark.parametrize(("reason", "tool"), [
    ("squid is not installed (apt-get install squid)", "squid"),
    ("needs squid (apt install squid)", "squid"),
    ("tinyproxy is not installed (apt-get install tinyproxy)", "tinyproxy"),
    ("the sandbox runs real proxies but neither squid nor tinyproxy is installed: install one "
     "(apt-get install squid, or apt-get install tinyproxy)", "squid"),
    ("curl is not installed (apt-get install curl)", "curl"),
    ("needs a GPU", None),
    ("squid's access log format is not parsed here", None),
])
def test_which_skips_count_as_a_missing_tool(reason: str, tool: str | None) -> None:
    assert missing_tool(reason) == tool
