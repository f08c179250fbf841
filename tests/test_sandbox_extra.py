"""`egressd sandbox` without the `sandbox` extra: one line naming the extra, exit 2.

The missing package is real as far as the interpreter can tell: a meta-path
finder installed by a `sitecustomize` refuses to find it, as an interpreter
without the package would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_BLOCKER = '''
import sys

class _Absent:
    """Finds nothing for {names!r}: as if those packages were not installed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
        return None

sys.meta_path.insert(0, _Absent())
'''


_EXTRA = ("celpy", "jsonpatch", "jsonpath_ng", "trustme")


def _python_without(modules: tuple[str, ...], tmp_path: Path,
                    *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER.format(names=set(modules)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, *args], capture_output=True,
                          text=True, timeout=60, env=env, check=False)


@pytest.mark.parametrize("module", _EXTRA)
def test_sandbox_without_its_extra_names_the_extra_and_exits_2(module: str,
                                                                tmp_path: Path) -> None:
    out = _python_without((module,), tmp_path, "-m", "egressd", "sandbox", "--api-only")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "pip install 'egressd[sandbox]'" in lines[0]
    assert module in lines[0]


_IMPORT_ALL = """
import importlib, pkgutil, egressd
for info in pkgutil.walk_packages(egressd.__path__, "egressd."):
    if not info.name.startswith(("egressd.sandbox", "egressd.__main__")):
        importlib.import_module(info.name)
print("imported")
"""


def test_every_module_but_the_sandbox_imports_without_the_extra(tmp_path: Path) -> None:
    out = _python_without(_EXTRA, tmp_path, "-c", _IMPORT_ALL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "imported"
    check = _python_without(_EXTRA, tmp_path, "-c", "import celpy")
    assert check.returncode == 1 and "ModuleNotFoundError" in check.stderr  # the block holds
