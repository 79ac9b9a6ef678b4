"""Metric ingest: scraped pages parsed, catalogued and written to the store as scrapes.

A page is one target's exposition at one instant, from a live scrape, a recorded fixture or a
file. Bad input loses nothing else: a malformed line is left out, named (line number and what
was wrong) in the scrape's `error` and in `ingest_errors`, and every well-formed sample of the
page is stored. Prometheus drops a whole page for one bad line; an observability tool that goes
blind to a replica because of one odd label would hide exactly the fleet it should show.
By default only catalogued families are stored; the others are tallied in `unknown_families`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from collectors.dcgm_catalogue import catalogue_dcgm_frame
from collectors.exposition import LineError, SeriesCache, parse_exposition
from collectors.targets import Target, TargetKind
from collectors.trace_ingest import Reject, rejects_frame
from collectors.vllm_catalogue import catalogue_vllm_frame
from pipeline.signals import Disposition
from pipeline.store import Store
from pipeline.tables import SAMPLES_SCHEMA, SCRAPES_SCHEMA, TARGETS_SCHEMA, UNKNOWN_FAMILIES_SCHEMA

MAX_ERRORS_IN_SCRAPE_ROW = 3
_PAGE = ["target_id", "scrape_ts"]


@dataclass(frozen=True)
class Page:
    """One scrape of one target: the body when it was fetched, else the fetch error."""

    target: Target
    scrape_ts: datetime  # naive UTC
    body: str | None
    duration_s: float | None = None
    openmetrics: bool | None = None  # None: decide from the page
    error: str | None = None


@dataclass
class MetricIngestReport:
    pages: int = 0
    new_scrapes: int = 0
    new_points: int = 0
    stored_samples: int = 0
    unknown_samples: int = 0
    line_errors: list[Reject] = field(default_factory=list)
    failed_scrapes: list[Reject] = field(default_factory=list)


def _scrape_error(errors: Sequence[LineError]) -> str:
    shown = "; ".join(str(e) for e in errors[:MAX_ERRORS_IN_SCRAPE_ROW])
    more = len(errors) - MAX_ERRORS_IN_SCRAPE_ROW
    suffix = f"; and {more} more" if more > 0 else ""
    return f"{len(errors)} malformed line(s) left out: {shown}{suffix}"


_CATALOGUES = {TargetKind.VLLM: catalogue_vllm_frame, TargetKind.DCGM: catalogue_dcgm_frame}


def ingest_pages(
    pages: Sequence[Page], *, store: Store, keep_uncatalogued: bool = False
) -> MetricIngestReport:
    """Parse, catalogue and store `pages`; scrapes already stored are skipped (idempotent)."""
    report = MetricIngestReport(pages=len(pages))
    cache = SeriesCache()
    frames: dict[TargetKind, list[pl.DataFrame]] = {kind: [] for kind in TargetKind}
    scrape_rows: list[tuple[object, ...]] = []
    for page in pages:
        target_id = page.target.target_id
        if page.body is None:
            error = page.error or "no page"
            where = f"scrape {page.scrape_ts.isoformat()}Z"
            report.failed_scrapes.append(Reject(target_id, where, error))
            scrape_rows.append((target_id, page.scrape_ts, False, page.duration_s, 0, error))
            continue
        parsed = parse_exposition(page.body, openmetrics=page.openmetrics, cache=cache)
        for line_error in parsed.errors:
            location = f"scrape {page.scrape_ts.isoformat()}Z line {line_error.line}"
            report.line_errors.append(Reject(target_id, location, line_error.message))
        frames[page.target.kind].append(
            parsed.frame().with_columns(
                target_id=pl.lit(target_id), scrape_ts=pl.lit(page.scrape_ts, pl.Datetime("us"))
            )
        )
        scrape_rows.append(
            (
                target_id,
                page.scrape_ts,
                not parsed.errors,
                page.duration_s,
                None,  # filled with the stored count below
                _scrape_error(parsed.errors) if parsed.errors else None,
            )
        )

    catalogued = [
        _CATALOGUES[kind](pl.concat(kind_frames).lazy(), page_by=_PAGE)
        for kind, kind_frames in frames.items()
        if kind_frames
    ]
    wanted = [Disposition.CATALOGUED.value]
    if keep_uncatalogued:
        wanted.append(Disposition.UNKNOWN.value)
    all_samples = (
        pl.concat(catalogued, how="diagonal_relaxed")
        if catalogued
        else pl.LazyFrame(schema={**SAMPLES_SCHEMA, "disposition": pl.String, "exposed": pl.String})
    )
    stored, unknown = pl.collect_all(
        [
            all_samples.filter(pl.col("disposition").is_in(wanted)).select(
                "target_id",
                "scrape_ts",
                ts=pl.coalesce(
                    pl.from_epoch(pl.col("timestamp_ms"), time_unit="ms").cast(pl.Datetime("us")),
                    pl.col("scrape_ts"),
                ),
                metric=pl.col("metric"),
                labels=pl.col("labels"),
                signal=pl.col("signal"),
                source=pl.col("source"),
                value=pl.col("value"),
            ),
            all_samples.filter(pl.col("disposition") == Disposition.UNKNOWN.value)
            .group_by("target_id", "family")
            .agg(
                samples=pl.len().cast(pl.Int64),
                first_seen_ts=pl.col("scrape_ts").min(),
                last_seen_ts=pl.col("scrape_ts").max(),
            ),
        ]
    )
    stored = stored.cast(SAMPLES_SCHEMA)
    stored_counts = {(t, s): n for t, s, n in stored.group_by(_PAGE).len().iter_rows()}
    scrapes = pl.DataFrame(
        [
            (*row[:4], stored_counts.get((row[0], row[1]), 0) if row[4] is None else row[4], row[5])
            for row in scrape_rows
        ],
        schema=SCRAPES_SCHEMA,
        orient="row",
    )
    store.write_targets(_targets_frame(pages))
    report.new_scrapes, report.new_points = store.write_scrapes(scrapes, stored)
    report.stored_samples = stored.height
    report.unknown_samples = int(unknown["samples"].sum()) if unknown.height else 0
    if report.new_scrapes:
        store.count_unknown_families(unknown.cast(UNKNOWN_FAMILIES_SCHEMA))
    if report.line_errors:
        store.write_ingest_errors(rejects_frame(report.line_errors, recorded_ts=store.now()))
    return report


def _targets_frame(pages: Sequence[Page]) -> pl.DataFrame:
    seen: dict[str, tuple[Target, datetime, datetime]] = {}
    for page in pages:
        target, first, last = seen.get(
            page.target.target_id, (page.target, page.scrape_ts, page.scrape_ts)
        )
        seen[target.target_id] = (target, min(first, page.scrape_ts), max(last, page.scrape_ts))
    return pl.DataFrame(
        [
            (
                t.target_id,
                t.kind.value,
                t.url,
                t.replica,
                t.host,
                t.zone,
                t.model,
                t.pool,
                t.gpus,
                first,
                last,
            )
            for t, first, last in seen.values()
        ],
        schema=TARGETS_SCHEMA,
        orient="row",
    )
