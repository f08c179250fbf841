"""The proxy the sandbox's External sample points at, kept running like a service.

It is a plain process, not a Pod: nothing in the cluster owns it. When it
dies (a crash, a `kill -9` by a curious user) that is an event, not the end
of the sandbox: the External Proxy goes Unhealthy, as any External proxy
whose process died would, and the process is started again on the same
address after a backoff (a proxy that keeps dying is retried ever more
slowly, up to `RESTART_MAX`; one that ran for `STABLE_AFTER` starts afresh).
"""

from __future__ import annotations

import logging

import trio

from egressd.backoff import Backoff, Retries
from egressd.sandbox.kubelet import AddressPool, open_pooled_proxy
from egressd.sandbox.localproxy import ProxySoftware, ProxyStartFailed, open_local_proxy

log = logging.getLogger(__name__)

RESTART_INITIAL = 1.0
"""Seconds before the first restart of a proxy that died."""
RESTART_MAX = 30.0
"""The longest wait between restarts of a proxy that keeps dying."""
STABLE_AFTER = 60.0
"""A proxy that ran this many seconds before it died is restarted after RESTART_INITIAL again."""


async def run_external_proxy(
    software: ProxySoftware,
    *,
    addresses: AddressPool,
    port: int,
    backoff: Backoff | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the External sample's proxy until cancelled; `started((host, port))` once it listens.

    The first start picks a free loopback address; every restart uses that
    same address, which the Proxy's `spec.endpoint` names. A restart that
    cannot start (another program took the port meanwhile) is retried.
    """
    retries = Retries(backoff or Backoff(RESTART_INITIAL, RESTART_MAX, jitter=(1.0, 1.5)))
    async with open_pooled_proxy(software, addresses=addresses, port=port) as proxy:
        host = proxy.host
        task_status.started((host, port))
        code: int | None = await proxy.wait()
    while True:
        delay = retries.next()
        log.warning("the External sample's proxy exited; restarting it",
                    extra={"kind": software.kind, "address": f"{host}:{port}", "code": code,
                           "delay": round(delay, 1)})
        await trio.sleep(delay)
        try:
            async with open_local_proxy(software, host=host, port=port) as proxy:
                began = trio.current_time()
                code = await proxy.wait()
                if trio.current_time() - began >= STABLE_AFTER:
                    retries.reset()
        except ProxyStartFailed as exc:
            log.warning("the External sample's proxy did not start",
                        extra={"address": f"{host}:{port}", "error": str(exc)})
            code = None
