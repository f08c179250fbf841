#!/usr/bin/env bash
# Installs what egressd needs on a fresh Debian machine: squid and tinyproxy from
# Debian (the sandbox's local proxies and the tests' real peers), wrk and
# nginx-light (scripts/bench and its smoke test), and egressd with
# its test, dev and sandbox extras in .venv. Safe to run again; it only adds what is missing.
#
# It says what it is doing as it goes (on stderr, so a caller's stdout stays its own):
# the first run takes a minute, and a silent minute looks like a hang.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
say() { echo "install.sh: $*" >&2; }

need=""
for pkg in squid tinyproxy wrk nginx-light; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
done
if [ -n "$need" ]; then
    if [ "$(id -u)" = 0 ]; then
        say "installing$need from Debian (apt-get)..."
        apt-get update -qq
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
        # Debian starts a system Squid on *:3128 (and nginx on :80) after installing
        # it; egressd's sandbox, tests and bench run their own.
        for svc in squid nginx; do
            if [[ " $need " == *" $svc"* ]]; then
                { systemctl disable --now "$svc" || service "$svc" stop; } >/dev/null 2>&1 || true
            fi
        done
    else
        say "please install$need (as root: apt-get install$need)"
    fi
fi

if [ ! -x .venv/bin/python ]; then
    say "creating .venv..."
    python3 -m venv .venv
fi

# pip re-resolves every requirement even when nothing changed (~10 s here): skip it
# while the project files it reads are the ones the last install used.
stamp=.venv/.egressd-install
# (A new top-level package also needs an install: the editable finder maps them.)
wanted="$({ cat pyproject.toml client/pyproject.toml
            ls -d egressd*/ client/*/ 2>/dev/null | grep -v '\.egg-info/$' || true; } | sha256sum)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -x .venv/bin/egressd ]; then
    say ".venv is up to date"
    exit 0
fi

log=.venv/install.log
# pip's own progress, one line per package it fetches or builds; the rest (and this
# machine's index warnings) goes to the log, shown in full if pip fails.
pip_install() {
    say "pip install $* ..."
    if ! .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off "$@" \
            2>&1 | tee -a "$log" \
            | sed -un -E 's/^(Collecting|Building wheel for) /  \1 /p' >&2
    then
        say "pip failed; the end of $log:"
        tail -n 30 "$log" >&2
        exit 1
    fi
}
: > "$log"
say "installing egressd into .venv (the first time takes about a minute)..."
pip_install -e '.[test,dev,sandbox]'
# The crawler client is its own distribution (client/, httpx only); Scrapy support is its extra.
pip_install -e './client[scrapy]'
echo "$wanted" > "$stamp"
say "done in $((SECONDS - started)) s"
