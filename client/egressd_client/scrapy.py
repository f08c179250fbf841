"""Scrapy support: `ADDONS = {"egressd_client.scrapy.Addon": 500}` (the `scrapy` extra).

The add-on enables `EgressdMiddleware`, a downloader middleware that holds one
egressd lease per target domain and sends that domain's requests through it
(`request.meta["proxy"]`, and a download slot per proxy so Scrapy's per-slot
concurrency and delay apply per proxy). A response or an exception the ban policy
calls a ban is reported to egressd (429 as `rate_limited` with its Retry-After,
others as `banned`, exceptions as `proxy_error`), the domain moves to another
lease, and the request is retried there; a ban never reaches the callback. Every
lease is released when the spider closes. Settings, all `EGRESSD_*`:

    EGRESSD_URL, EGRESSD_TOKEN   discovery API and token (default: the environment's)
    EGRESSD_CA_FILE              CA bundle for an egressd on HTTPS with a private CA
    EGRESSD_SELECTOR             {"region": "eu"} or "region=eu,tier=dc"
    EGRESSD_TTL                  lease TTL, seconds (300); a lease is renewed before it ends
    EGRESSD_BAN_POLICY           import path of the ban policy (BanPolicy)
    EGRESSD_BAN_STATUSES         statuses BanPolicy calls a ban besides 429 ([403])
    EGRESSD_BAN_MARKERS          body texts BanPolicy calls a ban ([])
    EGRESSD_MAX_BAN_RETRIES      retries of one request on other proxies (5)
    EGRESSD_MAX_WAIT             seconds a request waits for a free proxy (60)
    EGRESSD_NO_PROXY_PAUSE       seconds between tries when the 409 has no Retry-After (5)
    EGRESSD_ON_UNAVAILABLE       "stop" the spider (default) or go "direct" (no proxy)
                                 when egressd is unreachable or refuses the token
    EGRESSD_TIMEOUT              timeout of each call to egressd, seconds (10)
    EGRESSD_IDLE_RELEASE         release a domain's lease after this many idle seconds
                                 (60; 0 keeps every lease until the spider closes)

A request whose `meta["proxy"]` the spider set itself, or with
`meta["egressd"] = False`, is left alone. Stats are under `egressd/`. It needs
Scrapy's asyncio reactor (the default since Scrapy 2.13).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from typing import Any, Protocol, cast

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import CloseSpider, IgnoreRequest
from scrapy.http import Response
from scrapy.settings import BaseSettings
from scrapy.utils.asyncio import is_asyncio_available
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler, load_object

from egressd_client._async import AsyncClient
from egressd_client._classify import Classifier
from egressd_client._errors import EgressdError, NoProxyAvailable
from egressd_client._wire import Lease, Result, parse_retry_after

log = logging.getLogger(__name__)

MIDDLEWARE = "egressd_client.scrapy.EgressdMiddleware"
MIDDLEWARE_ORDER = 740
"""Before HttpProxyMiddleware (750), which turns proxy credentials into a header, and
after RetryMiddleware (550) on the way back, so bans are ours and not retried as-is."""
RENEW_MARGIN = 15.0
"""A lease with less than this many seconds left is replaced before the next request."""
META = "_egressd"
RELEASE_CONCURRENCY = 16
"""Releases in flight at once when the spider closes."""


class BanRetriesExhausted(IgnoreRequest):
    """A request was banned on EGRESSD_MAX_BAN_RETRIES + 1 proxies; its errback gets this."""


class NoProxyForRequest(IgnoreRequest):
    """No proxy became free for the request's domain within EGRESSD_MAX_WAIT."""


class BanPolicyProtocol(Protocol):
    def response_is_ban(self, request: Request, response: Response) -> bool: ...
    def exception_is_ban(self, request: Request, exception: BaseException) -> bool: ...


class BanPolicy:
    """The default ban policy: 429 and EGRESSD_BAN_STATUSES ([403]) or a body with one of
    EGRESSD_BAN_MARKERS are bans; so is every download exception (a dead or hung proxy:
    scrapy-rotating-proxies#65 is timeouts that were never counted)."""

    def __init__(self, classifier: Classifier | None = None) -> None:
        self.classifier = classifier or Classifier()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BanPolicy:
        settings = crawler.settings
        return cls(Classifier(ban_statuses=settings.getlist("EGRESSD_BAN_STATUSES", [403]),
                              ban_markers=settings.getlist("EGRESSD_BAN_MARKERS", [])))

    def response_is_ban(self, request: Request, response: Response) -> bool:
        return self.classifier(response).is_ban

    def exception_is_ban(self, request: Request, exception: BaseException) -> bool:
        return not isinstance(exception, IgnoreRequest)


class Addon:
    """`ADDONS = {"egressd_client.scrapy.Addon": 500}`: enables EgressdMiddleware."""

    def update_settings(self, settings: BaseSettings) -> None:
        settings["DOWNLOADER_MIDDLEWARES"][MIDDLEWARE] = MIDDLEWARE_ORDER


def _selector(value: Any) -> dict[str, str]:
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    selector: dict[str, str] = {}
    for term in str(value or "").split(","):
        if term.strip():
            key, sep, val = term.partition("=")
            if not sep:
                raise ValueError(f"EGRESSD_SELECTOR term {term!r} is not key=value")
            selector[key.strip()] = val.strip()
    return selector


class _Domain:
    """The lease one domain's requests go through."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.lease: Lease | None = None
        self.last_used = 0.0  # loop time of the last request or response
        self.retired: list[Lease] = []  # banned leases, released once replaced


class EgressdMiddleware:
    """Sends each domain's requests through an egressd lease; see the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        if not is_asyncio_available():
            raise RuntimeError(
                "egressd_client.scrapy needs Scrapy's asyncio reactor: set TWISTED_REACTOR = "
                '"twisted.internet.asyncioreactor.AsyncioSelectorReactor" (the default)')
        settings = crawler.settings
        self.crawler = crawler
        self.selector = _selector(settings.get("EGRESSD_SELECTOR"))
        self.ttl = settings.getfloat("EGRESSD_TTL", 300.0)
        self.max_retries = settings.getint("EGRESSD_MAX_BAN_RETRIES", 5)
        self.max_wait = settings.getfloat("EGRESSD_MAX_WAIT", 60.0)
        self.no_proxy_pause = settings.getfloat("EGRESSD_NO_PROXY_PAUSE", 5.0)
        self.on_unavailable = str(settings.get("EGRESSD_ON_UNAVAILABLE", "stop")).lower()
        if self.on_unavailable not in ("stop", "direct"):
            raise ValueError(f"EGRESSD_ON_UNAVAILABLE must be 'stop' or 'direct', "
                             f"got {self.on_unavailable!r}")
        ca_file = settings.get("EGRESSD_CA_FILE")
        self.client = AsyncClient(
            settings.get("EGRESSD_URL") or None, token=settings.get("EGRESSD_TOKEN") or None,
            timeout=settings.getfloat("EGRESSD_TIMEOUT", 10.0),
            verify=ssl.create_default_context(cafile=ca_file) if ca_file else True)
        policy_cls = load_object(settings.get("EGRESSD_BAN_POLICY",
                                              "egressd_client.scrapy.BanPolicy"))
        self.policy = cast(BanPolicyProtocol, build_from_crawler(policy_cls, crawler))
        self.rate_limit_statuses = frozenset({429})
        self.domains: dict[str, _Domain] = {}
        self.reported: set[str] = set()  # lease ids already reported as banned
        self.direct = False  # egressd is unavailable and EGRESSD_ON_UNAVAILABLE = direct
        self.stopping = False
        self._closing: asyncio.Future[None] | None = None
        self._sweeper: asyncio.Future[None] | None = None
        self.idle_release = settings.getfloat("EGRESSD_IDLE_RELEASE", 60.0)
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> EgressdMiddleware:
        return cls(crawler)

    # --- stats and the spider's own policy -------------------------------------------

    def _inc(self, key: str, count: int = 1) -> None:
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value(f"egressd/{key}", count)

    def _response_is_ban(self, request: Request, response: Response) -> bool:
        own = getattr(self.crawler.spider, "response_is_ban", None)
        return bool(own(request, response) if own else
                    self.policy.response_is_ban(request, response))

    def _exception_is_ban(self, request: Request, exception: BaseException) -> bool:
        own = getattr(self.crawler.spider, "exception_is_ban", None)
        return bool(own(request, exception) if own else
                    self.policy.exception_is_ban(request, exception))

    # --- signals ----------------------------------------------------------------------

    async def spider_opened(self, spider: Spider) -> None:
        """Check egressd and the token once, so a mistake is one line at start."""
        try:
            await self.client.proxies(selector=self.selector)
        except EgressdError as exc:
            if not self._unavailable(exc):
                raise CloseSpider("egressd_unavailable") from None
        if self.idle_release > 0:
            self._sweeper = asyncio.ensure_future(self._sweep())

    async def spider_closed(self, spider: Spider) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        leases = [lease for d in self.domains.values()
                  for lease in ([d.lease] if d.lease else []) + d.retired]
        self.domains.clear()
        limit = asyncio.Semaphore(RELEASE_CONCURRENCY)

        async def release(lease: Lease) -> None:
            async with limit:
                await self._release(lease)

        await asyncio.gather(*(release(lease) for lease in leases))
        await self.client.aclose()

    async def _sweep(self) -> None:
        """Give back the leases of domains idle for EGRESSD_IDLE_RELEASE seconds: a broad
        crawl must not hold one lease per domain it has finished with."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.1, min(10.0, self.idle_release / 2)))
            now = loop.time()
            idle = [(name, d) for name, d in self.domains.items()
                    if now - d.last_used > self.idle_release and not d.lock.locked()]
            for name, domain in idle:
                del self.domains[name]
                for lease in domain.retired:
                    await self._release(lease)
                if domain.lease is not None:
                    self._inc("leases/idle_released")
                    await self._release(domain.lease)

    def _unavailable(self, exc: EgressdError) -> bool:
        """Log once what egressd's failure means; True: go on without a proxy."""
        if self.direct or self.stopping:
            return self.direct
        if self.on_unavailable == "direct":
            self.direct = True
            self._inc("unavailable")
            log.error("egressd unavailable, crawling without a proxy "
                      "(EGRESSD_ON_UNAVAILABLE=direct): %s", exc)
            return True
        self.stopping = True
        self._inc("unavailable")
        log.error("egressd unavailable, stopping the spider "
                  "(EGRESSD_ON_UNAVAILABLE=stop): %s", exc)
        return False

    # --- leases -----------------------------------------------------------------------

    async def _release(self, lease: Lease) -> None:
        try:
            await self.client.release(lease)
            self._inc("leases/released")
        except EgressdError as exc:
            log.warning("egressd: could not release the lease on %s (its TTL will): %s",
                        lease.proxy.key, exc)

    async def _acquire(self, name: str) -> Lease:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait
        while True:
            try:
                lease = await self.client.acquire(selector=self.selector, target=name,
                                                  ttl=self.ttl)
            except NoProxyAvailable as exc:
                pause = exc.retry_after if exc.retry_after is not None else self.no_proxy_pause
                if loop.time() + pause > deadline:
                    self._inc("no_proxy")
                    raise NoProxyForRequest(f"egressd: no proxy for {name}: {exc}") from None
                self._inc("no_proxy_waits")
                log.info("egressd: no proxy free for %s, retrying in %.1f s (%s)",
                         name, pause, exc)
                await asyncio.sleep(pause)
                continue
            self._inc("leases/acquired")
            log.debug("egressd: %s goes through %s", name, lease.proxy.key)
            return lease

    async def _lease_for(self, name: str) -> Lease:
        domain = self.domains.setdefault(name, _Domain())
        domain.last_used = asyncio.get_running_loop().time()
        async with domain.lock:  # one acquire per domain, however many requests wait
            lease = domain.lease
            if lease is not None and lease.seconds_left() < RENEW_MARGIN:
                domain.lease = None
                await self._release(lease)
                self._inc("leases/renewed")
                lease = None
            if lease is None:
                try:
                    lease = domain.lease = await self._acquire(name)
                finally:
                    retired, domain.retired = domain.retired, []
                    for old in retired:
                        await self._release(old)
            return lease

    async def _drop(self, name: str, lease: Lease, result: Result,
                    retry_after: float | None) -> None:
        """Report a ban once per lease and move the domain off it."""
        if lease.id in self.reported:
            return
        self.reported.add(lease.id)
        self._inc(f"bans/{result.value}")
        try:
            await self.client.report(lease, result, retry_after=retry_after)
        except EgressdError as exc:
            log.warning("egressd: could not report %s on %s: %s", result.value,
                        lease.proxy.key, exc)
        domain = self.domains.get(name)
        if domain is not None and domain.lease is not None and domain.lease.id == lease.id:
            # Held until the replacement is granted: egressd prefers the proxies with
            # the fewest active leases, so the next lease lands elsewhere even when the
            # report set no cooldown (proxy_error).
            domain.lease = None
            domain.retired.append(lease)
        else:
            await self._release(lease)
        log.info("egressd: %s on %s for %s; moving to another proxy", result.value,
                 lease.proxy.key, name)

    # --- the middleware ---------------------------------------------------------------

    async def process_request(self, request: Request) -> None:
        meta = request.meta
        if meta.get("egressd") is False or (meta.get("proxy") and META not in meta):
            return None  # the spider chose (no) proxy itself
        if self.direct:
            return None
        if self.stopping:
            raise IgnoreRequest("egressd unavailable; the spider is stopping")
        name = urlparse_cached(request).hostname or ""
        try:
            lease = await self._lease_for(name)
        except EgressdError as exc:
            if self._unavailable(exc):
                return None
            await self._stop()
            raise IgnoreRequest(f"egressd unavailable: {exc}") from None
        meta[META] = (name, lease)
        meta["proxy"] = lease.proxy_url
        meta["egressd_proxy"] = lease.proxy.key
        if "download_slot" not in meta or meta.get("_egressd_slot"):
            meta["download_slot"] = f"egressd:{lease.proxy.key}"
            meta["_egressd_slot"] = True
        self._inc("requests")
        return None

    async def _stop(self) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(
                self.crawler.engine.close_spider_async(reason="egressd_unavailable"))

    async def process_response(self, request: Request, response: Response
                               ) -> Request | Response:
        ours = request.meta.get(META)
        if ours is None:
            return response
        name, lease = ours
        if (domain := self.domains.get(name)) is not None:
            domain.last_used = asyncio.get_running_loop().time()
        if not self._response_is_ban(request, response):
            return response
        if response.status in self.rate_limit_statuses:
            result = Result.RATE_LIMITED
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
        else:
            result, retry_after = Result.BANNED, None
        await self._drop(name, lease, result, retry_after)
        return self._retry(request, f"{result.value} (status {response.status})")

    async def process_exception(self, request: Request, exception: Exception
                                ) -> Request | None:
        ours = request.meta.get(META)
        if ours is None or not self._exception_is_ban(request, exception):
            return None
        name, lease = ours
        await self._drop(name, lease, Result.PROXY_ERROR, None)
        return self._retry(request, f"proxy_error ({type(exception).__name__})")

    def _retry(self, request: Request, reason: str) -> Request:
        retries = int(request.meta.get("egressd_ban_retries", 0)) + 1
        if retries > self.max_retries:
            self._inc("retries_exhausted")
            raise BanRetriesExhausted(
                f"egressd: {request.url} was refused on {retries} proxies; last: {reason}")
        self._inc("retries")
        meta = {k: v for k, v in request.meta.items()
                if k not in (META, "proxy", "egressd_proxy")}
        if meta.pop("_egressd_slot", False):
            meta.pop("download_slot", None)
        meta["egressd_ban_retries"] = retries
        return request.replace(meta=meta, dont_filter=True)

