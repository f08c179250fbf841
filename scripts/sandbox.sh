#!/usr/bin/env bash
# The main job (README, first line): install everything (scripts/install.sh), then
# run `egressd sandbox` — the whole system on this machine. Arguments go to it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
echo "sandbox.sh: starting egressd sandbox (the guide follows once every sample is Ready)..." >&2
exec .venv/bin/egressd sandbox "$@"
