"""Replay: a recorded fixture folder read into the store as if it were being scraped live.

Spans go through trace ingest, pages through metric ingest, in batches of scrape instants so
memory stays flat for day-long fixtures. Replaying twice changes nothing (both ingests are
idempotent).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from servewatch.collectors.fixture_folder import Fixture, iter_fixture_pages, open_fixture
from servewatch.collectors.metric_ingest import MetricIngestReport, ingest_pages
from servewatch.collectors.request_spans import SpanMapping
from servewatch.collectors.trace_ingest import IngestReport, ingest_trace_files
from servewatch.store import Store

PAGES_PER_BATCH = 600


@dataclass
class ReplayReport:
    fixture: Fixture
    traces: IngestReport = field(default_factory=IngestReport)
    metrics: MetricIngestReport = field(default_factory=MetricIngestReport)


def _add(total: MetricIngestReport, part: MetricIngestReport) -> None:
    total.pages += part.pages
    total.new_scrapes += part.new_scrapes
    total.new_points += part.new_points
    total.stored_samples += part.stored_samples
    total.unknown_samples += part.unknown_samples
    total.line_errors.extend(part.line_errors)
    total.failed_scrapes.extend(part.failed_scrapes)


def replay_fixture(
    folder: Path,
    *,
    store: Store,
    mapping: SpanMapping | None = None,
    keep_uncatalogued: bool = False,
    on_pages: Callable[[int], None] | None = None,
) -> ReplayReport:
    fixture = open_fixture(folder)
    report = ReplayReport(fixture=fixture)
    if fixture.span_files:
        report.traces = ingest_trace_files(list(fixture.span_files), store=store, mapping=mapping)
    pages = iter_fixture_pages(fixture)
    while batch := tuple(islice(pages, PAGES_PER_BATCH)):
        part = ingest_pages(batch, store=store, keep_uncatalogued=keep_uncatalogued)
        _add(report.metrics, part)
        if on_pages is not None:
            on_pages(len(batch))
    return report


def fixture_page_count(folder: Path) -> int:
    fixture = open_fixture(folder)
    return len(fixture.targets) * len(fixture.scrape_times)
