"""Episodes: runs of flagged minutes that the fleet-health detectors report as one finding,
and the small statistics their confidences rest on.

A run tolerates short gaps (a noisy minute in the middle of a real episode does not split it)
and must hold a minimum number of flagged minutes (a noisy minute alone does not make one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

import polars as pl

MINUTE = timedelta(minutes=1)
T = TypeVar("T")


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


# Terms of a binomial tail below this share of the running sum no longer change it.
_NEGLIGIBLE_TERM = 1e-17


def overlapping(
    spans: Iterable[T],
    *,
    start: Callable[[T], datetime],
    end: Callable[[T], datetime | None],
) -> list[list[T]]:
    """Spans grouped where their times overlap, chained (each overlaps an earlier one of its
    group), in order of start; an end of None is ongoing and reaches every later span."""
    groups: list[list[T]] = []
    reach = datetime.min
    for span in sorted(spans, key=start):
        if groups and start(span) < reach:
            groups[-1].append(span)
        else:
            groups.append([span])
            reach = datetime.min
        reach = max(reach, end(span) or datetime.max)
    return groups


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space so that thousands of requests a
    minute neither overflow `math.comb` nor underflow to 0 before the sum is done."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    log_n = math.lgamma(n + 1)

    def pmf(i: int) -> float:
        return math.exp(
            log_n - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
        )

    # Above the mode terms fall as i grows, below it as i shrinks: sum the side that starts at
    # k and stop once terms are negligible.
    if k > (n + 1) * p:
        total = 0.0
        for i in range(k, n + 1):
            term = pmf(i)
            total += term
            if term < _NEGLIGIBLE_TERM * total:
                break
        return min(1.0, total)
    below = 0.0
    for i in range(k - 1, -1, -1):
        term = pmf(i)
        below += term
        if term < _NEGLIGIBLE_TERM * below:
            break
    return min(1.0, max(0.0, 1.0 - below))


def binomial_tail_of(k: str, n: str, p: str) -> pl.Expr:
    """`binomial_tail` of each row's columns `k`, `n` (counts, rounded) and `p`."""
    return pl.struct(k, n, p).map_elements(
        lambda row: binomial_tail(round(row[k]), round(row[n]), row[p]),
        return_dtype=pl.Float64,
    )
