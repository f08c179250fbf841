"""Under `CI=true`, a test skipped for want of Squid, tinyproxy, kubectl or curl fails.

On a laptop such a skip is a courtesy; in CI it would let the run pass while the
tests against real peers never ran. The hook turns the skip into a failure that
names the missing program and keeps the skip's reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator

import pytest

# The programs the real-peer tests need, named in their skip reasons.
_TOOL = re.compile(r"\b(squid|tinyproxy|kubectl|curl)\b", re.IGNORECASE)
_MISSING = re.compile(r"not installed|neither|needs|missing|not found|no such", re.IGNORECASE)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_tool(reason: str) -> str | None:
    """The program a skip reason says is missing, or None for any other skip."""
    tool = _TOOL.search(reason)
    return tool.group(1).lower() if tool and _MISSING.search(reason) else None


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        reason = _reason(report)
        tool = missing_tool(reason)
        if tool is not None:
            report.outcome = "failed"
            report.longrepr = (f"CI=true and {tool} is missing, so this test would only be "
                               f"skipped: {reason}")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector
                               ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    # A module-level `pytest.skip(..., allow_module_level=True)` skips at collection.
    report = yield
    if report.skipped and in_ci():
        reason = _reason(report)
        tool = missing_tool(reason)
        if tool is not None:
            report.outcome = "failed"
            report.longrepr = (f"CI=true and {tool} is missing, so these tests would only be "
                               f"skipped: {reason}")
    return report
