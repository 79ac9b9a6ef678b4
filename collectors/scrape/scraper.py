"""Scraping: fetching every target's `/metrics` page concurrently, one result per target.

Each target has its own timeout, so a slow or dead target never delays the others. The Accept
header asks for OpenMetrics first and the 0.0.4 text format second, as Prometheus does; gzip is
negotiated by the HTTP client. A body is read while it streams and cut off at the size limit.
A failure (refused, timed out, HTTP error status, oversize body) becomes a result with an
error, never an exception; bytes that are not UTF-8 cost only the lines that hold them.

Pages are fetched by the scrape client (`page_client.PageClient`: kept-alive connections, the
body handed to the parser without copies), or by an httpx client where one is given (and for
a URL the environment sends through a proxy); both give the same results.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import httpx

from servewatch.collectors.metrics.exposition import page_text
from servewatch.collectors.scrape.page_client import FetchError, PageClient, PageTooLargeError
from servewatch.collectors.scrape.targets import Target
from servewatch.store import Clock, utc_now

ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ScrapeResult:
    target: Target
    started_ts: datetime  # naive UTC
    duration_s: float
    body: str | None
    openmetrics: bool
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


ScrapeClient = PageClient | httpx.AsyncClient


async def scrape_target(
    target: Target,
    *,
    client: ScrapeClient,
    timeout_s: float,
    now: Clock = utc_now,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> ScrapeResult:
    started_ts = now()
    started = time.perf_counter()
    if isinstance(client, PageClient) and client.proxy_for(target.url) is None:
        fetched = await _fetch(target.url, client, timeout_s=timeout_s, limit=max_body_bytes)
    elif isinstance(client, PageClient):  # the environment names a proxy for this URL
        async with httpx.AsyncClient(
            verify=client.tls_context(), follow_redirects=False
        ) as proxied:
            fetched = await _fetch_httpx(
                target.url, proxied, timeout_s=timeout_s, limit=max_body_bytes
            )
    else:
        fetched = await _fetch_httpx(target.url, client, timeout_s=timeout_s, limit=max_body_bytes)
    body, error, openmetrics = fetched
    return ScrapeResult(
        target=target,
        started_ts=started_ts,
        duration_s=time.perf_counter() - started,
        body=body,
        openmetrics=openmetrics,
        error=error,
    )


# A fetch's outcome: the page's text or the error, and whether it is OpenMetrics.
_Fetched = tuple[str | None, str | None, bool]


def _page(content: bytes | memoryview, content_type: str) -> _Fetched:
    # Bytes that are not UTF-8 cost only their lines (`page_text`), not the page.
    return page_text(content), None, content_type.startswith("application/openmetrics-text")


async def _fetch(url: str, client: PageClient, *, timeout_s: float, limit: int) -> _Fetched:
    try:
        async with asyncio.timeout(timeout_s):
            page = await client.get(url, accept=ACCEPT, max_body_bytes=limit)
    except TimeoutError:
        return None, f"timed out after {timeout_s:g} s", False
    except PageTooLargeError as exc:
        return None, str(exc), False
    except FetchError as exc:
        return None, f"{type(exc).__name__}: {exc or 'connection failed'}", False
    if page.status != 200 or page.body is None:
        return None, f"HTTP {page.status} from {url}", False
    return _page(page.body, page.content_type)


async def _fetch_httpx(
    url: str, client: httpx.AsyncClient, *, timeout_s: float, limit: int
) -> _Fetched:
    try:
        async with asyncio.timeout(timeout_s):
            # The client's own timeout (5 s by default) must not cut a longer scrape timeout.
            async with client.stream(
                "GET", url, headers={"Accept": ACCEPT}, timeout=timeout_s
            ) as response:
                if response.status_code != 200:
                    return None, f"HTTP {response.status_code} from {url}", False
                content = await _bounded_body(response, limit=limit)
    except TimeoutError:
        return None, f"timed out after {timeout_s:g} s", False
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc or 'connection failed'}", False
    except _OversizeError as exc:
        return None, str(exc), False
    return _page(content, response.headers.get("content-type", ""))


class _OversizeError(Exception):
    """The page is larger than the scrape's body limit."""


async def _bounded_body(response: httpx.Response, *, limit: int) -> bytes:
    """The decoded body, read while it streams in and given up as soon as it passes `limit`
    bytes (after decompression), so an oversize or endless page costs at most the limit."""
    announced = response.headers.get("content-length", "")
    encoded = response.headers.get("content-encoding", "identity").strip().lower()
    if announced.isdigit() and encoded == "identity" and int(announced) > limit:
        raise _OversizeError(f"page of {int(announced)} bytes exceeds the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise _OversizeError(f"page exceeds the limit of {limit} bytes; the rest was not read")
        chunks.append(chunk)
    return b"".join(chunks)


async def scrape_targets(
    targets: Sequence[Target],
    *,
    client: ScrapeClient,
    timeout_s: float,
    now: Clock = utc_now,
) -> list[ScrapeResult]:
    """Scrape all targets at once; results come back in the targets' order."""
    return list(
        await asyncio.gather(
            *(scrape_target(t, client=client, timeout_s=timeout_s, now=now) for t in targets)
        )
    )
