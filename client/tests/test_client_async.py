"""The async client under trio and asyncio, against the real egressd of `world`."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import trio
from client_world import World
from egressd_client import AsyncClient, NoProxyAvailable, Result

POOL = {"pool": "test"}


async def active(world: World) -> int:
    return await trio.to_thread.run_sync(world.active_leases)


async def test_trio_lease_goes_through_its_proxy_and_is_released(world: World) -> None:
    with trio.fail_after(20):
        async with (AsyncClient(world.discovery_url, token=world.token) as egressd,
                    egressd.lease(selector=POOL, target="trio.test") as lease):
            assert await active(world) == 1
            async with httpx.AsyncClient(proxy=lease.proxy_url, timeout=10) as http:
                response = await http.get(f"{world.site_url}/ok/trio")
            assert (await lease.report_response(response)).result is Result.OK
        assert await active(world) == 0
    [hit] = world.site.hits_for("/ok/trio")
    assert world.proxy_by_egress(hit.peer).name == lease.proxy.name


async def test_trio_a_cancelled_task_still_releases_its_lease(world: World) -> None:
    with trio.fail_after(20):
        async with AsyncClient(world.discovery_url, token=world.token) as egressd:
            # Cancelled once the lease is held (an event, not a timer: a timer could
            # cancel the acquire itself and leave nothing to release).
            with trio.CancelScope() as scope:
                async with egressd.lease(selector=POOL, target="cancel.test"):
                    assert await active(world) == 1
                    scope.cancel()
                    await trio.sleep_forever()
            assert scope.cancelled_caught
        assert await active(world) == 0


async def test_trio_a_timeout_through_the_proxy_reports_proxy_error(world: World) -> None:
    before = await trio.to_thread.run_sync(world.reports, "proxy_error")
    with trio.fail_after(20):
        async with AsyncClient(world.discovery_url, token=world.token) as egressd:
            with pytest.raises(httpx.ReadTimeout):
                async with (egressd.lease(selector=POOL, target="trio-slow.test") as lease,
                            httpx.AsyncClient(proxy=lease.proxy_url, timeout=0.5) as http):
                    await http.get(f"{world.site_url}/slow")
    assert await trio.to_thread.run_sync(world.reports, "proxy_error") == before + 1
    assert await active(world) == 0


def test_asyncio_lease_report_and_the_409(world: World) -> None:
    async def main() -> tuple[str, Result, int]:
        async with AsyncClient(world.discovery_url, token=world.token) as egressd:
            async with egressd.lease(selector=POOL, target="asyncio.test") as lease:
                async with httpx.AsyncClient(proxy=lease.proxy_url, timeout=10) as http:
                    response = await http.get(f"{world.site_url}/banned")
                verdict = await lease.report_response(response)
            try:
                await egressd.acquire(selector={"pool": "nowhere"})
            except NoProxyAvailable as exc:
                considered = exc.considered
            return lease.proxy.name, verdict.result, considered

    name, result, considered = asyncio.run(asyncio.wait_for(main(), 20))
    assert (result, considered) == (Result.BANNED, 0)
    view = next(v for v in world.proxy_views() if v["name"] == name)
    assert view["cooldowns"]["asyncio.test"]["reason"] == "banned"
    assert world.active_leases() == 0


def test_asyncio_a_cancelled_task_still_releases_its_lease(world: World) -> None:
    entered = asyncio.Event

    async def main() -> None:
        inside = entered()

        async def hold(egressd: AsyncClient) -> None:
            async with egressd.lease(selector=POOL, target="asyncio-cancel.test"):
                inside.set()
                await asyncio.sleep(3600)

        async with AsyncClient(world.discovery_url, token=world.token) as egressd:
            task = asyncio.ensure_future(hold(egressd))
            await inside.wait()
            assert await asyncio.to_thread(world.active_leases) == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(asyncio.wait_for(main(), 20))
    assert world.active_leases() == 0
