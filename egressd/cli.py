"""The `egressd` command: `run`, `sandbox`, `check-config`, `version`.

Argument and configuration mistakes exit 2 with one line naming what was
wrong, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

import attrs

from egressd import __version__
from egressd.errors import ConfigError
from egressd.providers.config import ProvidersConfigError
from egressd.settings import Settings, add_flags, settings_from


def _listen_addr(text: str) -> str:
    """A `HOST:PORT` / `:PORT` flag of `sandbox`, checked as `egressd run` checks its own."""
    parse = attrs.fields(Settings).discovery_addr.metadata["parse"]
    try:
        return str(parse(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="egressd", description="Egress proxy fleet manager.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser(
        "run", help="Run the daemon.",
        epilog="Every flag, with its default, and the API, the resource and the metrics: "
               "docs/reference.md.")
    add_flags(run)

    sandbox = sub.add_parser(
        "sandbox", help="Run the whole system on this machine.",
        epilog="What it runs and prints: README.md; its flags: docs/reference.md.")
    sandbox.add_argument("--api-only", action="store_true",
                         help="Serve only the fake Kubernetes API server with the CRD.")
    sandbox.add_argument("--ready-file", metavar="PATH",
                         help="Write a JSON file with the endpoints once ready.")
    sandbox.add_argument("--proxies", type=int, default=3, metavar="N",
                         help="Managed sample proxies to create (default 3).")
    sandbox.add_argument("--discovery-addr", default="127.0.0.1:8090", metavar="ADDR",
                         type=_listen_addr,
                         help="Address of the sandbox daemon's discovery API (default "
                              "127.0.0.1:8090, this machine only; "
                              "port 0 picks a free one).")
    sandbox.add_argument("--metrics-addr", default="127.0.0.1:8080", metavar="ADDR",
                         type=_listen_addr,
                         help="Address of the sandbox daemon's /metrics (default "
                              "127.0.0.1:8080).")
    sandbox.add_argument("--gateway-addr", default="127.0.0.1:3129", metavar="ADDR",
                         type=_listen_addr,
                         help="Address of the sandbox daemon's gateway (default 127.0.0.1:3129).")
    sandbox.add_argument("--log-level", default="info",
                         choices=["debug", "info", "warning", "error"])

    check = sub.add_parser("check-config", help="Validate a providers config file.")
    check.add_argument("file", metavar="FILE")

    sub.add_parser("version", help="Print the version.")
    return parser


def _check_config(path: str) -> int:
    from egressd.providers.config import load_providers_config

    try:
        load_providers_config(path)
    except ProvidersConfigError as exc:
        for problem in exc.problems:
            print(f"{path}: {problem}", file=sys.stderr)
        return 2
    print("ok")
    return 0


# The top-level modules of the `sandbox` extra (pyproject.toml), by import name.
_SANDBOX_EXTRA = frozenset({"celpy", "jsonpatch", "jsonpath_ng", "trustme"})


def _sandbox_entry() -> Callable[..., int] | None:
    """`sandbox_main`, or None (after one line on stderr) when the extra is not installed."""
    try:
        from egressd.sandbox.command import sandbox_main
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in _SANDBOX_EXTRA:
            raise
        print(f"egressd: error: the sandbox needs its extra ({exc.name} is missing): "
              "pip install 'egressd[sandbox]'", file=sys.stderr)
        return None
    return sandbox_main


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "version":
            print(f"egressd {__version__}")
            return 0
        if args.command == "check-config":
            return _check_config(args.file)
        if args.command == "sandbox":
            sandbox_main = _sandbox_entry()
            if sandbox_main is None:
                return 2
            code: int = sandbox_main(
                api_only=args.api_only, ready_file=args.ready_file, proxies=args.proxies,
                log_level=args.log_level, discovery_addr=args.discovery_addr,
                metrics_addr=args.metrics_addr, gateway_addr=args.gateway_addr)
            return code
        if args.command == "run":
            import functools

            import trio

            from egressd import logs
            from egressd.app import load_inputs, run_until_signalled

            try:
                settings = settings_from(args, os.environ)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            inputs = load_inputs(settings, os.environ)
            logs.setup(settings.log_level, settings.log_format)
            trio.run(functools.partial(run_until_signalled, inputs, environ=os.environ))
            return 0  # stopped by SIGINT/SIGTERM
    except ProvidersConfigError as exc:
        for problem in exc.problems:
            print(f"egressd: error: {problem}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"egressd: error: {exc}", file=sys.stderr)
        return 2
    raise AssertionError(f"unhandled command {args.command}")
