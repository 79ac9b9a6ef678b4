"""Scraping: fetching every target's `/metrics` page concurrently, one result per target.

Each target has its own timeout, so a slow or dead target never delays the others. The Accept
header asks for OpenMetrics first and the 0.0.4 text format second, as Prometheus does; gzip is
negotiated by the HTTP client. A failure (refused, timed out, HTTP error status, oversize or
undecodable body) becomes a result with an error, never an exception.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from collectors.targets import Target

ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
MAX_BODY_BYTES = 64 * 1024 * 1024

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


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


async def scrape_target(
    target: Target, *, client: httpx.AsyncClient, timeout_s: float, now: Clock = utc_now
) -> ScrapeResult:
    started_ts = now()
    started = time.perf_counter()

    def result(body: str | None, error: str | None, *, openmetrics: bool = False) -> ScrapeResult:
        return ScrapeResult(
            target=target,
            started_ts=started_ts,
            duration_s=time.perf_counter() - started,
            body=body,
            openmetrics=openmetrics,
            error=error,
        )

    try:
        async with asyncio.timeout(timeout_s):
            # The client's own timeout (5 s by default) must not cut a longer scrape timeout.
            response = await client.get(target.url, headers={"Accept": ACCEPT}, timeout=timeout_s)
            if response.status_code != 200:
                return result(None, f"HTTP {response.status_code} from {target.url}")
            content = response.content
    except TimeoutError:
        return result(None, f"timed out after {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return result(None, f"{type(exc).__name__}: {exc or 'connection failed'}")
    if len(content) > MAX_BODY_BYTES:
        return result(None, f"page of {len(content)} bytes exceeds {MAX_BODY_BYTES}")
    try:
        body = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        return result(None, f"page is not UTF-8 text (byte {exc.start})")
    content_type = response.headers.get("content-type", "")
    return result(body, None, openmetrics=content_type.startswith("application/openmetrics-text"))


async def scrape_targets(
    targets: Sequence[Target],
    *,
    client: httpx.AsyncClient,
    timeout_s: float,
    now: Clock = utc_now,
) -> list[ScrapeResult]:
    """Scrape all targets at once; results come back in the targets' order."""
    return list(
        await asyncio.gather(
            *(scrape_target(t, client=client, timeout_s=timeout_s, now=now) for t in targets)
        )
    )
