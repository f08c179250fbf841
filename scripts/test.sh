#!/usr/bin/env bash
# The test command (README, second line; .ci/run calls exactly this).
# Installs everything the tests need on a fresh Debian machine — squid and
# tinyproxy from Debian, the package with its test and dev extras in .venv —
# then runs ruff, mypy (strict on egressd/), import-linter and pytest.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

need=""
for pkg in squid tinyproxy; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
done
if [ -n "$need" ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
    else
        echo "test.sh: install$need (as root: apt-get install$need); their tests will be skipped" >&2
    fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,dev]'

echo "== ruff"; .venv/bin/ruff check egressd tests scripts
echo "== mypy"; .venv/bin/mypy
echo "== import-linter"; .venv/bin/lint-imports --no-cache
echo "== pytest"; .venv/bin/python -m pytest "$@"
