"""Per-replica minute frames for the fleet-health detectors: gauge means and maxima, counter
increments and latency-histogram quantiles, each by replica and minute, with the replica's pool.

Everything is bucketed the way `pipeline.metric_sli.counter_minutes` buckets counters: a
sample belongs to the minute it was taken in (`ts` truncated to the minute), so gauges,
counters and quantiles of one replica-minute describe the same samples. A histogram's exact
mean per minute (the increase of its `_sum` over that of its `_count`) is there beside its
interpolated quantiles: within one of vLLM's coarse buckets a quantile is a guess, the mean
is not. Only minutes in
[start, end) are kept; a counter's first increment needs a sample before `start`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import polars as pl

from servewatch.pipeline.metric_sli import counter_minutes
from servewatch.pipeline.promql import histogram_quantile_frame
from servewatch.pipeline.signals import Signal

MINUTE = pl.duration(minutes=1)


def _in_window(frame: pl.LazyFrame, *, start: datetime, end: datetime) -> pl.LazyFrame:
    return frame.filter(
        (pl.col("minute_ts") >= start.replace(second=0, microsecond=0))
        & (pl.col("minute_ts") < end)
    )


def replica_pools(dimensions: pl.LazyFrame) -> pl.LazyFrame:
    """One row per engine replica: replica, pool, host, zone (pool "" when unknown)."""
    return (
        dimensions.filter(pl.col("replica").is_not_null())
        .group_by("replica")
        .agg(
            pl.col("pool").drop_nulls().first().fill_null(""),
            pl.col("host").drop_nulls().first(),
            pl.col("zone").drop_nulls().first(),
        )
        .sort("replica")
    )


def _replica_series(dimensions: pl.LazyFrame, signal: Signal) -> pl.LazyFrame:
    """The series of `signal` attributed to a replica."""
    return dimensions.filter((pl.col("signal") == signal.value) & pl.col("replica").is_not_null())


def gauge_minutes(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    signal: Signal,
    name: str,
    start: datetime,
    end: datetime,
) -> pl.LazyFrame:
    """Columns replica, minute_ts, `<name>_mean`, `<name>_max`: a gauge's samples per minute."""
    chosen = _replica_series(dimensions, signal).select("series_id", "replica")
    return (
        points.join(chosen, on="series_id", how="inner")
        .with_columns(minute_ts=pl.col("ts").dt.truncate("1m"))
        .group_by("replica", "minute_ts")
        .agg(
            pl.col("value").mean().alias(f"{name}_mean"),
            pl.col("value").max().alias(f"{name}_max"),
        )
        .pipe(_in_window, start=start, end=end)
    )


def counter_increase_minutes(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    signal: Signal,
    name: str,
    start: datetime,
    end: datetime,
    by_labels: Sequence[str] = (),
    metric_suffix: str | None = None,
) -> pl.LazyFrame:
    """Columns replica, `by_labels`, minute_ts, `name`: reset-corrected counter increments
    per minute. For a histogram signal give `metric_suffix` (`_count` or `_sum`)."""
    chosen = _replica_series(dimensions, signal)
    if metric_suffix is None:
        chosen = chosen.filter(pl.col("le").is_null())
    else:
        chosen = chosen.filter(pl.col("metric").str.ends_with(metric_suffix))
    by = ["replica", *by_labels]
    return counter_minutes(points, chosen, by=by, name=name).pipe(_in_window, start=start, end=end)


def quantile_minutes(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    signal: Signal,
    q: float,
    name: str,
    start: datetime,
    end: datetime,
) -> pl.LazyFrame:
    """Columns replica, minute_ts, `name`: the q-quantile of a latency histogram over each
    replica's observations of that minute (PromQL's histogram_quantile over the minute's
    bucket increments); minutes without observations are left out."""
    buckets = (
        _replica_series(dimensions, signal)
        .filter(pl.col("le").is_not_null())
        .select("series_id", "replica", "le")
    )
    summed = counter_minutes(points, buckets, by=["replica", "le"], name="delta")
    return (
        histogram_quantile_frame(summed, q=q, by=["replica", "minute_ts"], count_column="delta")
        .filter(pl.col("quantile").is_finite())
        .select("replica", "minute_ts", pl.col("quantile").alias(name))
        .pipe(_in_window, start=start, end=end)
    )


def histogram_mean_minutes(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    signal: Signal,
    name: str,
    count_name: str,
    start: datetime,
    end: datetime,
) -> pl.LazyFrame:
    """Columns replica, minute_ts, `count_name`, `name`: how many observations a histogram
    took in each replica-minute and their exact mean (the `_sum` increase over the `_count`
    increase); minutes without observations are left out."""
    total, count = (
        counter_increase_minutes(
            points,
            dimensions,
            signal=signal,
            name=column,
            metric_suffix=suffix,
            start=start,
            end=end,
        )
        for column, suffix in (("_total", "_sum"), (count_name, "_count"))
    )
    return (
        count.join(total, on=["replica", "minute_ts"], how="inner")
        .filter(pl.col(count_name) > 0)
        .with_columns((pl.col("_total") / pl.col(count_name)).alias(name))
        .drop("_total")
    )
