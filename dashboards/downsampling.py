"""Downsampling: per-minute rows reduced to time buckets so a day of a large fleet fits a page.

The bucket is the shortest of a fixed ladder (1 min, 2 min, 5 min, ... 1 day) that keeps each
series at or under a point budget; a fixed ladder keeps buckets on round clock times and the
same bucket for the same span. How values combine inside a bucket is part of what a chart
means, so each chart names its `Reduction` and the subtitle states both (`TimeBuckets.note`).
Counts are summed and turned into rates over the bucket, which stays exact; a gauge is averaged;
a percentile, which cannot be averaged, keeps the worst minute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

import polars as pl

from servewatch.dashboards.panel import TimeDomain, duration_label

MINUTE_S = 60
BUCKET_LADDER_S: tuple[int, ...] = (
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
)
# A line of 400 points is finer than the 640 px a chart is drawn at.
MAX_POINTS_PER_SERIES = 400


class Reduction(Enum):
    """How the per-minute values of one bucket become one value."""

    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    SUM = "sum"

    def expr(self, column: str) -> pl.Expr:
        col = pl.col(column)
        return {
            Reduction.MEAN: col.mean(),
            Reduction.MAX: col.max(),
            Reduction.MIN: col.min(),
            Reduction.SUM: col.sum(),
        }[self]

    @property
    def words(self) -> str:
        return {
            Reduction.MEAN: "mean of its minutes",
            Reduction.MAX: "highest of its minutes",
            Reduction.MIN: "lowest of its minutes",
            Reduction.SUM: "total over its minutes",
        }[self]


@dataclass(frozen=True)
class TimeBuckets:
    """Bucket width chosen for a span; `minutes` is how many minutes the span holds."""

    width_s: int
    minutes: int

    @property
    def downsampled(self) -> bool:
        return self.width_s > MINUTE_S

    @property
    def label(self) -> str:
        return "minute" if self.width_s == MINUTE_S else f"{duration_label(self.width_s)} bucket"

    def note(self, reduction: Reduction) -> str:
        """The subtitle sentence on downsampling ('' when each point is one minute)."""
        return self.note_with(reduction.words)

    def note_with(self, how: str) -> str:
        """As `note`, with the reduction said in the chart's own words."""
        if not self.downsampled:
            return ""
        buckets = math.ceil(self.minutes * MINUTE_S / self.width_s)
        return (
            f"Downsampled: {self.minutes:,} minutes into {buckets:,} buckets of "
            f"{duration_label(self.width_s)}, each the {how}."
        )


def choose_buckets(span_minutes: int, *, max_points: int = MAX_POINTS_PER_SERIES) -> TimeBuckets:
    """The shortest ladder width giving at most `max_points` buckets over the span."""
    if max_points < 1:
        raise ValueError(f"max_points is {max_points}; allowed: 1 or more")
    minutes = max(span_minutes, 1)
    for width_s in BUCKET_LADDER_S:
        if math.ceil(minutes * MINUTE_S / width_s) <= max_points:
            return TimeBuckets(width_s=width_s, minutes=minutes)
    return TimeBuckets(width_s=BUCKET_LADDER_S[-1], minutes=minutes)


def span_minutes(frame: pl.DataFrame, *, column: str, domain: TimeDomain | None) -> int:
    """Minutes covered: the report window when given, else first to last row inclusive."""
    if domain is not None:
        return max(1, math.ceil((domain[1] - domain[0]).total_seconds() / MINUTE_S))
    if frame.is_empty():
        return 1
    first, last = frame[column].min(), frame[column].max()
    assert isinstance(first, datetime)
    assert isinstance(last, datetime)
    return int((last - first).total_seconds() // MINUTE_S) + 1


def bucket_start(column: str, buckets: TimeBuckets) -> pl.Expr:
    """Start of each row's bucket (buckets aligned to the epoch, so on round clock times)."""
    return pl.col(column).dt.truncate(f"{buckets.width_s}s")


def buckets_for(
    frame: pl.DataFrame,
    *,
    column: str = "minute_ts",
    domain: TimeDomain | None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> TimeBuckets:
    return choose_buckets(span_minutes(frame, column=column, domain=domain), max_points=max_points)
