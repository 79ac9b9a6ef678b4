"""Error budgets at one instant, exact from minute counts: consumed, remaining, the burn rate of
every window, and the time left until the budget is gone at the current burn.

Over an SLO's rolling period, the budget is the number of bad events the objective allows:
(1 - objective) x total events. Consumed = bad / allowed (above 1 when overspent); the burn
rate of a window is its error ratio / (1 - objective), so burning at 1 spends exactly the
budget over the period. Time to exhaustion = remaining x period / current burn: how long the
rest lasts if the current burn held and no old errors rolled out of the period.

A period without events has no budget to speak of: consumed, remaining and time to exhaustion
are null ("no data"), never a full budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import polars as pl

from servewatch.slo.burn_rate import spec_table, window_sums_at, with_burn_rate
from servewatch.slo.spec import SloSpec

# The burn "now": the workbook's shortest page window, long enough to mean something.
CURRENT_WINDOW_S = 3600


def burn_rates_at(minutes: pl.LazyFrame, *, specs: Sequence[SloSpec], at: datetime) -> pl.LazyFrame:
    """Per (slo, window_s): good, total, bad, error_ratio and burn_rate over [at - window, at),
    for every alert window and the period of each SLO."""
    return window_sums_at(minutes, specs=specs, at=at).pipe(with_burn_rate, specs=specs)


def budget_status(
    minutes: pl.LazyFrame,
    *,
    specs: Sequence[SloSpec],
    at: datetime,
    current_window_s: int = CURRENT_WINDOW_S,
) -> pl.LazyFrame:
    """One row per SLO: the period's counts, budget consumed and remaining, the current burn
    rate (over `current_window_s`) and the time to exhaustion at that burn (null when not
    burning, 0 when already spent)."""
    sums = window_sums_at(minutes, specs=specs, at=at, extra_windows_s=(current_window_s,))
    return budget_from_sums(sums, specs=specs, current_window_s=current_window_s)


def budget_from_sums(
    sums: pl.LazyFrame, *, specs: Sequence[SloSpec], current_window_s: int = CURRENT_WINDOW_S
) -> pl.LazyFrame:
    """`budget_status` from window sums already computed (they must hold each SLO's period
    and `current_window_s`), so one pass over the minutes serves alerts and budgets."""
    sums = sums.pipe(with_burn_rate, specs=specs)
    period = spec_table(specs).join(
        sums.rename({"window_s": "period_s"}), on=["slo", "period_s"], how="left"
    )
    current = sums.filter(pl.col("window_s") == current_window_s).select(
        "slo", current_burn_rate=pl.col("burn_rate")
    )
    allowed_bad = pl.col("error_budget_ratio") * pl.col("total")
    consumed = pl.when(pl.col("total") > 0).then(pl.col("bad") / allowed_bad).otherwise(None)
    remaining = pl.col("budget_remaining_ratio")
    burn = pl.col("current_burn_rate")
    return (
        period.join(current, on="slo", how="left")
        .with_columns(
            allowed_bad=allowed_bad,
            budget_consumed_ratio=consumed,
            budget_remaining_ratio=1.0 - consumed,
            current_window_s=pl.lit(current_window_s, dtype=pl.Int64),
        )
        .with_columns(
            time_to_exhaustion_s=pl.when(remaining <= 0)
            .then(0.0)
            .when(burn > 0)
            .then(remaining * pl.col("period_s") / burn)
            .otherwise(None)
        )
        .select(
            "at",
            "slo",
            "objective_ratio",
            "period_s",
            "good",
            "total",
            "bad",
            "error_ratio",
            "allowed_bad",
            "budget_consumed_ratio",
            "budget_remaining_ratio",
            "current_window_s",
            "current_burn_rate",
            "time_to_exhaustion_s",
        )
    )
