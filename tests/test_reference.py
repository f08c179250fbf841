"""docs/reference.md keeps up with the code, and user-facing text cites only our docs.

The flag and metric lists are derived from the code (the `Settings` fields,
the `sandbox` subcommand's arguments, the metrics registry), so a flag or a
metric added without a line in the reference fails here. Text in egressd/
(help, errors, docstrings, comments) never cites "SPEC": users do not have it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import attrs

from egressd.cli import _parser
from egressd.metrics import REGISTRY
from egressd.settings import Settings, env_name, flag_name

ROOT = Path(__file__).parent.parent
REFERENCE = (ROOT / "docs" / "reference.md").read_text()


def _level(line: str) -> int:
    """The level of a Markdown heading line, 0 for any other line."""
    level = len(line) - len(line.lstrip("#"))
    return level if level and line[level:level + 1] == " " else 0


def section(title: str) -> str:
    """The text under the heading `title`, up to the next heading of its level or above."""
    lines = REFERENCE.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if _level(line) and line.lstrip("#").strip() == title), None)
    assert start is not None, f"docs/reference.md has no section {title!r}"
    level = _level(lines[start])
    body = []
    for line in lines[start + 1:]:
        if 0 < _level(line) <= level:
            break
        body.append(line)
    return "\n".join(body)


def table_rows(text: str) -> dict[str, list[str]]:
    """First cell (without backticks) → the row's cells, for every table row of `text`."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_every_run_flag_is_in_the_reference_with_its_variable() -> None:
    rows = table_rows(section("egressd run"))
    for field in attrs.fields(Settings):
        flag = flag_name(field.name)
        assert flag in rows, f"{flag} is missing from docs/reference.md (egressd run)"
        assert rows[flag][1] == f"`{env_name(field.name)}`", rows[flag]
    assert set(rows) == {flag_name(f.name) for f in attrs.fields(Settings)}, "a stale flag"


def test_every_sandbox_flag_is_in_the_reference() -> None:
    subcommands = next(a for a in _parser()._actions
                       if isinstance(a, argparse._SubParsersAction))
    sandbox = subcommands.choices["sandbox"]
    flags = {option for action in sandbox._actions for option in action.option_strings
             if option.startswith("--") and option != "--help"}
    assert set(table_rows(section("egressd sandbox"))) == flags


def exported_names() -> set[str]:
    names = set()
    for family in REGISTRY.collect():
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def test_every_metric_is_in_the_reference() -> None:
    rows = table_rows(section("Metrics"))
    missing = exported_names() - set(rows)
    assert not missing, f"metrics missing from docs/reference.md: {sorted(missing)}"
    assert set(rows) <= exported_names(), "a metric the code no longer exports"


def test_no_text_in_egressd_cites_the_spec() -> None:
    """Help texts, error messages and comments point to docs/, never to "SPEC §N"."""
    cited = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted((ROOT / "egressd").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bSPEC\b", line)]
    assert cited == []


def test_help_texts_point_to_the_reference() -> None:
    """`egressd run --help` and `egressd sandbox --help` say where the full story is."""
    subcommands = next(a for a in _parser()._actions
                       if isinstance(a, argparse._SubParsersAction))
    for name in ("run", "sandbox"):
        assert "docs/reference.md" in subcommands.choices[name].format_help(), name
