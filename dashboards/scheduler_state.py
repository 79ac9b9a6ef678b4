"""Scheduler state: requests running and waiting across the fleet, and preemptions.

Input is per replica and minute: the mean of vLLM's `num_requests_running` and
`num_requests_waiting` gauges over the minute (and, when given, the minute's increase of
`num_preemptions_total`). The fleet line is the sum over replicas; a downsampled bucket keeps
the mean of its minutes for the gauges and the total for preemptions.
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
    WIDTH_PX,
    TimeDomain,
    compact,
    data_chart,
    epoch_ms,
    series_lines,
    time_tooltip,
    time_x,
    titled,
)

SCHEDULER_CONTRACT = FrameContract(
    "scheduler state chart",
    (
        MINUTE_TS,
        REPLICA,
        Column("running_requests", ColumnKind.NUMBER, "mean requests running in the minute"),
        Column("waiting_requests", ColumnKind.NUMBER, "mean requests waiting in the minute"),
    ),
    optional=(
        Column("preemptions", ColumnKind.NUMBER, "preemptions in the minute (counter increase)"),
    ),
)


def scheduler_state_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    """Fleet running and waiting requests; below, preemptions per minute when given."""
    rows = SCHEDULER_CONTRACT.select(frame)
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    # Minutes holding only a preemption count (no gauge sample) are no zero in the lines.
    fleet = (
        rows.filter(pl.col("running_requests").is_not_null())
        .group_by("minute_ts")
        .agg(running=pl.col("running_requests").sum(), waiting=pl.col("waiting_requests").sum())
    )
    data = compact(
        fleet.group_by(bucket_start("minute_ts", buckets).alias("bucket"))
        .agg(Reduction.MEAN.expr("running"), Reduction.MEAN.expr("waiting"))
        .unpivot(index="bucket", variable_name="state", value_name="requests")
        .select(epoch_ms("bucket").alias("ts"), "state", "requests")
        .sort("ts", "state")
    )
    replicas = rows["replica"].n_unique()
    state = series_lines(
        data,
        y="requests",
        y_title="requests (fleet total)",
        color="state",
        color_title="state",
        domain=domain,
        order=["running", "waiting"],
        value_format=",.1f",
        points=buckets.minutes <= 30,
    ).properties(width=WIDTH_PX, height=HEIGHT_PX)
    subtitle = [
        (
            f"Requests running and waiting, summed over {replicas} replicas, per {buckets.label} "
            "(mean of each minute's gauge)."
        ),
        buckets.note(Reduction.MEAN),
    ]
    chart: Any = state
    if "preemptions" in rows.columns:
        preempted = compact(
            rows.group_by(bucket_start("minute_ts", buckets).alias("bucket"))
            .agg(pl.col("preemptions").sum())
            .select(epoch_ms("bucket").alias("ts"), "preemptions")
            .sort("ts")
        )
        bars = (
            data_chart(preempted)
            .mark_bar(color="#e45756")
            .encode(
                time_x(domain=domain),
                alt.Y("preemptions:Q", title=f"preemptions (count per {buckets.label})"),
                tooltip=[time_tooltip(), alt.Tooltip("preemptions:Q", format=",.0f")],
            )
            .properties(width=WIDTH_PX, height=HEIGHT_PX // 3)
        )
        chart = alt.vconcat(state, bars)
        subtitle.append(f"Bars: preemptions per {buckets.label}, all replicas.")
    return titled(chart, title="Scheduler state", subtitle=[s for s in subtitle if s])
