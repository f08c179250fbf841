#!/usr/bin/env bash
# The test command (README, second line; .ci/run calls exactly this).
# Installs everything (scripts/install.sh), then runs ruff, mypy (strict on
# egressd/ and client/egressd_client/), import-linter and pytest (tests/ and
# client/tests/). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh

echo "== ruff"; .venv/bin/ruff check egressd tests scripts client
echo "== mypy"; .venv/bin/mypy
echo "== import-linter"; .venv/bin/lint-imports --no-cache
echo "== pytest"; .venv/bin/python -m pytest "$@"
