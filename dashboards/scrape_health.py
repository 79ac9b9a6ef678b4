"""Scrape health: which targets failed their scrapes, when, with what error, and which were
unreachable when the window ended.

Input is the store's `scrapes` table (one row per scrape: target, time, ok, duration, error).
A heatmap draws each target's share of failed scrapes per bucket (targets as rows, so a host
whose targets fail together shows as a block); a table beneath lists every target that failed
at least once, with its count, its most frequent error and whether its last scrape failed,
which is what "unreachable" means here: servewatch could not read it when the window ended.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import Column, ColumnKind, FrameContract, time_column
from servewatch.dashboards.downsampling import MAX_POINTS_PER_SERIES, bucket_start, buckets_for
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    ROW_PX,
    WIDTH_PX,
    TimeDomain,
    bucket_span,
    compact,
    data_chart,
    natural_order,
    time_heatmap,
    titled,
)

MAX_CELLS = 20_000
ERROR_CHARS = 60
# Left edge of each column of the table, px.
COLUMN_X = (0, 170, 260, 360, 460)
HEADERS = ("target", "failed", "last scrape", "p95 duration", "most frequent error")

SCRAPES_CONTRACT = FrameContract(
    "scrape health",
    (
        Column("target_id", ColumnKind.TEXT, "the scraped target"),
        time_column("ts", "when the scrape ran, naive UTC"),
        Column("ok", ColumnKind.FLAG, "the scrape returned a page"),
        Column("duration_s", ColumnKind.NUMBER, "how long the scrape took, s"),
        Column("error", ColumnKind.TEXT, "why it failed (null when ok)"),
    ),
)


def target_summary(scrapes: pl.DataFrame) -> pl.DataFrame:
    """Per target: scrapes, failed, last_ok (its last scrape in the window answered),
    duration_p95_s and the most frequent error; sorted with the unreachable first."""
    errors = (
        scrapes.filter(~pl.col("ok"))
        .group_by("target_id", "error")
        .agg(pl.len().alias("times"))
        .sort("target_id", "times", "error", descending=[False, True, False], nulls_last=True)
        .group_by("target_id", maintain_order=True)
        .agg(pl.col("error").first().alias("error"))
    )
    summary = (
        scrapes.group_by("target_id")
        .agg(
            pl.len().alias("scrapes"),
            (~pl.col("ok")).sum().alias("failed"),
            pl.col("ok").sort_by("ts").last().alias("last_ok"),
            pl.col("duration_s").quantile(0.95, interpolation="nearest").alias("duration_p95_s"),
        )
        .join(errors, on="target_id", how="left")
    )
    order = {name: i for i, name in enumerate(natural_order(summary["target_id"].to_list()))}
    return (
        summary.with_columns(order=pl.col("target_id").replace_strict(order, return_dtype=pl.Int64))
        .sort("last_ok", "order")
        .drop("order")
    )


def _table(failing: pl.DataFrame) -> Any:
    cells: list[tuple[int, int, str]] = [(0, i, h) for i, h in enumerate(HEADERS)]
    for n, row in enumerate(failing.iter_rows(named=True), start=1):
        error = row["error"] or "-"
        if len(error) > ERROR_CHARS:
            error = error[: ERROR_CHARS - 1] + "…"
        values = (
            row["target_id"],
            f"{row['failed']:,} of {row['scrapes']:,}",
            "ok" if row["last_ok"] else "failed: unreachable",
            # Replayed scrapes record no duration.
            "-" if row["duration_p95_s"] is None else f"{row['duration_p95_s'] * 1000:,.0f} ms",
            error,
        )
        cells += [(n, i, v) for i, v in enumerate(values)]
    frame = pl.DataFrame(
        {
            "row": [c[0] for c in cells],
            "x": [COLUMN_X[c[1]] for c in cells],
            "text": [c[2] for c in cells],
            "header": [c[0] == 0 for c in cells],
        }
    )
    y = alt.Y("row:O", axis=None)
    layers = [
        data_chart(frame.filter(pl.col("header") == header))
        .mark_text(align="left", baseline="middle", limit=0, fontWeight=weight)
        .encode(y, x=alt.X("x:Q", axis=None, scale=None), text="text:N")
        for header, weight in ((True, "bold"), (False, "normal"))
    ]
    return alt.layer(*layers).properties(width=WIDTH_PX, height=ROW_PX * (failing.height + 1) + 8)


def scrape_health_chart(
    frame: pl.DataFrame | pl.LazyFrame, *, domain: TimeDomain | None = None
) -> Any:
    scrapes = SCRAPES_CONTRACT.select(frame)
    if scrapes.is_empty():
        raise ValueError("scrape health: there are no scrapes to draw")
    targets = natural_order(scrapes["target_id"].to_list())
    per_row = min(MAX_POINTS_PER_SERIES, max(1, MAX_CELLS // len(targets)))
    buckets = buckets_for(scrapes, column="ts", domain=domain, max_points=per_row)
    data = compact(
        scrapes.group_by(bucket_start("ts", buckets).alias("bucket"), "target_id")
        .agg(
            pl.len().alias("scrapes"),
            (~pl.col("ok")).sum().alias("failed"),
            (~pl.col("ok")).mean().alias("failed_ratio"),
        )
        .select(*bucket_span(buckets.width_s), "target_id", "scrapes", "failed", "failed_ratio")
        .sort("target_id", "ts")
    )
    heat = time_heatmap(
        data,
        y=alt.Y("target_id:N", title="target", sort=targets),
        color=alt.Color(
            "failed_ratio:Q",
            title="failed scrapes (%)",
            scale=alt.Scale(domain=[0, 1], range=["#e8f4e8", "#d62728"]),
            legend=alt.Legend(format=".0%"),
        ),
        tooltip=[
            alt.Tooltip("target_id:N", title="target"),
            alt.Tooltip("failed:Q", title="failed scrapes"),
            alt.Tooltip("scrapes:Q", title="scrapes"),
        ],
        domain=domain,
        height_px=max(HEIGHT_PX // 2, ROW_PX * len(targets)),
    )
    summary = target_summary(scrapes)
    failing = summary.filter(pl.col("failed") > 0)
    unreachable = summary.filter(~pl.col("last_ok")).height
    failed = int(summary["failed"].sum())
    subtitle = [
        (
            f"Share of each target's scrapes that failed per {buckets.label} (no cell: no "
            f"scrape ran). {failed:,} of {scrapes.height:,} scrapes failed; "
            f"{failing.height} of {len(targets)} targets failed at least once, "
            f"{unreachable} unreachable at the end of the window (last scrape failed)."
        ),
    ]
    if buckets.downsampled:
        subtitle.append(buckets.note_with("failed scrapes in it / scrapes in it"))
    chart = heat if failing.is_empty() else alt.vconcat(heat, _table(failing))
    return titled(chart, title="Scrape health and unreachable targets", subtitle=subtitle)
