"""Latency heatmaps: vLLM's latency histograms drawn as they are, bucket by bucket over time.

A percentile read from a histogram is only known to lie inside the bucket holding it: PromQL's
`histogram_quantile` interpolates linearly between that bucket's edges, and answers the highest
finite edge when the rank falls in the `+Inf` bucket. With vLLM's coarse inter-token latency
buckets most tokens fall into one or two buckets, so p90, p95 and p99 land on or right beside
the same edges minute after minute. The heatmap shows the resolution itself: a row per bucket,
its edges named, each cell the share of the minute's observations that fell in it. Input is per
minute, stat and bucket bound `le` (float, `inf` for `+Inf`), the cumulative bucket count's
increase summed over replicas.
"""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import MAX_POINTS_PER_SERIES, bucket_start, buckets_for
from servewatch.dashboards.latency import LatencyStat
from servewatch.dashboards.panel import (
    ROW_PX,
    TimeDomain,
    bucket_span,
    compact,
    time_heatmap,
    titled,
)

MAX_CELLS = 20_000
MAX_EDGES_NAMED = 30

LATENCY_BUCKETS_CONTRACT = FrameContract(
    "latency heatmap",
    (
        MINUTE_TS,
        Column("stat", ColumnKind.TEXT, "ttft, tpot, itl or e2e"),
        Column("le", ColumnKind.NUMBER, "the bucket's upper bound, s (inf for +Inf)"),
        Column("count", ColumnKind.NUMBER, "increase of the cumulative bucket count"),
    ),
)


def edge_text(seconds: float) -> str:
    if math.isinf(seconds):
        return "+Inf"
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    return f"{seconds:g} s"


def bucket_counts(rows: pl.DataFrame) -> pl.DataFrame:
    """Cumulative counts per minute turned into each bucket's own: minute_ts, lower, le, count
    (observations above `lower` and at most `le`)."""
    return (
        rows.group_by("minute_ts", "le")
        .agg(pl.col("count").sum())
        .sort("minute_ts", "le")
        .with_columns(
            lower=pl.col("le").shift(1).over("minute_ts").fill_null(0.0),
            count=(
                pl.col("count") - pl.col("count").shift(1).over("minute_ts").fill_null(0.0)
            ).clip(lower_bound=0.0),
        )
    )


def _panel(rows: pl.DataFrame, stat: LatencyStat, *, domain: TimeDomain | None) -> Any:
    counts = bucket_counts(rows)
    edges = sorted(set(counts["le"].to_list()))
    labels = [
        f"{edge_text(lo)} to {edge_text(hi)}"
        for lo, hi in zip([0.0, *edges[:-1]], edges, strict=True)
    ]
    label_of = dict(zip(edges, labels, strict=True))
    per_row = min(MAX_POINTS_PER_SERIES, max(1, MAX_CELLS // max(len(edges), 1)))
    buckets = buckets_for(counts, domain=domain, max_points=per_row)
    data = compact(
        counts.group_by(bucket_start("minute_ts", buckets).alias("bucket"), "le")
        .agg(pl.col("count").sum())
        .with_columns(share=pl.col("count") / pl.col("count").sum().over("bucket"))
        .filter(pl.col("share").is_finite())
        .select(
            *bucket_span(buckets.width_s),
            pl.col("le").replace_strict(label_of, return_dtype=pl.String).alias("band"),
            "count",
            "share",
        )
        .sort("ts", "band")
    )
    named = [edge_text(e) for e in edges if not math.isinf(e)]
    shown = ", ".join(named[:MAX_EDGES_NAMED]) + (" ..." if len(named) > MAX_EDGES_NAMED else "")
    return time_heatmap(
        data,
        y=alt.Y("band:O", title=f"{stat.value} bucket", sort=list(reversed(labels))),
        color=alt.Color(
            "share:Q",
            title="share of observations (%)",
            scale=alt.Scale(domain=[0, 1], scheme="blues"),
            legend=alt.Legend(format=".0%"),
        ),
        tooltip=[
            alt.Tooltip("band:N", title="bucket"),
            alt.Tooltip("count:Q", title="observations", format=",.0f"),
            alt.Tooltip("share:Q", title="share", format=".1%"),
        ],
        domain=domain,
        height_px=max(60, ROW_PX * len(edges)),
    ).properties(
        title=alt.TitleParams(
            f"{stat.title}: {len(edges)} buckets per {buckets.label}",
            subtitle=[f"Bucket edges: {shown}, +Inf."],
            fontSize=11,
        ),
    )


def latency_heatmap_chart(
    frame: pl.DataFrame | pl.LazyFrame, *, domain: TimeDomain | None = None
) -> Any:
    rows = LATENCY_BUCKETS_CONTRACT.select(frame)
    stats = [s for s in LatencyStat if s.value in set(rows["stat"].to_list())]
    if not stats:
        raise ValueError("latency heatmap: no histogram buckets of ttft, tpot, itl or e2e")
    panels = [_panel(rows.filter(pl.col("stat") == s.value), s, domain=domain) for s in stats]
    subtitle = [
        (
            "vLLM's latency histograms per bucket: each cell the share of the observations "
            "(requests; tokens for ITL) of its time bucket that fell between the row's edges, "
            "summed over replicas."
        ),
        (
            "A histogram percentile is only known to lie inside its bucket: histogram_quantile "
            "interpolates between the bucket's edges (the top finite edge when it falls in "
            "+Inf), which is why the percentile lines, ITL's p90 to p99 above all, sit on or "
            "next to these edges."
        ),
    ]
    chart = alt.vconcat(*panels).resolve_scale(color="shared", x="shared")
    return titled(chart, title="Latency histograms", subtitle=subtitle)
