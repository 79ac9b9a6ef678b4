"""SLO events per minute counted from vLLM's own metrics, for SLOs whose source is metrics.

A latency SLO with threshold T counts good = increase of the `le="T"` bucket and total =
increase of the histogram's `_count`; availability counts total = increase of
`request_success_total` over all finished reasons and good = total minus the `error` ones.
Counts are reset-corrected increments between consecutive samples, attributed to the minute the
later sample closes (a sample at 12:00:00 closes the minute 11:59, one at 12:00:20 the minute
12:00), so an evaluation at 12:00 counts the sample taken at 12:00 as PromQL's range selectors
do, summed per replica, pool and model: exactly additive over any window whatever
the scrape interval (PromQL's extrapolated `increase(x[1m])` is neither additive nor defined
when scrapes are more than a minute apart), and in the shape of the trace-counted
`slo_minutes`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import polars as pl

from servewatch.pipeline.metric_sli import counter_deltas
from servewatch.pipeline.signals import Signal
from servewatch.pipeline.tables import SLO_MINUTES_SCHEMA

MINUTE_S = 60.0
_GROUP = ("replica", "pool", "model")


@dataclass(frozen=True)
class MetricCriterion:
    """Good events of one SLO from metrics: a latency histogram bucket, or (no signal)
    requests vLLM finished without an error."""

    name: str
    histogram: Signal | None = None
    threshold_s: float | None = None


def minute_ends_s(start: datetime, end: datetime) -> list[float]:
    """Ends of the whole minutes in [start, end), as epoch seconds (naive times are UTC)."""
    first = math.ceil(start.replace(tzinfo=UTC).timestamp() / MINUTE_S) * MINUTE_S + MINUTE_S
    last = math.floor(end.replace(tzinfo=UTC).timestamp() / MINUTE_S) * MINUTE_S
    count = int((last - first) // MINUTE_S) + 1
    return [first + i * MINUTE_S for i in range(max(count, 0))]


def _per_minute(points: pl.LazyFrame, chosen: pl.LazyFrame, *, name: str) -> pl.LazyFrame:
    closed = (pl.col("ts") - timedelta(microseconds=1)).dt.truncate("1m")
    return (
        counter_deltas(points, chosen.select("series_id", *_GROUP))
        .with_columns(minute_ts=closed)
        .group_by("minute_ts", *_GROUP)
        .agg(pl.col("delta").sum().alias(name))
    )


def metric_slo_minutes(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    criteria: Sequence[MetricCriterion],
    start: datetime,
    end: datetime,
) -> pl.LazyFrame:
    """`slo_minutes`-shaped rows (good and total rounded to whole events) for each criterion.

    `dimensions` is `pipeline.metric_sli.series_dimensions(...)`.
    """
    frames = []
    for criterion in criteria:
        signal = dimensions.filter(
            pl.col("signal") == (criterion.histogram or Signal.REQUESTS_FINISHED).value
        )
        if criterion.histogram is not None:
            total = _per_minute(
                points,
                signal.filter(pl.col("metric").str.ends_with("_count")),
                name="total",
            )
            good = _per_minute(
                points,
                signal.filter(pl.col("le") == criterion.threshold_s),
                name="good",
            )
        else:
            total = _per_minute(points, signal, name="total")
            bad = _per_minute(
                points,
                signal.filter(pl.col("finished_reason") == "error"),
                name="bad",
            )
            good = total.join(bad, on=["minute_ts", *_GROUP], how="left", nulls_equal=True).select(
                "minute_ts", *_GROUP, good=pl.col("total") - pl.col("bad").fill_null(0.0)
            )
        frames.append(
            total.join(good, on=["minute_ts", *_GROUP], how="left", nulls_equal=True).with_columns(
                slo=pl.lit(criterion.name)
            )
        )
    if not frames:
        return pl.LazyFrame(schema=SLO_MINUTES_SCHEMA)
    return (
        pl.concat(frames)
        .with_columns(
            good=pl.col("good").fill_null(0.0).round().cast(pl.Int64),
            total=pl.col("total").round().cast(pl.Int64),
            tenant=pl.lit(None, dtype=pl.String),
            # vLLM's counters do not say whose tokens met a latency limit.
            good_output_tokens=pl.lit(None, dtype=pl.Int64),
            output_tokens=pl.lit(None, dtype=pl.Int64),
            adapter=pl.lit(None, dtype=pl.String),
        )
        .filter((pl.col("minute_ts") >= start) & (pl.col("minute_ts") < end))
        .select(SLO_MINUTES_SCHEMA.names())
        .sort("slo", "minute_ts", "replica", nulls_last=True)
    )


def metric_slo_series(
    dimensions: pl.LazyFrame, *, criteria: Sequence[MetricCriterion]
) -> pl.LazyFrame:
    """The series each criterion reads, with their role: "total" (the histogram's `_count`,
    or every finished reason), "good" (the bucket at the threshold) or "bad" (error
    finishes). Columns: series_id, slo, role, replica, pool, model."""
    frames: list[pl.LazyFrame] = []
    for criterion in criteria:
        signal = dimensions.filter(
            pl.col("signal") == (criterion.histogram or Signal.REQUESTS_FINISHED).value
        )
        if criterion.histogram is not None:
            parts = [
                ("total", signal.filter(pl.col("metric").str.ends_with("_count"))),
                ("good", signal.filter(pl.col("le") == criterion.threshold_s)),
            ]
        else:
            parts = [
                ("total", signal),
                ("bad", signal.filter(pl.col("finished_reason") == "error")),
            ]
        frames.extend(
            chosen.select(
                "series_id", *_GROUP, slo=pl.lit(criterion.name), role=pl.lit(role)
            ).unique()
            for role, chosen in parts
        )
    schema = {"series_id": pl.Int32(), "slo": pl.String(), "role": pl.String()}
    if not frames:
        return pl.LazyFrame(schema={**schema, **dict.fromkeys(_GROUP, pl.String())})
    combined: pl.LazyFrame = pl.concat(frames, how="diagonal_relaxed")
    return combined.select("series_id", "slo", "role", *_GROUP)
