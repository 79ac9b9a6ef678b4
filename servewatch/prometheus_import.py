"""Prometheus import for the CLI: a client for the server, the plan, chunks under a progress bar.

The reading and storing is `collectors.prometheus.reader` (raw series) and
`collectors.prometheus.recorded` (the SLI series `servewatch rules sli` records); this module
owns what a command needs around them: the HTTP client, a progress bar on stderr while chunks
are read, and the reports as JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import httpx

from servewatch.collectors.prometheus.api import PrometheusApi
from servewatch.collectors.prometheus.reader import (
    ImportWindow,
    PrometheusImportReport,
    import_chunks,
    import_range,
    plan_import,
)
from servewatch.collectors.prometheus.recorded import (
    RecordedImportReport,
    import_recorded,
    recorded_names,
)
from servewatch.pipeline.instants import format_instant
from servewatch.render import counting_progress
from servewatch.store import Store

DEFAULT_TIMEOUT_S = 60.0


def import_from_prometheus(
    url: str,
    *,
    store: Store,
    window: ImportWindow,
    keep_uncatalogued: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client: httpx.Client | None = None,
) -> PrometheusImportReport:
    """Import `window` from the Prometheus (Thanos, Mimir) API at `url` into `store`."""
    with _api(url, timeout_s=timeout_s, client=client) as api:
        plan = plan_import(api, window=window, keep_uncatalogued=keep_uncatalogued)
        with counting_progress("import from Prometheus") as progress:
            task = progress.add_task("queries", total=plan.queries)
            return import_range(
                api,
                store=store,
                plan=plan,
                keep_uncatalogued=keep_uncatalogued,
                on_query=lambda n: progress.advance(task, n),
            )


@contextmanager
def _api(url: str, *, timeout_s: float, client: httpx.Client | None) -> Iterator[PrometheusApi]:
    """The API at `url` through `client`, or through a client of its own, closed after."""
    if client is not None:
        yield PrometheusApi(client, url, timeout_s=timeout_s)
        return
    with httpx.Client(follow_redirects=True) as owned:
        yield PrometheusApi(owned, url, timeout_s=timeout_s)


def import_json(report: PrometheusImportReport, *, window: ImportWindow) -> dict[str, Any]:
    return {
        "url": report.url,
        "from": format_instant(window.start),
        "to": format_instant(window.end),
        "step_s": window.step_s,
        "resolution": window.resolution.value,
        "families": report.names,
        "uncatalogued_families": report.extra_names,
        "chunks": report.chunks,
        "queries": report.queries,
        "series_read": report.series_read,
        "points_read": report.points_read,
        "new_scrapes": report.new_scrapes,
        "failed_scrapes": report.failed_scrapes,
        "new_points": report.new_points,
        "stored_samples": report.stored_samples,
        "unknown_samples": report.unknown_samples,
        "unassigned_series": report.unassigned_series,
        "duplicate_points": report.duplicate_points,
        "stale_markers": report.stale_markers,
        "problems": [asdict(p) for p in report.problems],
    }


def import_summary(report: PrometheusImportReport) -> str:
    return (
        f"{report.url}: {len(report.names)} catalogued families"
        + (f" and {len(report.extra_names)} others" if report.extra_names else "")
        + f" in {report.chunks} chunks ({report.queries} queries): {report.series_read} series, "
        f"{report.points_read} points read; {report.new_scrapes} new scrapes "
        f"({report.failed_scrapes} failed), {report.new_points} new points"
        + (f"; {len(report.problems)} problems recorded" if report.problems else "")
    )


def import_recorded_from_prometheus(
    url: str,
    *,
    store: Store,
    window: ImportWindow,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client: httpx.Client | None = None,
) -> RecordedImportReport:
    """Import the SLI records (`servewatch rules sli`) a Prometheus-compatible server at `url`
    holds for `window` into `store`'s `recorded_points`."""
    with _api(url, timeout_s=timeout_s, client=client) as api:
        names = recorded_names(api, window=window)
        with counting_progress("import recorded SLIs") as progress:
            task = progress.add_task("queries", total=len(names) * len(import_chunks(window)))
            return import_recorded(
                api,
                store=store,
                window=window,
                records=names,
                on_query=lambda n: progress.advance(task, n),
            )


def recorded_import_json(report: RecordedImportReport, *, window: ImportWindow) -> dict[str, Any]:
    return {
        "url": report.url,
        "from": format_instant(window.start),
        "to": format_instant(window.end),
        "step_s": window.step_s,
        "recorded": True,
        "records": list(report.records),
        "chunks": report.chunks,
        "queries": report.queries,
        "series_read": report.series_read,
        "points_read": report.points_read,
        "new_points": report.new_points,
        "problems": [asdict(p) for p in report.problems],
    }


def recorded_import_summary(report: RecordedImportReport) -> str:
    if not report.records:
        return (
            f"{report.url}: no recorded SLI series in this range (servewatch rules sli writes "
            "the rules; are they loaded, and evaluated in this range?)"
        )
    return (
        f"{report.url}: {len(report.records)} recorded SLI series names in {report.chunks} "
        f"chunks ({report.queries} queries): {report.series_read} series, "
        f"{report.points_read} points read; {report.new_points} new points"
        + (f"; {len(report.problems)} problems recorded" if report.problems else "")
    )
