"""Prefix-cache hit rate: the share of prompt tokens served from the cache, fleet and spread.

Input is per replica and minute: the increase of vLLM's `prefix_cache_hits_total` and
`prefix_cache_queries_total` (both in tokens). The hit rate of any bucket is hits / queries
summed over it, never a mean of per-minute ratios (a quiet minute would weigh as much as a busy
one). The band spans the lowest to the highest replica in each bucket: a wide band is a router
that does not keep prefixes together.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, REPLICA, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import MAX_POINTS_PER_SERIES, bucket_start, buckets_for
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    WIDTH_PX,
    TimeDomain,
    compact,
    epoch_ms,
    inline_values,
    time_tooltip,
    time_x,
    titled,
)

PREFIX_CACHE_CONTRACT = FrameContract(
    "prefix-cache hit rate chart",
    (
        MINUTE_TS,
        REPLICA,
        Column("hits_tokens", ColumnKind.NUMBER, "prompt tokens found in the prefix cache"),
        Column("queries_tokens", ColumnKind.NUMBER, "prompt tokens looked up in the cache"),
    ),
)
LINE_COLOR = "#4c78a8"


def prefix_cache_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    rows = PREFIX_CACHE_CONTRACT.select(frame)
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    per_replica = (
        rows.group_by(bucket_start("minute_ts", buckets).alias("bucket"), "replica")
        .agg(pl.col("hits_tokens").sum(), pl.col("queries_tokens").sum())
        .with_columns(ratio=pl.col("hits_tokens") / pl.col("queries_tokens"))
    )
    data = compact(
        per_replica.group_by("bucket")
        .agg(
            fleet_hit_ratio=pl.col("hits_tokens").sum() / pl.col("queries_tokens").sum(),
            lowest_replica=pl.col("ratio").filter(pl.col("queries_tokens") > 0).min(),
            highest_replica=pl.col("ratio").filter(pl.col("queries_tokens") > 0).max(),
        )
        .filter(pl.col("fleet_hit_ratio").is_finite())
        .select(
            epoch_ms("bucket").alias("ts"), "fleet_hit_ratio", "lowest_replica", "highest_replica"
        )
        .sort("ts")
    )
    y = alt.Y(
        "fleet_hit_ratio:Q",
        title="hit rate (% of prompt tokens)",
        scale=alt.Scale(domain=[0, 1]),
        axis=alt.Axis(format=".0%"),
    )
    tooltip = [
        time_tooltip(),
        alt.Tooltip("fleet_hit_ratio:Q", title="fleet hit rate", format=".1%"),
        alt.Tooltip("lowest_replica:Q", title="lowest replica", format=".1%"),
        alt.Tooltip("highest_replica:Q", title="highest replica", format=".1%"),
    ]
    # One copy of the rows for both layers: they are set on the layer, not on each mark.
    base = alt.Chart().encode(time_x(domain=domain))
    band = base.mark_area(opacity=0.2, color=LINE_COLOR).encode(
        alt.Y("lowest_replica:Q", title="hit rate (% of prompt tokens)"),
        alt.Y2("highest_replica:Q"),
    )
    line = base.mark_line(color=LINE_COLOR, point=buckets.minutes <= 30).encode(y, tooltip=tooltip)
    replicas = rows["replica"].n_unique()
    subtitle = [
        (
            f"Fleet prefix-cache hit rate per {buckets.label} (hit tokens / queried tokens over "
            f"{replicas} replicas); band: lowest to highest replica."
        ),
        buckets.note_with("hits over queries summed in it (exact)"),
    ]
    chart = alt.layer(band, line, data=inline_values(data)).properties(
        width=WIDTH_PX, height=HEIGHT_PX
    )
    return titled(chart, title="Prefix-cache hit rate", subtitle=[s for s in subtitle if s])
