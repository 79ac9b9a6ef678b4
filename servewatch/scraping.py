"""Scrape rounds for the CLI: the configured targets fetched concurrently, then stored."""

from __future__ import annotations

import asyncio
import time

import httpx

from collectors.metric_ingest import MetricIngestReport, Page, ingest_pages
from collectors.scraper import ScrapeResult, scrape_targets
from collectors.targets import FileSdSource, Target, merge_targets
from pipeline.store import Store
from servewatch.config import Config, ScrapeSettings


def resolve_targets(config: Config) -> tuple[list[Target], list[str]]:
    """Inline targets plus every file_sd file's; problems are returned, not raised, because
    one unreadable file must not stop the scraping of the others."""
    sources = [FileSdSource(path) for path in config.file_sd]
    problems = []
    for source in sources:
        source.refresh()
        if source.error:
            problems.append(source.error)
    return merge_targets([list(config.targets), *(s.targets for s in sources)]), problems


def page_of(result: ScrapeResult) -> Page:
    return Page(
        target=result.target,
        scrape_ts=result.started_ts,
        body=result.body,
        duration_s=result.duration_s,
        openmetrics=result.openmetrics if result.body is not None else None,
        error=result.error,
    )


async def fetch_results(targets: list[Target], settings: ScrapeSettings) -> list[ScrapeResult]:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits, follow_redirects=False) as client:
        return await scrape_targets(targets, client=client, timeout_s=settings.timeout_s)


def scrape_round(
    targets: list[Target], *, store: Store, settings: ScrapeSettings
) -> MetricIngestReport:
    results = asyncio.run(fetch_results(targets, settings))
    return ingest_pages(
        [page_of(r) for r in results], store=store, keep_uncatalogued=settings.keep_uncatalogued
    )


def wait_for_next_round(interval_s: float) -> None:
    """Sleep to the next multiple of the interval (rounds stay on a fixed grid)."""
    now = time.time()
    time.sleep(interval_s - now % interval_s)
