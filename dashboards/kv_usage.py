"""KV-cache usage per replica: a heatmap of replicas against time.

Input is per replica and minute, the mean of vLLM's `kv_cache_usage_perc` gauge (a ratio 0-1
of KV blocks in use; it drops to about 0 when a replica idles, since cached but unreferenced
blocks count as free). A heatmap keeps every replica visible at fleet scale where 45 lines would
not; the number of cells is bounded, so a long window or a large fleet gets wider buckets.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, REPLICA, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import (
    MAX_POINTS_PER_SERIES,
    Reduction,
    bucket_start,
    buckets_for,
)
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    ROW_PX,
    TimeDomain,
    bucket_span,
    compact,
    natural_order,
    time_heatmap,
    titled,
)

# Cells of a heatmap: 45 replicas x 288 five-minute buckets fit; far more bloats the page.
MAX_CELLS = 20_000

KV_USAGE_CONTRACT = FrameContract(
    "KV-cache usage heatmap",
    (
        MINUTE_TS,
        REPLICA,
        Column("kv_cache_usage_ratio", ColumnKind.NUMBER, "mean KV blocks in use, ratio 0-1"),
    ),
)


def kv_usage_heatmap(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    domain: TimeDomain | None = None,
    max_cells: int = MAX_CELLS,
) -> Any:
    rows = KV_USAGE_CONTRACT.select(frame)
    replicas = natural_order(rows["replica"].to_list())
    per_row = min(MAX_POINTS_PER_SERIES, max(1, max_cells // max(len(replicas), 1)))
    buckets = buckets_for(rows, domain=domain, max_points=per_row)
    reduction = Reduction.MEAN
    data = compact(
        rows.group_by(bucket_start("minute_ts", buckets).alias("bucket"), "replica")
        .agg(reduction.expr("kv_cache_usage_ratio"))
        .select(*bucket_span(buckets.width_s), "replica", "kv_cache_usage_ratio")
        .sort("replica", "ts")
    )
    heat = time_heatmap(
        data,
        y=alt.Y("replica:N", title="replica", sort=replicas),
        color=alt.Color(
            "kv_cache_usage_ratio:Q",
            title="KV usage (%)",
            scale=alt.Scale(domain=[0, 1], scheme="viridis"),
            legend=alt.Legend(format=".0%"),
        ),
        tooltip=[
            alt.Tooltip("replica:N"),
            alt.Tooltip("kv_cache_usage_ratio:Q", title="KV usage", format=".1%"),
        ],
        domain=domain,
        height_px=max(HEIGHT_PX, ROW_PX * len(replicas)),
    )
    subtitle = [
        (
            f"Share of KV-cache blocks in use per replica and {buckets.label} "
            "(0 % when idle: cached but unreferenced blocks count as free)."
        ),
        buckets.note(reduction),
    ]
    return titled(heat, title="KV-cache usage per replica", subtitle=[s for s in subtitle if s])
