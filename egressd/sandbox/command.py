"""`egressd sandbox`: with `--api-only`, serve the fake API server with the CRD until stopped.

The full sandbox (daemon, local kubelet, sample proxies; SPEC §11) is a
later piece; until it lands, running without `--api-only` says so and
exits 1.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import tempfile

import trio

from egressd import logs
from egressd.sandbox.apiserver import FakeApiServer
from egressd.sandbox.apiserver.tls import write_private


def _guide(kubeconfig: str, server: str) -> str:
    return (
        "egressd sandbox (API server only) is running.\n"
        f"  server:     {server}\n"
        f"  kubeconfig: {kubeconfig}\n"
        "Try:\n"
        f"  export KUBECONFIG={kubeconfig}\n"
        "  kubectl get px -A\n"
        "  kubectl apply -f my-proxy.yaml\n"
        "Stop with Ctrl-C.\n"
    )


async def serve_api_only(*, ready_file: str | None, workdir: str,
                         task_status: trio.TaskStatus[dict[str, str]] = trio.TASK_STATUS_IGNORED
                         ) -> None:
    """Serve the fake API server until cancelled; reports {"kubeconfig", "server"}."""
    server = FakeApiServer()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        kubeconfig = server.write_kubeconfig(os.path.join(workdir, "kubeconfig"))
        ready = {"kubeconfig": kubeconfig, "server": url}
        if ready_file:
            # Write then rename: a script polling for the file never reads half of it.
            partial = ready_file + ".tmp"
            write_private(partial, json.dumps(ready) + "\n")
            os.replace(partial, ready_file)
        print(_guide(kubeconfig, url), flush=True)
        task_status.started(ready)


async def _main(*, ready_file: str | None, workdir: str) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(serve_api_only, ready_file=ready_file,
                                                  workdir=workdir))
            async for _ in signals:
                print("stopping", file=sys.stderr, flush=True)
                nursery.cancel_scope.cancel()
                break


def sandbox_main(*, api_only: bool, ready_file: str | None, proxies: int, log_level: str) -> int:
    """Entry point of `egressd sandbox`; returns the exit code."""
    if not api_only:
        print("egressd sandbox: the full sandbox is not built yet; use --api-only",
              file=sys.stderr)
        return 1
    logs.setup(log_level)
    with tempfile.TemporaryDirectory(prefix="egressd-sandbox-") as workdir:
        try:
            trio.run(functools.partial(_main, ready_file=ready_file, workdir=workdir))
        finally:
            if ready_file and os.path.exists(ready_file):
                os.unlink(ready_file)
    return 0
