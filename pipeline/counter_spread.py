"""Counter spread: a counter's increases spread evenly over the time between their two samples,
then summed per minute.

Filing each increase under the minute of its later sample (`metric_sli.counter_deltas`) is
exact for totals but not for rates drawn over time: with a 2-minute scrape interval every other
minute holds twice the tokens and the next holds none, and 5-minute buckets hold two or three
increases in turn, a sawtooth of the scrape schedule rather than of the traffic. Spreading an
increase over its interval assumes a constant rate between the two samples (what PromQL's
`rate` assumes too) and keeps every total: a minute's share is the increase times the part of
the interval that falls in it, so the minutes of any window still add up to the increases whose
intervals lie inside it.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from servewatch.pipeline.metric_sli import counter_deltas

# A pause longer than this between two samples is a gap, not a rate: its increase is filed
# under the minute of the later sample, as `counter_deltas` files every increase.
MAX_SPREAD_S = 3600.0
_MINUTE = "1m"


def spread_increases(deltas: pl.LazyFrame, *, by: Sequence[str], name: str) -> pl.LazyFrame:
    """Per minute and `by` columns, the sum of each increase's share of that minute.

    `deltas` holds one increase per row: `ts` (its later sample), `prev_ts` (its earlier one)
    and `delta`. Columns out: minute_ts, `by`, `name`."""
    span_s = (pl.col("ts") - pl.col("prev_ts")).dt.total_microseconds() / 1e6
    spread = span_s.is_between(0.0, MAX_SPREAD_S, closed="right")
    start = (
        pl.when(spread)
        .then(pl.col("prev_ts"))
        .otherwise(pl.col("ts") - pl.duration(milliseconds=1))
    )
    first_minute = start.dt.truncate(_MINUTE)
    # The minute holding the later sample's instant, exclusive: an increase ending exactly at a
    # minute boundary belongs to the minute before it.
    last_minute = (pl.col("ts") - pl.duration(milliseconds=1)).dt.truncate(_MINUTE)
    minute_end = pl.col("minute_ts") + pl.duration(minutes=1)
    overlap_s = (
        pl.min_horizontal(pl.col("ts"), minute_end) - pl.max_horizontal("start", "minute_ts")
    ).dt.total_microseconds() / 1e6
    whole_s = (pl.col("ts") - pl.col("start")).dt.total_microseconds() / 1e6
    return (
        deltas.with_columns(start=start)
        .with_columns(minute_ts=pl.datetime_ranges(first_minute, last_minute, interval=_MINUTE))
        .explode("minute_ts")
        .with_columns(share=pl.col("delta") * overlap_s / whole_s)
        .group_by("minute_ts", *by)
        .agg(pl.col("share").sum().alias(name))
    )


def spread_counter_minutes(
    points: pl.LazyFrame, chosen: pl.LazyFrame, *, by: Sequence[str], name: str
) -> pl.LazyFrame:
    """The chosen counter series' reset-corrected increases (`counter_deltas`), each spread
    over the time since the series' previous sample, summed per minute and `by` columns."""
    previous_ts = pl.col("ts").shift(1).over("series_id", order_by="ts")
    timed = points.with_columns(prev_ts=previous_ts)
    deltas = counter_deltas(timed, chosen.select("series_id", *by)).with_columns(
        pl.col("ts").cast(pl.Datetime("us")), pl.col("prev_ts").cast(pl.Datetime("us"))
    )
    return spread_increases(deltas, by=by, name=name)
