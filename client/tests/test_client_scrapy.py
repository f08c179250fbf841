"""A real Scrapy crawl through the add-on, against the real egressd of `world`.

The test site rate-limits the first proxy that crawls it and bans the second, so
the crawl must move the domain to the third, retry the refused pages there, never
hand a 429/403 to the callback, and release every lease at the end.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from client_site import CRAWL_HOST, PAGES
from client_world import World
from egressd_client import Client, NoProxyAvailable

from tests.health.peers import closed_port

SPIDER = Path(__file__).with_name("crawl_spider.py")
ADDON = {"egressd_client.scrapy.Addon": 500}
POOL = {"pool": "test"}
_TIMERS: dict[int, threading.Timer] = {}


def start_crawl(tmp_path: Path, start: list[str], settings: dict[str, Any],
                user_proxy: tuple[str, str] | None = None) -> subprocess.Popen[str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"start": start, "settings": {"ADDONS": ADDON, **settings},
                                  "user_proxy": user_proxy, "out": str(tmp_path / "out.json")}))
    process = subprocess.Popen([sys.executable, str(SPIDER), str(config)], text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # A crawl that hangs is killed: the test then fails on its exit status.
    timer = _TIMERS[process.pid] = threading.Timer(90, process.kill)
    timer.daemon = True
    timer.start()
    return process


def finish_crawl(process: subprocess.Popen[str], tmp_path: Path) -> tuple[dict[str, Any], str]:
    try:
        _, log = process.communicate(timeout=90)
    finally:
        _TIMERS.pop(process.pid).cancel()
    assert process.returncode == 0, log[-3000:]
    return json.loads((tmp_path / "out.json").read_text()), log


def crawl(tmp_path: Path, start: list[str], settings: dict[str, Any],
          user_proxy: tuple[str, str] | None = None) -> tuple[dict[str, Any], str]:
    return finish_crawl(start_crawl(tmp_path, start, settings, user_proxy), tmp_path)


def egressd_settings(world: World, **extra: Any) -> dict[str, Any]:
    return {"EGRESSD_URL": world.discovery_url, "EGRESSD_TOKEN": world.token,
            "EGRESSD_SELECTOR": "pool=test", **extra}


def test_a_crawl_moves_off_rate_limited_and_banned_proxies(world: World, tmp_path: Path
                                                           ) -> None:
    user_proxy = world.proxies[2]
    started = dt.datetime.now(dt.UTC)
    result, log = crawl(tmp_path, [f"{world.crawl_url}/crawl/0"], egressd_settings(world),
                        user_proxy=(user_proxy.url, f"{world.site_url}/ok/user-proxy"))
    finished = dt.datetime.now(dt.UTC)
    assert result["reason"] == "finished", log[-3000:]
    assert result["failed"] == []
    crawled = [d for d in result["delivered"] if "/crawl/" in d["url"]]
    # Every page reached the callback once, always as a 200: no ban was delivered.
    assert sorted(d["url"] for d in crawled) == sorted(
        f"{world.crawl_url}/crawl/{n}" for n in range(PAGES))
    assert {d["status"] for d in result["delivered"]} == {200}
    # Each through a leased proxy, in that proxy's own download slot.
    assert all(d["proxy"] and d["slot"] == f"egressd:{d['proxy']}" for d in crawled)

    limited, banned = (world.proxy_by_egress(peer) for peer in world.site.crawl_peers[:2])
    hits = world.site.hits_for("/crawl/")
    assert {h.status for h in hits if h.peer == limited.egress} == {200, 429}
    assert {h.status for h in hits if h.peer == banned.egress} == {200, 403}
    # A page a proxy refused was fetched again, and delivered, through another proxy.
    assert any(d["retries"] for d in crawled)
    for page in range(PAGES):
        page_hits = [h for h in hits if h.path == f"/crawl/{page}"]
        [delivering] = [h.peer for h in page_hits if h.status == 200]
        assert delivering not in {h.peer for h in page_hits if h.status != 200}
    views = {v["name"]: v for v in world.proxy_views()}
    assert views[limited.name]["cooldowns"][CRAWL_HOST]["reason"] == "rate_limited"
    assert views[banned.name]["cooldowns"][CRAWL_HOST]["reason"] == "banned"
    # The site's Retry-After (30 s) is the rate-limit cooldown: reported during the crawl,
    # it ends 30 s after some moment between its start and its end (±1 s of rounding).
    until = dt.datetime.fromisoformat(
        views[limited.name]["cooldowns"][CRAWL_HOST]["until"].replace("Z", "+00:00"))
    assert (until - started).total_seconds() >= 29
    assert (until - finished).total_seconds() <= 31

    # The spider's own meta["proxy"] was respected.
    [own] = [d for d in result["delivered"] if d["url"].endswith("/ok/user-proxy")]
    assert own["proxy"] is None
    assert [h.peer for h in world.site.hits_for("/ok/user-proxy")] == [user_proxy.egress]

    stats = result["stats"]
    assert stats["egressd/bans/rate_limited"] == 1
    assert stats["egressd/bans/banned"] == 1
    assert stats["egressd/leases/acquired"] == 3
    # Released at spider close (after the spider's own closed(): the dumped stats show it).
    assert "'egressd/leases/released': 3" in log
    assert world.active_leases() == 0
    assert world.proxies[0].url.split("//")[1] not in log  # no proxy URL in the log


def test_a_wrong_token_stops_the_spider_with_one_error(world: World, tmp_path: Path) -> None:
    before = len(world.site.hits)
    result, log = crawl(tmp_path, [f"{world.site_url}/ok/never"],
                        {**egressd_settings(world), "EGRESSD_TOKEN": "wrong-token"})
    assert result["reason"] == "egressd_unavailable"
    errors = [line for line in log.splitlines() if "] ERROR:" in line]
    assert len(errors) == 1 and "refused the token" in errors[0], log[-3000:]
    assert "wrong-token" not in log
    assert len(world.site.hits) == before  # nothing was fetched without a proxy


def test_no_egressd_can_fall_back_to_no_proxy(world: World, tmp_path: Path) -> None:
    urls = [f"{world.site_url}/ok/direct-{n}" for n in range(3)]
    result, log = crawl(tmp_path, urls, {
        **egressd_settings(world), "EGRESSD_URL": f"http://127.0.0.1:{closed_port()}",
        "EGRESSD_ON_UNAVAILABLE": "direct", "EGRESSD_TIMEOUT": 2})
    assert result["reason"] == "finished"
    assert sorted(d["url"] for d in result["delivered"]) == urls
    assert {h.peer for h in world.site.hits_for("/ok/direct-")} == {"127.0.0.1"}
    errors = [line for line in log.splitlines() if "] ERROR:" in line]
    assert len(errors) == 1 and "crawling without a proxy" in errors[0], log[-3000:]


def test_no_free_proxy_reaches_the_errback_not_the_site(world: World, tmp_path: Path) -> None:
    result, log = crawl(tmp_path, [f"{world.site_url}/ok/no-proxy"], {
        **egressd_settings(world), "EGRESSD_SELECTOR": {"pool": "nowhere"},
        "EGRESSD_MAX_WAIT": 1})
    assert result["reason"] == "finished", log[-3000:]
    assert result["delivered"] == []
    assert result["failed"] == [{"url": f"{world.site_url}/ok/no-proxy",
                                 "error": "NoProxyForRequest"}]
    assert result["stats"]["egressd/no_proxy"] == 1
    assert world.site.hits_for("/ok/no-proxy") == []


def test_a_lease_near_its_end_is_renewed(world: World, tmp_path: Path) -> None:
    # TTL 15.5 s with a 15 s margin: after half a second, a request needs a fresh lease.
    urls = [f"{world.site_url}/ok/renew-{n}" for n in range(3)]
    result, log = crawl(tmp_path, urls, {**egressd_settings(world), "EGRESSD_TTL": 15.5,
                                         "DOWNLOAD_DELAY": 0.6, "RANDOMIZE_DOWNLOAD_DELAY": False,
                                         "CONCURRENT_REQUESTS": 1})
    assert result["reason"] == "finished", log[-3000:]
    assert len(result["delivered"]) == 3
    assert result["stats"]["egressd/leases/renewed"] >= 1
    assert result["stats"]["egressd/leases/acquired"] == 1 + result["stats"][
        "egressd/leases/renewed"]
    assert world.active_leases() == 0


def test_an_idle_domain_gives_its_lease_back(world: World, tmp_path: Path) -> None:
    urls = [f"{world.site_url}/ok/idle-{n}" for n in range(3)]
    result, log = crawl(tmp_path, urls, {**egressd_settings(world), "EGRESSD_IDLE_RELEASE": 0.2,
                                         "DOWNLOAD_DELAY": 0.8, "RANDOMIZE_DOWNLOAD_DELAY": False,
                                         "CONCURRENT_REQUESTS": 1})
    assert result["reason"] == "finished", log[-3000:]
    assert len(result["delivered"]) == 3
    stats = result["stats"]
    # Given back while the next request waited out DOWNLOAD_DELAY, then leased again.
    assert stats["egressd/leases/acquired"] >= 2
    assert stats["egressd/leases/acquired"] - 1 <= stats["egressd/leases/idle_released"]
    assert world.active_leases() == 0


def test_a_request_waits_until_a_proxy_is_free(world: World, tmp_path: Path) -> None:
    # Another client holds every proxy free for the crawl host, until the crawl says
    # it is waiting; then it lets go and the crawl goes on.
    with Client(world.discovery_url, token=world.token) as egressd:
        held = []
        with contextlib.suppress(NoProxyAvailable):
            while True:
                # Short leases: the 409's Retry-After (the soonest lease end, which the
                # crawl honours) must stay under EGRESSD_MAX_WAIT.
                held.append(egressd.acquire(selector=POOL, target=CRAWL_HOST, ttl=5))
        try:
            process = start_crawl(tmp_path, [f"{world.crawl_url}/ok/waited"], {
                **egressd_settings(world), "EGRESSD_MAX_WAIT": 60,
                "EGRESSD_NO_PROXY_PAUSE": 0.2})
            assert process.stderr is not None
            waiting = next((line for line in process.stderr
                            if "no proxy free for 127.0.0.77, retrying in" in line
                            or "Spider closed" in line), "")
        finally:
            for lease in held:
                egressd.release(lease)
    result, log = finish_crawl(process, tmp_path)
    assert "no proxy free" in waiting, log[-3000:]
    assert result["reason"] == "finished", log[-3000:]
    assert [d["url"] for d in result["delivered"]] == [f"{world.crawl_url}/ok/waited"]
    assert result["stats"]["egressd/no_proxy_waits"] >= 1
    assert world.active_leases() == 0


def test_a_page_banned_everywhere_reaches_the_errback_not_the_callback(
    world: World, tmp_path: Path,
) -> None:
    url = world.url_at("127.0.0.78") + "/banned"
    result, log = crawl(tmp_path, [url],
                        {**egressd_settings(world), "EGRESSD_MAX_BAN_RETRIES": 1})
    assert result["reason"] == "finished", log[-3000:]
    assert result["delivered"] == []
    assert result["failed"] == [{"url": url,
                                 "error": "BanRetriesExhausted"}]
    peers = [h.peer for h in world.site.hits_for("/banned") if h.status == 403]
    assert len(set(peers[-2:])) == 2  # tried on two different proxies
    assert result["stats"]["egressd/bans/banned"] == 2
    assert result["stats"]["egressd/retries_exhausted"] == 1
    assert world.active_leases() == 0


def test_a_timeout_is_counted_as_proxy_error_and_retried_elsewhere(
    world: World, tmp_path: Path,
) -> None:
    # scrapy-rotating-proxies#65: timeouts that were never counted.
    before = world.reports("proxy_error")
    url = world.url_at("127.0.0.79") + "/slow"
    result, log = crawl(tmp_path, [url], {
        **egressd_settings(world), "EGRESSD_MAX_BAN_RETRIES": 1, "DOWNLOAD_TIMEOUT": 1,
        "RETRY_ENABLED": False})
    assert result["reason"] == "finished", log[-3000:]
    assert result["failed"] == [{"url": url,
                                 "error": "BanRetriesExhausted"}]
    assert result["stats"]["egressd/bans/proxy_error"] == 2
    assert world.reports("proxy_error") == before + 2
    peers = [h.peer for h in world.site.hits_for("/slow")][-2:]
    assert len(set(peers)) == 2  # the retry went through another proxy
    assert world.active_leases() == 0


def test_a_ban_policy_of_ones_own(world: World, tmp_path: Path) -> None:
    url = world.url_at("127.0.0.80") + "/no-such-page"
    result, log = crawl(tmp_path, [url], {
        **egressd_settings(world), "EGRESSD_MAX_BAN_RETRIES": 1,
        "EGRESSD_BAN_POLICY": "__main__.NotFoundIsBan"})
    assert result["reason"] == "finished", log[-3000:]
    assert result["delivered"] == []  # the 404 is this site's ban page: never delivered
    assert result["failed"] == [{"url": url, "error": "BanRetriesExhausted"}]
    assert result["stats"]["egressd/bans/banned"] == 2
    banned = [v["name"] for v in world.proxy_views()
              if v["cooldowns"].get("127.0.0.80", {}).get("reason") == "banned"]
    assert len(banned) == 2
    assert world.active_leases() == 0
