"""Load balance: each replica's share of the fleet's requests and output tokens over time.

A router that spreads load evenly gives each of n replicas about 1/n; a replica drawing far
more (sticky sessions, prefix affinity) or far less (drained, slow to answer) stands out as a
row of another colour. Input is `request_minutes` (traced requests per replica and the minute
they finished). Shares are computed per bucket from counts (a replica's requests over the
fleet's), never as a mean of per-minute shares. The subtitle names the skew: the largest share
over the even share, over the window.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, REPLICA, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import MAX_POINTS_PER_SERIES, bucket_start, buckets_for
from servewatch.dashboards.panel import (
    ROW_PX,
    TimeDomain,
    bucket_span,
    compact,
    natural_order,
    time_heatmap,
    titled,
)

MAX_CELLS = 20_000
MEASURES = (("requests", "requests"), ("completion_tokens", "output tokens"))

LOAD_CONTRACT = FrameContract(
    "load balance",
    (
        MINUTE_TS,
        REPLICA,
        Column("requests", ColumnKind.NUMBER, "requests that finished in the minute"),
        Column("completion_tokens", ColumnKind.NUMBER, "their output tokens"),
    ),
)


def window_shares(rows: pl.DataFrame) -> pl.DataFrame:
    """Per replica over the whole window: requests_share and tokens_share (0-1)."""
    return (
        rows.group_by("replica")
        .agg(pl.col("requests").sum(), pl.col("completion_tokens").sum())
        .select(
            "replica",
            requests_share=pl.col("requests") / pl.col("requests").sum(),
            tokens_share=pl.col("completion_tokens") / pl.col("completion_tokens").sum(),
        )
    )


def _panel(
    rows: pl.DataFrame,
    column: str,
    label: str,
    *,
    replicas: list[str],
    domain: TimeDomain | None,
) -> Any:
    per_row = min(MAX_POINTS_PER_SERIES, max(1, MAX_CELLS // max(len(replicas), 1)))
    buckets = buckets_for(rows, domain=domain, max_points=per_row)
    even = 1.0 / len(replicas)
    data = compact(
        rows.group_by(bucket_start("minute_ts", buckets).alias("bucket"), "replica")
        .agg(pl.col(column).sum().alias("count"))
        .with_columns(share=pl.col("count") / pl.col("count").sum().over("bucket"))
        .filter(pl.col("share").is_finite())
        .select(
            *bucket_span(buckets.width_s),
            "replica",
            "count",
            "share",
            vs_even=pl.col("share") / even,
        )
        .sort("replica", "ts")
    )
    return time_heatmap(
        data,
        y=alt.Y("replica:N", title="replica", sort=replicas),
        color=alt.Color(
            "vs_even:Q",
            title=f"share of {label} / even share",
            scale=alt.Scale(domain=[0, 1, 2], range=["#2166ac", "#f7f7f7", "#b2182b"]),
            legend=alt.Legend(format=".1f"),
        ),
        tooltip=[
            alt.Tooltip("replica:N"),
            alt.Tooltip("count:Q", title=label, format=",.0f"),
            alt.Tooltip("share:Q", title="share of the fleet", format=".1%"),
            alt.Tooltip("vs_even:Q", title="x even share", format=".2f"),
        ],
        domain=domain,
        height_px=max(60, ROW_PX * len(replicas)),
    ).properties(
        title=alt.TitleParams(f"Share of {label} per {buckets.label}", fontSize=11),
    )


def load_balance_chart(
    frame: pl.DataFrame | pl.LazyFrame, *, domain: TimeDomain | None = None
) -> Any:
    rows = LOAD_CONTRACT.select(frame).filter(pl.col("replica").is_not_null())
    replicas = natural_order(rows["replica"].to_list())
    if not replicas:
        raise ValueError("load balance: no replica finished a request in the window")
    shares = window_shares(rows)
    top = shares.sort("requests_share", "replica", descending=[True, False]).row(0, named=True)
    even = 1.0 / len(replicas)
    subtitle = [
        (
            f"Each replica's share of the fleet's finished requests and output tokens, over the "
            f"even share 1/{len(replicas)} (white: even; red: more; blue: less), from traced "
            "requests by the minute they finished."
        ),
        (
            f"Over the window the busiest replica, {top['replica']}, took "
            f"{top['requests_share']:.1%} of requests ({top['requests_share'] / even:.2f}x even)."
        ),
    ]
    panels = [
        _panel(rows, column, label, replicas=replicas, domain=domain) for column, label in MEASURES
    ]
    chart = alt.vconcat(*panels).resolve_scale(x="shared", color="independent")
    return titled(chart, title="Load balance across replicas", subtitle=subtitle)
