"""Token throughput: prompt and generation tokens per second for the fleet.

Input is token counts per minute (a counter's increases spread over their scrape intervals, as
`pipeline.counter_spread` does, or the tokens of the requests that finished in the minute, as
`request_minutes` holds them), optionally per replica. Counts add, so a bucket's rate is its
total over its length and downsampling changes nothing but the resolution. The subtitle names
the source and how its counts reached the minutes, since that is what decides whether a
bucket's rate follows the traffic or the scrape schedule.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, REPLICA, Column, ColumnKind, FrameContract
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

# How the metric frame counts tokens (pipeline.metric_frames), for the subtitle.
COUNTER_SOURCE = (
    "vLLM's prompt_tokens_total and generation_tokens_total counters, each increase spread "
    "evenly over the time between its two scrapes"
)
TRACES_SOURCE = "traced requests, each counted in the minute it finished"

THROUGHPUT_CONTRACT = FrameContract(
    "token throughput chart",
    (
        MINUTE_TS,
        Column("prompt_tokens", ColumnKind.NUMBER, "prompt tokens counted in the minute"),
        Column("generation_tokens", ColumnKind.NUMBER, "generated tokens counted in the minute"),
    ),
    optional=(REPLICA,),
)


def throughput_from_request_minutes(request_minutes: pl.LazyFrame) -> pl.LazyFrame:
    """The rollup's token counts (successful requests, by the minute they finished)."""
    return request_minutes.select(
        "minute_ts",
        "replica",
        "prompt_tokens",
        pl.col("completion_tokens").alias("generation_tokens"),
    )


def token_throughput_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    source: str = TRACES_SOURCE,
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    rows = THROUGHPUT_CONTRACT.select(frame)
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    data = compact(
        rows.group_by(bucket_start("minute_ts", buckets).alias("bucket"))
        .agg(
            prompt=pl.col("prompt_tokens").sum() / buckets.width_s,
            generation=pl.col("generation_tokens").sum() / buckets.width_s,
        )
        .unpivot(index="bucket", variable_name="tokens", value_name="tokens_per_s")
        .select(epoch_ms("bucket").alias("ts"), "tokens", "tokens_per_s")
        .sort("ts", "tokens")
    )
    lines = series_lines(
        data,
        y="tokens_per_s",
        y_title="throughput (tokens/s)",
        color="tokens",
        color_title="tokens",
        domain=domain,
        order=["prompt", "generation"],
        value_format=",.0f",
        points=buckets.minutes <= 30,
    )
    subtitle = [
        (
            f"Fleet tokens per second per {buckets.label}: tokens counted in it, summed over "
            f"replicas, / its length; from {source}."
        ),
        buckets.note_with("tokens in it / its length"),
    ]
    chart = lines.properties(width=WIDTH_PX, height=HEIGHT_PX)
    return titled(chart, title="Token throughput", subtitle=[s for s in subtitle if s])
