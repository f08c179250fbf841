"""scripts/install.sh talks while it works, and skips pip when nothing changed.

Run on a copy of the project with stand-ins for the two programs it calls that
would take a minute here (dpkg says every package is installed; the venv's
python answers `-m pip install` the way pip does, slowly, and counts its calls).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent

FAKE_PIP = """\
#!/bin/sh
# Stands in for .venv/bin/python: `-m pip install ...` prints what pip prints.
echo "$@" >> "$(dirname "$0")/pip-calls"
echo "WARNING: Location 'file:///opt/pypi/simple/x/' is ignored"
echo "Collecting trio<0.36,>=0.30 (from egressd==0.1.0)"
echo "Requirement already satisfied: attrs in ./.venv/lib"
echo "Collecting httpx<0.29 (from egressd==0.1.0)"
echo "Successfully installed trio httpx"
touch "$(dirname "$0")/egressd" && chmod +x "$(dirname "$0")/egressd"
"""


def project_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "project"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install.sh", copy / "scripts")
    shutil.copy(ROOT / "pyproject.toml", copy)
    (copy / "client").mkdir()
    shutil.copy(ROOT / "client" / "pyproject.toml", copy / "client")
    (copy / "egressd").mkdir()
    (copy / "client" / "egressd_client").mkdir()
    venv_bin = copy / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(FAKE_PIP)
    (venv_bin / "python").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dpkg").write_text("#!/bin/sh\nexit 0\n")  # everything is installed
    (bin_dir / "dpkg").chmod(0o755)
    return copy


def install(copy: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "scripts/install.sh"], cwd=copy, capture_output=True,
                          text=True, timeout=60, check=False,
                          env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})


def test_install_says_what_it_does_and_skips_pip_when_nothing_changed(tmp_path: Path) -> None:
    copy = project_copy(tmp_path)
    calls = copy / ".venv" / "bin" / "pip-calls"
    first = install(copy, tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout == ""  # a caller's stdout (sandbox.sh's guide) stays its own
    lines = first.stderr.splitlines()
    assert lines[0].startswith("install.sh: installing egressd into .venv")
    assert "  Collecting trio<0.36,>=0.30 (from egressd==0.1.0)" in lines
    assert not [line for line in lines if "WARNING" in line or "already satisfied" in line]
    assert lines[-1].startswith("install.sh: done in ")
    assert len(calls.read_text().splitlines()) == 2  # egressd, then the client

    again = install(copy, tmp_path)
    assert again.returncode == 0
    assert again.stderr == "install.sh: .venv is up to date\n"
    assert len(calls.read_text().splitlines()) == 2

    with (copy / "pyproject.toml").open("a") as pyproject:
        pyproject.write("# a new dependency, say\n")
    changed = install(copy, tmp_path)
    assert "  Collecting trio<0.36,>=0.30 (from egressd==0.1.0)" in changed.stderr.splitlines()
    assert len(calls.read_text().splitlines()) == 4


def test_a_failing_pip_shows_the_end_of_its_log(tmp_path: Path) -> None:
    copy = project_copy(tmp_path)
    (copy / ".venv" / "bin" / "python").write_text(
        "#!/bin/sh\necho 'Collecting nothing'\necho 'ERROR: No matching distribution' >&2\n"
        "exit 1\n")
    out = install(copy, tmp_path)
    assert out.returncode == 1
    assert "install.sh: pip failed; the end of .venv/install.log:" in out.stderr
    assert "ERROR: No matching distribution" in out.stderr
