"""Episodes: runs of flagged minutes that the fleet-health detectors report as one finding,
and the small statistics their confidences rest on.

A run tolerates short gaps (a noisy minute in the middle of a real episode does not split it)
and must hold a minimum number of flagged minutes (a noisy minute alone does not make one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

import polars as pl

MINUTE = timedelta(minutes=1)


def flagged_episodes(
    minutes: pl.LazyFrame,
    *,
    by: Sequence[str],
    flag: str,
    max_gap_minutes: int,
    min_minutes: int,
) -> pl.LazyFrame:
    """Runs of minutes where `flag` is true, per `by` group, with gaps of up to
    `max_gap_minutes` unflagged minutes bridged; runs with fewer than `min_minutes` flagged
    minutes are dropped. Columns: `by`, episode (0, 1, ... per group), start, end (the end of
    the last flagged minute), flagged_minutes."""
    keys = list(by)
    gap = pl.duration(minutes=max_gap_minutes + 1)
    previous = pl.col("minute_ts").shift(1).over(keys, order_by="minute_ts")
    return (
        minutes.filter(pl.col(flag).fill_null(value=False))
        .select(*keys, "minute_ts")
        .unique()
        .with_columns(
            _new=(previous.is_null() | (pl.col("minute_ts") - previous > gap)).cast(pl.Int32)
        )
        .with_columns(
            episode=pl.col("_new").cum_sum().over(keys, order_by="minute_ts") - 1,
        )
        .group_by(*keys, "episode")
        .agg(
            start=pl.col("minute_ts").min(),
            end=pl.col("minute_ts").max() + pl.duration(minutes=1),
            flagged_minutes=pl.len(),
        )
        .filter(pl.col("flagged_minutes") >= min_minutes)
        .sort(*keys, "episode")
    )


def episode_end(end: datetime, *, window_end: datetime, max_gap_minutes: int) -> datetime | None:
    """None (ongoing) when the episode reaches to within its gap tolerance of the window's
    end: nothing in the data says it is over."""
    return None if end + max_gap_minutes * MINUTE >= window_end else end


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    p = min(max(p, 0.0), 1.0)
    return min(1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))
