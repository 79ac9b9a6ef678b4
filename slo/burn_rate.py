"""Burn rates from minute counts: exact window sums, at one instant or at every minute.

Input is the pipeline's per-minute event counts: `minute_ts` (start of the minute, naive UTC),
`slo`, `good`, `total`, and optional scope columns (`replica`, `pool`, `model`, `tenant`,
`adapter`) that a spec's scope selects on. A window is the sum of its whole minutes, so its
error ratio is sum(bad) / sum(total): traffic-weighted, never a mean of per-minute ratios.
Token goodput SLOs count output tokens instead (`good_output_tokens`, `output_tokens`), in the
same sums.

An evaluation at instant `at` sees the window [at - W, at) of minutes that have ended; inside a
minute, `at` is floored to the minute (an evaluation at 12:03:40 counts minutes up to 12:02).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

import polars as pl

from servewatch.slo.spec import SloSpec

MINUTE = timedelta(minutes=1)
TIMESTAMP = pl.Datetime("us")
MINUTES_COLUMNS: tuple[str, ...] = ("minute_ts", "slo", "good", "total")
WINDOW_SUMS_SCHEMA = pl.Schema(
    {
        "at": TIMESTAMP,
        "slo": pl.String(),
        "window_s": pl.Int64(),
        "good": pl.Int64(),
        "total": pl.Int64(),
    }
)


def evaluation_minute(at: datetime) -> datetime:
    """`at` as naive UTC floored to its minute: the end of the last whole minute it sees."""
    if at.tzinfo is not None:
        at = at.astimezone(UTC).replace(tzinfo=None)
    return at.replace(second=0, microsecond=0)


def spec_table(specs: Sequence[SloSpec]) -> pl.LazyFrame:
    """One row per SLO with what the frame transforms need from its spec."""
    return pl.LazyFrame(
        {
            "slo": [s.name for s in specs],
            "objective_ratio": [s.objective_ratio for s in specs],
            "error_budget_ratio": [s.error_budget_ratio for s in specs],
            "period_s": [s.period_s for s in specs],
        },
        schema={
            "slo": pl.String(),
            "objective_ratio": pl.Float64(),
            "error_budget_ratio": pl.Float64(),
            "period_s": pl.Int64(),
        },
    )


def scoped_minutes(minutes: pl.LazyFrame, *, specs: Sequence[SloSpec]) -> pl.LazyFrame:
    """The rows that count toward each spec: its `slo` and its scope selectors."""
    columns = set(minutes.collect_schema().names())
    missing = [c for c in MINUTES_COLUMNS if c not in columns]
    if missing:
        raise ValueError(
            f"minute counts lack column(s) {', '.join(missing)}; expected {MINUTES_COLUMNS} "
            "and optional scope columns"
        )
    # One hash lookup for the SLOs without a scope; selectors only for the others.
    keep = pl.col("slo").is_in([spec.name for spec in specs if not spec.scope])
    for spec in specs:
        if not spec.scope:
            continue
        condition = pl.col("slo") == spec.name
        for key, value in spec.scope:
            if key not in columns:
                raise ValueError(
                    f"SLO {spec.name} selects {key}={value!r}, but the minute counts have no "
                    f"{key} column (they have {', '.join(sorted(columns))})"
                )
            condition &= pl.col(key) == value
        keep |= condition
    return minutes.filter(keep).pipe(_events, specs=specs).select(MINUTES_COLUMNS)


def _events(minutes: pl.LazyFrame, *, specs: Sequence[SloSpec]) -> pl.LazyFrame:
    """`good` and `total` as each SLO counts its events: output tokens for token goodput SLOs
    (`slo_minutes.good_output_tokens`, `output_tokens`), requests for the others."""
    tokens = [spec.name for spec in specs if spec.counts_tokens]
    if not tokens:
        return minutes
    columns = set(minutes.collect_schema().names())
    missing = {"good_output_tokens", "output_tokens"} - columns
    if missing:
        raise ValueError(
            f"SLO(s) {', '.join(tokens)} count output tokens, but the minute counts have no "
            f"{', '.join(sorted(missing))} column"
        )
    by_tokens = pl.col("slo").is_in(tokens)
    return minutes.with_columns(
        good=pl.when(by_tokens).then(pl.col("good_output_tokens")).otherwise(pl.col("good")),
        total=pl.when(by_tokens).then(pl.col("output_tokens")).otherwise(pl.col("total")),
    )


def _needed_windows(
    specs: Sequence[SloSpec], extra_windows_s: Iterable[int]
) -> tuple[pl.LazyFrame, list[int]]:
    extra = tuple(extra_windows_s)
    pairs = sorted(
        {(s.name, w) for s in specs for w in (*s.window_lengths_s(), *extra)},
    )
    needed = pl.LazyFrame(
        {"slo": [p[0] for p in pairs], "window_s": [p[1] for p in pairs]},
        schema={"slo": pl.String(), "window_s": pl.Int64()},
    )
    return needed, sorted({p[1] for p in pairs})


def window_sums_at(
    minutes: pl.LazyFrame,
    *,
    specs: Sequence[SloSpec],
    at: datetime,
    extra_windows_s: Iterable[int] = (),
) -> pl.LazyFrame:
    """Good and total events of every window each SLO needs, ending at `at`.

    One row per (slo, window_s) (`WINDOW_SUMS_SCHEMA`), zeros where nothing was counted.
    """
    at_minute = evaluation_minute(at)
    needed, lengths = _needed_windows(specs, extra_windows_s)
    if not lengths:
        return pl.LazyFrame(schema=WINDOW_SUMS_SCHEMA)
    in_range = (pl.col("minute_ts") >= at_minute - timedelta(seconds=lengths[-1])) & (
        pl.col("minute_ts") < at_minute
    )
    # Each minute goes to the shortest window that holds it (its band); a window's sum is
    # then the sum of its band and all shorter ones. One group_by over the minutes instead of
    # a filtered sum per window.
    age = pl.lit(at_minute, dtype=TIMESTAMP) - pl.col("minute_ts")
    band = pl.coalesce(
        [pl.when(age <= timedelta(seconds=length)).then(length) for length in lengths]
    )
    banded = (
        scoped_minutes(minutes, specs=specs)
        .filter(in_range)
        .with_columns(band=band.cast(pl.Int64))
        .group_by("slo", "band")
        .agg(pl.col("good").sum().cast(pl.Int64), pl.col("total").sum().cast(pl.Int64))
    )
    sums = (
        needed.join(banded, on="slo", how="inner")
        .filter(pl.col("band") <= pl.col("window_s"))
        .group_by("slo", "window_s")
        .agg(pl.col("good").sum(), pl.col("total").sum())
    )
    return (
        needed.join(sums, on=["slo", "window_s"], how="left")
        .with_columns(
            at=pl.lit(at_minute, dtype=TIMESTAMP),
            good=pl.col("good").fill_null(0),
            total=pl.col("total").fill_null(0),
        )
        .select(WINDOW_SUMS_SCHEMA.names())
    )


def window_sums_every_minute(
    minutes: pl.LazyFrame,
    *,
    specs: Sequence[SloSpec],
    start: datetime,
    end: datetime,
    extra_windows_s: Iterable[int] = (),
) -> pl.LazyFrame:
    """`window_sums_at` for every minute boundary `at` in [start, end]: the input of an
    every-minute evaluation replayed in virtual time.

    Cost grows with (SLOs x minutes in [start - longest window, end]): each window is a
    difference of running sums over a zero-filled minute grid, not a re-sum per instant.
    """
    first, last = evaluation_minute(start), evaluation_minute(end)
    if last < first:
        raise ValueError(f"evaluation range ends ({last}) before it starts ({first})")
    needed, lengths = _needed_windows(specs, extra_windows_s)
    if not lengths:
        return pl.LazyFrame(schema=WINDOW_SUMS_SCHEMA)
    grid_start = first - timedelta(seconds=lengths[-1])
    grid = pl.LazyFrame({"slo": sorted({s.name for s in specs})}).join(
        pl.LazyFrame(
            {
                "minute_ts": pl.datetime_range(
                    grid_start, last - MINUTE, interval="1m", time_unit="us", eager=True
                )
            }
        ),
        how="cross",
    )
    counts = (
        scoped_minutes(minutes, specs=specs)
        .with_columns(pl.col("minute_ts").dt.truncate("1m"))
        .filter((pl.col("minute_ts") >= grid_start) & (pl.col("minute_ts") < last))
        .group_by("slo", "minute_ts")
        .agg(pl.col("good").sum().cast(pl.Int64), pl.col("total").sum().cast(pl.Int64))
    )
    # The grid starts a longest window before `first`: a lag that falls off its start would
    # have counted only minutes outside every window, so it is zero.
    lagged = (
        grid.join(counts, on=["slo", "minute_ts"], how="left")
        .with_columns(pl.col("good", "total").fill_null(0))
        .sort("slo", "minute_ts")
        .with_columns(
            cum_good=pl.col("good").cum_sum().over("slo"),
            cum_total=pl.col("total").cum_sum().over("slo"),
        )
        .with_columns(
            *[
                (pl.col(f"cum_{what}") - pl.col(f"cum_{what}").shift(length // 60).over("slo"))
                .fill_null(pl.col(f"cum_{what}"))
                .alias(f"{what}_{length}")
                for length in lengths
                for what in ("good", "total")
            ],
            at=pl.col("minute_ts") + MINUTE,
        )
        .filter(pl.col("at") >= first)
    )
    long = pl.concat(
        [
            lagged.select(
                "at",
                "slo",
                window_s=pl.lit(length, dtype=pl.Int64),
                good=pl.col(f"good_{length}"),
                total=pl.col(f"total_{length}"),
            )
            for length in lengths
        ]
    )
    return long.join(needed, on=["slo", "window_s"], how="inner").select(WINDOW_SUMS_SCHEMA.names())


def with_burn_rate(sums: pl.LazyFrame, *, specs: Sequence[SloSpec]) -> pl.LazyFrame:
    """Add `bad`, `error_ratio` (null without events) and `burn_rate` = error ratio / budget."""
    return (
        sums.join(spec_table(specs).select("slo", "error_budget_ratio"), on="slo", how="left")
        .with_columns(bad=pl.col("total") - pl.col("good"))
        .with_columns(
            error_ratio=pl.when(pl.col("total") > 0)
            .then(pl.col("bad") / pl.col("total"))
            .otherwise(None)
        )
        .with_columns(burn_rate=pl.col("error_ratio") / pl.col("error_budget_ratio"))
        .drop("error_budget_ratio")
    )
