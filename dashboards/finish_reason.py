"""Finish reasons: why requests ended (stop, length, abort, error, ...), as requests per second.

Input is per minute and reason the count of finished requests: the increase of vLLM's
`request_success_total{finished_reason}`, or traced requests classified by
`finish_reasons_from_requests`. Spans carry no finish reason, so that classification is
derived and the subtitle says how: a failed span is `error`, a successful one that produced
`max_tokens` tokens is `length`, any other is `stop`.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import MAX_POINTS_PER_SERIES, bucket_start, buckets_for
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    WIDTH_PX,
    TimeDomain,
    compact,
    data_chart,
    epoch_ms,
    time_tooltip,
    time_x,
    titled,
)
from servewatch.pipeline.request_minutes import with_minute

REASON_ORDER: tuple[str, ...] = ("stop", "length", "repetition", "abort", "error")
DERIVED_FROM_SPANS = (
    "derived from spans: failed = error, output reached max_tokens = length, else stop"
)

FINISH_REASON_CONTRACT = FrameContract(
    "finish reason chart",
    (
        MINUTE_TS,
        Column("finished_reason", ColumnKind.TEXT, "stop, length, abort, error, repetition"),
        Column("requests", ColumnKind.NUMBER, "requests that finished so in the minute"),
    ),
)


def finish_reasons_from_requests(requests: pl.LazyFrame) -> pl.LazyFrame:
    reason = (
        pl.when(~pl.col("ok"))
        .then(pl.lit("error"))
        .when(
            pl.col("max_tokens").is_not_null()
            & (pl.col("completion_tokens") >= pl.col("max_tokens"))
        )
        .then(pl.lit("length"))
        .otherwise(pl.lit("stop"))
    )
    return (
        requests.pipe(with_minute)
        .group_by("minute_ts", reason.alias("finished_reason"))
        .agg(pl.len().cast(pl.Int64).alias("requests"))
        .sort("minute_ts", "finished_reason")
    )


def finish_reason_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    source: str = "vLLM request_success_total",
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    """Stacked requests per second by finish reason."""
    rows = FINISH_REASON_CONTRACT.select(frame)
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    counted = rows.group_by(
        bucket_start("minute_ts", buckets).alias("bucket"), "finished_reason"
    ).agg(requests_per_s=pl.col("requests").sum() / buckets.width_s)
    # A stack needs every reason in every bucket, or an area jumps across the gap.
    grid = (
        counted.select("bucket")
        .unique()
        .join(counted.select("finished_reason").unique(), how="cross")
    )
    data = compact(
        grid.join(counted, on=["bucket", "finished_reason"], how="left")
        .select(
            epoch_ms("bucket").alias("ts"),
            "finished_reason",
            pl.col("requests_per_s").fill_null(0.0),
        )
        .sort("ts", "finished_reason")
    )
    seen = set(data["finished_reason"].to_list())
    order = [r for r in REASON_ORDER if r in seen] + sorted(seen - set(REASON_ORDER))
    area = (
        data_chart(data)
        .mark_area()
        .encode(
            time_x(domain=domain),
            alt.Y("requests_per_s:Q", title="finished requests (req/s)", stack="zero"),
            alt.Color("finished_reason:N", title="finish reason", sort=order),
            tooltip=[
                time_tooltip(),
                alt.Tooltip("finished_reason:N", title="finish reason"),
                alt.Tooltip("requests_per_s:Q", title="req/s", format=".3g"),
            ],
        )
        .properties(width=WIDTH_PX, height=HEIGHT_PX)
    )
    subtitle = [
        f"Requests finished per second by reason, stacked, per {buckets.label}; {source}.",
        buckets.note_with("requests finished in it / its length (exact)"),
    ]
    return titled(area, title="Finish reasons", subtitle=[s for s in subtitle if s])
