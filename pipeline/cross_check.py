"""The trace/histogram cross-check: the same percentile from both sources, per window.

Traces give exact per-request percentiles; vLLM's histograms give PromQL's interpolated ones,
which can only be trusted to within the bucket the value falls in. When the two differ by more
than that bucket's width, something is off: traces missing or sampled, spans from other
replicas, or a custom bucket layout. Such windows are flagged.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import polars as pl


def bucket_width(value: float, bounds: Sequence[float]) -> float:
    """Width of the bucket (previous bound, bound] holding `value`; inf past the last bound."""
    finite = sorted(b for b in bounds if math.isfinite(b))
    if not finite or math.isnan(value):
        return math.inf
    index = bisect.bisect_left(finite, value)
    if index >= len(finite):
        return math.inf
    lower = finite[index - 1] if index > 0 else 0.0
    return finite[index] - lower


def cross_check(
    traces: pl.LazyFrame, histograms: pl.LazyFrame, *, bounds: Sequence[float]
) -> pl.LazyFrame:
    """Join per-window percentiles (`window_end_s`, `trace_s`) and (`window_end_s`,
    `histogram_s`); flag windows whose difference exceeds the histogram value's bucket width."""
    widths = sorted(b for b in bounds if math.isfinite(b))
    return (
        traces.join(histograms, on="window_end_s", how="full", coalesce=True)
        .with_columns(
            bucket_width_s=pl.col("histogram_s").map_elements(
                lambda v: bucket_width(v, widths), return_dtype=pl.Float64
            ),
            difference_s=(pl.col("trace_s") - pl.col("histogram_s")).abs(),
        )
        .with_columns(
            diverges=pl.when(pl.col("trace_s").is_null() | pl.col("histogram_s").is_null())
            .then(None)
            .otherwise(pl.col("difference_s") > pl.col("bucket_width_s"))
        )
        .sort("window_end_s")
    )
