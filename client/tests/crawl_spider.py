"""A Scrapy crawl for test_client_scrapy.py, run in its own process:

    python crawl_spider.py CONFIG.json

CONFIG holds `start` (URLs), `user_proxy` (a URL fetched with the spider's own
meta["proxy"], optional), `settings` and `out` (where the result goes as JSON:
what reached the callback, what failed, the stats and the close reason).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response
from twisted.python.failure import Failure


class NotFoundIsBan:
    """A ban policy of a site's own (EGRESSD_BAN_POLICY = "__main__.NotFoundIsBan"): its
    ban page is a 404."""

    def response_is_ban(self, request: scrapy.Request, response: Response) -> bool:
        return response.status == 404

    def exception_is_ban(self, request: scrapy.Request, exception: BaseException) -> bool:
        return False


class Crawl(scrapy.Spider):
    name = "egressd-test"
    # Every status reaches the callback unless a middleware keeps it away: a ban
    # delivered here would show.
    handle_httpstatus_all = True

    def __init__(self, config: dict[str, Any], **kw: Any) -> None:
        super().__init__(**kw)
        self.config = config
        self.delivered: list[dict[str, Any]] = []
        self.failed: list[dict[str, str]] = []

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for url in self.config["start"]:
            yield scrapy.Request(url, errback=self.failure)
        if self.config.get("user_proxy"):
            proxy, url = self.config["user_proxy"]
            yield scrapy.Request(url, meta={"proxy": proxy}, errback=self.failure)

    def parse(self, response: Response) -> Iterator[scrapy.Request]:
        self.delivered.append({
            "url": response.url, "status": response.status,
            "proxy": response.meta.get("egressd_proxy"),
            "slot": response.meta.get("download_slot"),
            "retries": response.meta.get("egressd_ban_retries", 0)})
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, errback=self.failure)

    def failure(self, failure: Failure) -> None:
        self.failed.append({"url": failure.request.url,  # type: ignore[attr-defined]
                            "error": type(failure.value).__name__})

    def closed(self, reason: str) -> None:
        assert self.crawler.stats is not None
        stats = {k: v for k, v in self.crawler.stats.get_stats().items()
                 if isinstance(v, int | float | str)}
        with open(self.config["out"], "w") as f:
            json.dump({"delivered": self.delivered, "failed": self.failed,
                       "stats": stats, "reason": reason}, f)


def main() -> None:
    with open(sys.argv[1]) as f:
        config = json.load(f)
    process = CrawlerProcess(settings={
        "ROBOTSTXT_OBEY": False, "TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "INFO",
        "DOWNLOAD_TIMEOUT": 5, "CONCURRENT_REQUESTS": 8, **config["settings"]})
    process.crawl(Crawl, config=config)
    process.start()


if __name__ == "__main__":
    main()
