"""Counter increases over a window as Prometheus computes them, for the alert conditions of
SLOs counted from vLLM's metrics, so servewatch's evaluation and Prometheus' evaluation of
the rules servewatch generates agree at every minute.

PromQL's `increase(x[w])` at instant t (Prometheus 2.x) reads the samples in [t - w, t],
both ends included, sums their reset-corrected differences (a counter's first sample adds
nothing: its value is where it started, not an increase) and extrapolates the result from
the sampled interval toward both ends of the window: fully when the gap to the end is below
1.1 x the average sample spacing, else by half that spacing; toward the start never further
than the point where the counter would have been zero. A series needs two samples in the
window. Sums of these per-series increases are what `sum(rate(...))` divides.

Input samples: `series_id`, `slo`, `role` ("good", "total" or "bad"), `ts` (naive UTC),
`value`. Output: `slo.burn_rate.WINDOW_SUMS_SCHEMA` rows with float `good` and `total` (the
summed increases; `total` is what the low-traffic guard compares) and `error_ratio`, computed
from the summed rates in the same float operations as the generated rules, so the two sides
agree even where a ratio lands on its threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import polars as pl

from servewatch.slo.burn_rate import TIMESTAMP

SAMPLES_COLUMNS: tuple[str, ...] = ("series_id", "slo", "role", "ts", "value")
ROLES: tuple[str, ...] = ("good", "total", "bad")
# PromQL's default lookback: an instant selector sees a series whose last sample is at most
# this old; `absent()` holds once none is.
LOOKBACK_S = 300
_EXTRAPOLATION_THRESHOLD = 1.1


# One series may count for several SLOs and roles (an error series is both total and bad).
_KEY = ("series_id", "slo", "role")


def _indexed(samples: pl.LazyFrame) -> pl.LazyFrame:
    value = pl.col("value")
    previous = value.shift(1).over(_KEY, order_by="ts")
    delta = (
        pl.when(previous.is_null())
        .then(0.0)
        .when(value < previous)
        .then(value)
        .otherwise(value - previous)
    )
    return (
        samples.sort(*_KEY, "ts")
        .with_columns(delta=delta)
        .with_columns(
            cum=pl.col("delta").cum_sum().over(_KEY),
            index=pl.int_range(pl.len()).over(_KEY),
        )
        .select(*_KEY, "ts", "value", "cum", "index")
    )


def window_increases(
    samples: pl.LazyFrame,
    *,
    instants: Sequence[datetime],
    windows_s: Sequence[tuple[str, int]],
) -> pl.LazyFrame:
    """Per (at, slo, window_s): good and total as `sum(increase(...[window]))` would give them
    at each instant (bad events are subtracted from total to give good). `windows_s` lists the
    (slo, window_s) pairs wanted."""
    roles = samples.select("series_id", "slo", "role").unique()
    wanted = pl.LazyFrame(
        {"slo": [w[0] for w in windows_s], "window_s": [w[1] for w in windows_s]},
        schema={"slo": pl.String(), "window_s": pl.Int64()},
    )
    at = pl.LazyFrame({"at": list(instants)}, schema={"at": TIMESTAMP})
    queries = (
        roles.join(wanted, on="slo", how="inner")
        .join(at, how="cross")
        .with_columns(start=pl.col("at") - pl.duration(seconds=pl.col("window_s")))
    )
    indexed = _indexed(samples).with_columns(pl.col("ts").cast(TIMESTAMP))
    last = indexed.select(
        *_KEY,
        last_ts=pl.col("ts"),
        last_cum=pl.col("cum"),
        last_index=pl.col("index"),
        join_ts=pl.col("ts"),
    ).sort("join_ts")
    first = indexed.select(
        *_KEY,
        first_ts=pl.col("ts"),
        first_value=pl.col("value"),
        first_cum=pl.col("cum"),
        first_index=pl.col("index"),
        join_ts=pl.col("ts"),
    ).sort("join_ts")
    located = (
        queries.sort("at")
        .join_asof(
            last,
            left_on="at",
            right_on="join_ts",
            by=list(_KEY),
            strategy="backward",
            check_sortedness=False,
        )
        .drop("join_ts")
        .sort("start")
        .join_asof(
            first,
            left_on="start",
            right_on="join_ts",
            by=list(_KEY),
            strategy="forward",
            check_sortedness=False,
        )
        .drop("join_ts")
        .filter(pl.col("last_index") > pl.col("first_index"))
    )
    # Seconds from whole milliseconds, in Prometheus' order of float operations.
    result = pl.col("last_cum") - pl.col("first_cum")
    sampled = (pl.col("last_ts") - pl.col("first_ts")).dt.total_milliseconds() / 1000.0
    average = sampled / (pl.col("last_index") - pl.col("first_index"))
    to_start = (pl.col("first_ts") - pl.col("start")).dt.total_milliseconds() / 1000.0
    to_end = (pl.col("at") - pl.col("last_ts")).dt.total_milliseconds() / 1000.0
    to_zero = pl.col("sampled") * (pl.col("first_value") / pl.col("result"))
    threshold = pl.col("average") * _EXTRAPOLATION_THRESHOLD

    def edge(gap: pl.Expr) -> pl.Expr:
        return pl.when(gap < threshold).then(gap).otherwise(pl.col("average") / 2)

    increases = (
        located.with_columns(result=result, sampled=sampled, average=average, to_end=to_end)
        .with_columns(
            to_start=pl.when((pl.col("result") > 0) & (pl.col("first_value") >= 0))
            .then(pl.min_horizontal(to_start, to_zero))
            .otherwise(to_start)
        )
        .with_columns(
            increase=pl.col("result")
            * (
                (pl.col("sampled") + edge(pl.col("to_start")) + edge(pl.col("to_end")))
                / pl.col("sampled")
            )
        )
        .with_columns(rate=pl.col("increase") / pl.col("window_s").cast(pl.Float64))
        .group_by("at", "slo", "window_s")
        .agg(
            *[
                pl.col("increase").filter(pl.col("role") == role).sum().alias(role)
                for role in ROLES
            ],
            *[
                pl.col("rate").filter(pl.col("role") == role).sum().alias(f"{role}_rate")
                for role in ROLES
            ],
            *[(pl.col("role") == role).any().alias(f"has_{role}") for role in ROLES],
        )
    )
    # An SLO counts either good series (a latency bucket) or bad ones (error finishes); one
    # whose bad series has no samples in a window has no bad events there (`or vector(0)`).
    counts_bad = roles.group_by("slo").agg(counts_bad=(pl.col("role") == "bad").any())
    grid = wanted.join(at, how="cross").join(counts_bad, on="slo", how="left")
    total = pl.col("total").fill_null(0.0)
    has_total = pl.col("has_total").fill_null(value=False)
    # The ratio as the generated rules compute it: errors / total for availability (no error
    # series: 0), 1 - good / total for a latency bucket (no series: no ratio).
    error_ratio = (
        pl.when(~has_total)
        .then(None)
        .when(pl.col("counts_bad"))
        .then(
            pl.when(pl.col("has_bad")).then(pl.col("bad_rate")).otherwise(0.0)
            / pl.col("total_rate")
        )
        .when(pl.col("has_good").fill_null(value=False))
        .then(1 - pl.col("good_rate") / pl.col("total_rate"))
        .otherwise(None)
    )
    return (
        grid.join(increases, on=["at", "slo", "window_s"], how="left")
        .with_columns(
            good=pl.when(pl.col("counts_bad"))
            .then(total - pl.col("bad").fill_null(0.0))
            .otherwise(pl.col("good").fill_null(0.0)),
            total=total,
            error_ratio=error_ratio,
        )
        .select("at", "slo", "window_s", "good", "total", "error_ratio")
    )


def present_at(
    samples: pl.LazyFrame, *, instants: Sequence[datetime], slos: Sequence[str] | None = None
) -> pl.LazyFrame:
    """Per (at, slo): whether any of its total series has a sample in [at - lookback, at],
    as `absent(total)` sees it in Prometheus 2.x (true: not absent). `slos` lists the SLOs
    to answer for (default: those with samples); one without samples is absent."""
    totals = (
        samples.filter(pl.col("role") == "total")
        .select("slo", pl.col("ts").cast(TIMESTAMP))
        .unique()
        .sort("ts")
    )
    at = pl.LazyFrame({"at": list(instants)}, schema={"at": TIMESTAMP})
    wanted = (
        samples.select("slo").unique()
        if slos is None
        else pl.LazyFrame({"slo": list(slos)}, schema={"slo": pl.String()})
    )
    return (
        wanted.join(at, how="cross")
        .sort("at")
        .join_asof(
            totals.rename({"ts": "seen_ts"}),
            left_on="at",
            right_on="seen_ts",
            by="slo",
            strategy="backward",
            check_sortedness=False,
        )
        .with_columns(
            present=(pl.col("seen_ts") >= pl.col("at") - timedelta(seconds=LOOKBACK_S)).fill_null(
                value=False
            )
        )
        .select("at", "slo", "present")
    )
