"""`egressd-lease`: lease a proxy, run a command through it, report, release.

    egressd-lease --selector region=eu --target example.org -- curl -sS https://example.org/

The command runs with HTTPS_PROXY, HTTP_PROXY (and their lower-case forms) set to
the lease's proxy URL, and EGRESSD_LEASE_ID / EGRESSD_PROXY for scripts that want
to report on their own. Its exit status is reported by this convention:

    0                    ok
    75 (EX_TEMPFAIL)     rate_limited
    77 (EX_NOPERM)       banned
    5, 7, 28, 97         proxy_error (curl: proxy not resolved, not connected,
                         timed out, proxy handshake failed)
    anything else        no report (the command failed on its own)

`--report STATUS=RESULT` adds to or overrides the table. The lease is released
whatever happens, and egressd-lease exits with the command's status (128+N if
a signal N ended it). Its own failures, before the command runs: 2 for usage or
a refused token, 69 (EX_UNAVAILABLE) when egressd is unreachable or has no
proxy, 126/127 when the command cannot be run.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import FrameType

from egressd_client._errors import EgressdError, NoProxyAvailable, Unauthorized
from egressd_client._sync import Client
from egressd_client._wire import Result

EX_USAGE_OR_CONFIG = 2
EX_UNAVAILABLE = 69
DEFAULT_REPORTS: Mapping[int, Result] = {
    0: Result.OK,
    75: Result.RATE_LIMITED,
    77: Result.BANNED,
    5: Result.PROXY_ERROR,
    7: Result.PROXY_ERROR,
    28: Result.PROXY_ERROR,
    97: Result.PROXY_ERROR,
}
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")


def _selector(values: Sequence[str]) -> dict[str, str]:
    selector: dict[str, str] = {}
    for value in values:
        for term in value.split(","):
            key, sep, val = term.partition("=")
            if not sep or not key.strip():
                raise argparse.ArgumentTypeError(f"--selector {term!r} is not key=value")
            selector[key.strip()] = val.strip()
    return selector


def _reports(values: Sequence[str]) -> dict[int, Result]:
    table = dict(DEFAULT_REPORTS)
    for value in values:
        status, sep, result = value.partition("=")
        try:
            table[int(status)] = Result(result)
        except ValueError:
            choices = ", ".join(r.value for r in Result)
            raise argparse.ArgumentTypeError(
                f"--report {value!r}: want STATUS=RESULT, RESULT one of {choices}") from None
        if not sep:
            raise argparse.ArgumentTypeError(f"--report {value!r}: want STATUS=RESULT")
    return table


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="egressd-lease",
        description="Lease a proxy from egressd, run COMMAND through it (HTTPS_PROXY, "
                    "HTTP_PROXY), report its exit status, release.",
        epilog="Exit statuses reported: 0 ok, 75 rate_limited, 77 banned, 5/7/28/97 "
               "proxy_error, others nothing. egressd's address and token come from "
               "EGRESSD_URL and EGRESSD_TOKEN.")
    p.add_argument("--url", help="discovery API (default $EGRESSD_URL or http://localhost:8090)")
    p.add_argument("--token-file", help="file holding the discovery token "
                                        "(default $EGRESSD_TOKEN)")
    p.add_argument("--selector", action="append", default=[], metavar="K=V",
                   help="proxy attributes to match (repeat, or k=v,k2=v2)")
    p.add_argument("--target", help="the site the command talks to (cooldowns are per site)")
    p.add_argument("--ttl", type=float, help="lease TTL in seconds (server default 300)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for a free proxy (honours the 409's Retry-After)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="timeout of each call to egressd")
    p.add_argument("--report", action="append", default=[], metavar="STATUS=RESULT",
                   help="report RESULT when the command exits with STATUS")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    return p


def _run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    try:
        child = subprocess.Popen(list(argv), env=dict(env))
    except FileNotFoundError:
        print(f"egressd-lease: {argv[0]}: command not found", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"egressd-lease: {argv[0]}: permission denied", file=sys.stderr)
        return 126

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    # Ctrl-C reaches the child from the terminal already; SIGTERM/SIGHUP sent to us
    # (cron, systemd, kill) are passed on. Either way we wait, then release.
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        previous[signum] = signal.signal(signum, forward)
    try:
        status = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - status if status < 0 else status


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser().error("give the command after --")
    try:
        selector, reports = _selector(args.selector), _reports(args.report)
    except argparse.ArgumentTypeError as exc:
        parser().error(str(exc))
    token = None
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            print(f"egressd-lease: --token-file {args.token_file}: {exc.strerror}",
                  file=sys.stderr)
            return EX_USAGE_OR_CONFIG
    with Client(args.url, token=token, timeout=args.timeout) as egressd:
        try:
            lease = egressd.acquire(selector=selector, target=args.target, ttl=args.ttl,
                                    wait=args.wait)
        except Unauthorized as exc:
            print(f"egressd-lease: {exc}", file=sys.stderr)
            return EX_USAGE_OR_CONFIG
        except (NoProxyAvailable, EgressdError) as exc:
            print(f"egressd-lease: {exc}", file=sys.stderr)
            return EX_UNAVAILABLE
        env = dict(os.environ)
        env.update(dict.fromkeys(PROXY_VARIABLES, lease.proxy_url))
        env.update(EGRESSD_LEASE_ID=lease.id, EGRESSD_PROXY=lease.proxy.key,
                   EGRESSD_URL=egressd.config.url)
        try:
            status = _run(command, env)
            result = reports.get(status)
            if result is not None:
                try:
                    egressd.report(lease, result)
                except EgressdError as exc:
                    print(f"egressd-lease: could not report {result.value}: {exc}",
                          file=sys.stderr)
        finally:
            try:
                egressd.release(lease)
            except EgressdError as exc:
                print(f"egressd-lease: could not release the lease (its TTL will): {exc}",
                      file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
