"""Request phases: where a request's time goes (queue, prefill, decode), as the mean per request.

vLLM's dashboard draws `rate(..._seconds_sum)` for queue, prefill and decode time: seconds spent
per second of wall clock, which rises with traffic as much as with slowness. The mean per
request (sum of the phase's time / requests) separates the two, and it adds exactly over any
bucket, so downsampling loses nothing. The frame holds, per minute and phase, the summed time
and the request count: a histogram's `_sum` and `_count` increases, or traced requests
(`phases_from_requests`).

Each phase gets its own panel and scale: decode takes seconds where queue and prefill take
milliseconds, and on one shared axis the short phases are flat lines along zero whatever they do.
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
    epoch_ms,
    series_lines,
    titled,
)
from servewatch.pipeline.request_minutes import with_minute

PHASES: tuple[str, ...] = ("queue", "prefill", "decode")

PHASE_CONTRACT = FrameContract(
    "request phase chart",
    (
        MINUTE_TS,
        Column("phase", ColumnKind.TEXT, "queue, prefill, decode (or another phase)"),
        Column("total_s", ColumnKind.NUMBER, "seconds spent in the phase by the minute's requests"),
        Column("requests", ColumnKind.NUMBER, "requests counted in total_s"),
    ),
)


def phases_from_requests(requests: pl.LazyFrame) -> pl.LazyFrame:
    """Per minute (of completion) and phase: summed seconds and the requests that had it."""
    return (
        requests.pipe(with_minute)
        .filter(pl.col("ok"))
        .unpivot(
            index="minute_ts",
            on=[f"{phase}_s" for phase in PHASES],
            variable_name="phase",
            value_name="seconds",
        )
        .drop_nulls("seconds")
        .group_by("minute_ts", "phase")
        .agg(pl.col("seconds").sum().alias("total_s"), pl.len().cast(pl.Int64).alias("requests"))
        .with_columns(pl.col("phase").str.strip_suffix("_s"))
        .sort("minute_ts", "phase")
    )


def request_phase_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    source: str = "traced requests",
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    """Mean seconds per request in each phase, per minute or bucket."""
    rows = PHASE_CONTRACT.select(frame)
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    data = compact(
        rows.group_by(bucket_start("minute_ts", buckets).alias("bucket"), "phase")
        .agg(mean_s=pl.col("total_s").sum() / pl.col("requests").sum())
        .select(epoch_ms("bucket").alias("ts"), "phase", "mean_s")
        .sort("ts", "phase")
    )
    known = [p for p in PHASES if p in set(data["phase"].to_list())]
    order = known + sorted(set(data["phase"].to_list()) - set(PHASES))
    panels = [
        series_lines(
            data.filter(pl.col("phase") == phase),
            y="mean_s",
            y_title=f"{phase}: mean per request (s)",
            color="phase",
            color_title="phase",
            domain=domain,
            order=order,
            points=buckets.minutes <= 30,
        ).properties(width=WIDTH_PX, height=HEIGHT_PX // 2)
        for phase in order
    ]
    subtitle = [
        (
            f"Mean seconds per request in each phase per {buckets.label}, from {source} "
            "(phase time summed / requests, exact over any bucket)."
        ),
        "One panel and scale per phase: queue and prefill are far shorter than decode.",
    ]
    if buckets.downsampled:
        subtitle.append(buckets.note_with("mean over all requests that finished in it"))
    chart = alt.vconcat(*panels).resolve_scale(x="shared", y="independent", color="shared")
    return titled(chart, title="Queue, prefill and decode time per request", subtitle=subtitle)
