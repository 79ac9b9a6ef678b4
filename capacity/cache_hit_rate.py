"""Cache hit rate: how stable the prefix-cache hit ratio is, across windows of the fleet's history.

Prefill demand scales with (1 - hit ratio), so the sizing depends on it, and it is not a property
of the workload alone: it falls whenever the router loses affinity (a restart, a rollout, a moved
hash ring). Its spread across windows (p10 to p90 of the hourly ratio, say) is its observed range
for the risk analysis. A window's ratio is increase(hits) / increase(queries) summed over the
window (additive counts, never a mean of minute ratios and never the lifetime ratio).

Input: additive per-minute counts, one row per replica and minute, with the window timestamp
and the hit and query token counts (the canonical prefix-cache signals by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from servewatch.capacity.figure import Figure, fmt, measured
from servewatch.pipeline.signals import Signal

HITS = Signal.PREFIX_CACHE_HITS_TOKENS.value
QUERIES = Signal.PREFIX_CACHE_QUERIES_TOKENS.value


@dataclass(frozen=True)
class HitRatioSpread:
    p10_ratio: float
    p50_ratio: float
    p90_ratio: float
    windows: int
    every: str
    data: str

    @property
    def spread_ratio(self) -> float:
        return self.p90_ratio - self.p10_ratio

    def figure(self) -> Figure:
        """The median window's ratio, ranged over p10 to p90."""
        return measured(
            self.p50_ratio,
            "ratio",
            f"prefix-cache hits / queries per {self.every} window, median of {self.windows} "
            f"windows ({self.data})",
            low=self.p10_ratio,
            high=self.p90_ratio,
        )

    def summary(self) -> str:
        return (
            f"hit ratio per {self.every}: p10 {fmt(self.p10_ratio)}, p50 {fmt(self.p50_ratio)}, "
            f"p90 {fmt(self.p90_ratio)} over {self.windows} windows ({self.data})"
        )


def hit_ratio_by_window(
    minutes: pl.LazyFrame,
    *,
    every: str,
    ts_column: str = "minute_ts",
    hits_column: str = HITS,
    queries_column: str = QUERIES,
) -> pl.LazyFrame:
    """One row per window with queries: `window_ts`, summed hits and queries, `hit_ratio`."""
    return (
        minutes.group_by(pl.col(ts_column).dt.truncate(every).alias("window_ts"))
        .agg(
            pl.col(hits_column).cast(pl.Float64).sum().alias("hits"),
            pl.col(queries_column).cast(pl.Float64).sum().alias("queries"),
        )
        .filter(pl.col("queries") > 0)
        .with_columns(hit_ratio=pl.col("hits") / pl.col("queries"))
        .sort("window_ts")
    )


def hit_ratio_quantiles(windows: pl.LazyFrame) -> pl.LazyFrame:
    """One row: p10, p50 and p90 of the windowed ratio, and the number of windows."""
    ratio = pl.col("hit_ratio")
    return windows.select(
        p10_ratio=ratio.quantile(0.1, interpolation="linear"),
        p50_ratio=ratio.quantile(0.5, interpolation="linear"),
        p90_ratio=ratio.quantile(0.9, interpolation="linear"),
        windows=pl.len(),
    )


def observe_hit_ratio(
    minutes: pl.LazyFrame, *, every: str, data: str, ts_column: str = "minute_ts"
) -> HitRatioSpread:
    """Collect the spread; `data` names what the frame holds (fleet, dates) for the record."""
    row = (
        minutes.pipe(hit_ratio_by_window, every=every, ts_column=ts_column)
        .pipe(hit_ratio_quantiles)
        .collect()
        .row(0, named=True)
    )
    if row["windows"] < 2:
        raise ValueError(
            f"cache hit ratio on {data}: {row['windows']} window(s) of {every} with queries; "
            "a spread needs at least 2"
        )
    return HitRatioSpread(
        p10_ratio=row["p10_ratio"],
        p50_ratio=row["p50_ratio"],
        p90_ratio=row["p90_ratio"],
        windows=row["windows"],
        every=every,
        data=data,
    )
