"""Family SLIs: any stored metric family, catalogued or not, read over a window as PromQL would.

Every sample a page carries is stored (docs/catalogues.md), so a user can ask about a family no
catalogue knows: `servewatch sli --metric NAME`. The store keeps no metric type for such a
family, so its shape is told from its sample names, as a Prometheus user reads a page: a family
with `_bucket` series is a histogram (its quantiles from `sum by (group, le)
(increase(x_bucket[w]))`), one with a `_total` series (or named by it) a counter (`sum by (group)
(increase(x[w]))`, and that over the window's seconds), any other a gauge (the mean and the
maximum of its samples in the window). `NAME` is the family as stored: the exposed name for an
uncatalogued family, the canonical one (e.g. `vllm:num_requests_running`) for a catalogued one.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import polars as pl

from servewatch.pipeline.metric_sli import (
    QUANTILES,
    Scope,
    attributed,
    series_counter_sums,
    series_gauge_stats,
    series_increases,
)
from servewatch.pipeline.promql import histogram_quantile_frame


class FamilyShape(StrEnum):
    HISTOGRAM = "histogram"
    COUNTER = "counter"
    GAUGE = "gauge"


def family_series(dimensions: pl.LazyFrame, *, family: str) -> pl.LazyFrame:
    """The series of `family`: the family name itself and its sample suffixes."""
    names = [family, *(family + suffix for suffix in ("_bucket", "_sum", "_count", "_total"))]
    return attributed(dimensions).filter(pl.col("metric").is_in(names))


def family_shape(metrics: Sequence[str], *, family: str) -> FamilyShape | None:
    """The shape the family's stored sample names show; None when it has no series."""
    if family + "_bucket" in metrics:
        return FamilyShape.HISTOGRAM
    # A counter named by its family or by its sample (`x_total`, as the page wrote it).
    if family + "_total" in metrics or (family.endswith("_total") and family in metrics):
        return FamilyShape.COUNTER
    if family in metrics:
        return FamilyShape.GAUGE
    return None


def family_frame(
    points: pl.LazyFrame,
    series: pl.LazyFrame,
    *,
    family: str,
    shape: FamilyShape,
    range_s: float,
    window_end_s: float,
    scope: Scope,
) -> pl.LazyFrame:
    """One row per group over the window ending at `window_end_s`: for a histogram
    `p50`..`p99` and `observations`, for a counter `increase` and `per_s`, for a gauge
    `mean`, `max` and `samples`. `series` is `family_series`."""
    by = scope.columns
    ends = [window_end_s]
    if shape is FamilyShape.HISTOGRAM:
        buckets = series.filter(
            (pl.col("metric") == family + "_bucket") & pl.col("le").is_not_null()
        )
        summed = (
            series_increases(points, buckets, range_s=range_s, window_ends_s=ends)
            .group_by(*by, "window_end_s", "le")
            .agg(pl.col("increase").sum())
        )
        keys = [*by, "window_end_s"]
        out = (
            summed.filter(pl.col("le") == float("inf"))
            .group_by(keys)
            .agg(observations=pl.col("increase").sum())
        )
        for p, q in QUANTILES:
            quantile = histogram_quantile_frame(
                summed, q=q, by=keys, count_column="increase", value_column=f"p{p}"
            )
            out = out.join(quantile, on=keys, how="left", nulls_equal=True)
        return out.drop("window_end_s").sort(by, nulls_last=True)
    if shape is FamilyShape.COUNTER:
        counters = series.filter(pl.col("metric").is_in([family + "_total", family]))
        return (
            series_counter_sums(
                points, counters, range_s=range_s, window_ends_s=ends, by=[*by, "window_end_s"]
            )
            .with_columns(per_s=pl.col("increase") / range_s)
            .select(*by, "increase", "per_s")
        )
    gauges = series.filter(pl.col("metric") == family)
    return series_gauge_stats(
        points, gauges, range_s=range_s, window_ends_s=ends, scope=scope
    ).select(*by, "mean", "max", "samples")
