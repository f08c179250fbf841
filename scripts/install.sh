#!/usr/bin/env bash
# Installs what egressd needs on a fresh Debian machine: squid and tinyproxy from
# Debian (the sandbox's local proxies and the tests' real peers), wrk and
# nginx-light (scripts/bench and its smoke test), and egressd with
# its test, dev and sandbox extras in .venv. Safe to run again; it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=""
for pkg in squid tinyproxy wrk nginx-light; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
done
if [ -n "$need" ]; then
    if [ "$(id -u)" = 0 ]; then
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
        echo "install.sh: please install$need (as root: apt-get install$need)" >&2
    fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,dev,sandbox]'
# The crawler client is its own distribution (client/, httpx only); Scrapy support is its extra.
.venv/bin/python -m pip install -q --disable-pip-version-check -e './client[scrapy]'
