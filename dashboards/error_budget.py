"""Error budget remaining over time, per SLO.

Input is one row per SLO and evaluation minute: the share of the period's error budget still
unspent (1 = untouched, 0 = spent, below 0 = overspent), as the SLO jobs compute it from minute
counts over each SLO's rolling period. A downsampled bucket keeps its lowest minute: the worst
the budget looked is what matters.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import (
    MAX_POINTS_PER_SERIES,
    Reduction,
    bucket_start,
    buckets_for,
)
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    RATIO_FIGURES,
    WIDTH_PX,
    TimeDomain,
    compact,
    epoch_ms,
    level_rule,
    natural_order,
    series_lines,
    titled,
)

BUDGET_CONTRACT = FrameContract(
    "error budget chart",
    (
        MINUTE_TS,
        Column("slo", ColumnKind.TEXT, "SLO name"),
        Column(
            "budget_remaining_ratio",
            ColumnKind.NUMBER,
            "share of the period's error budget left: 1 untouched, 0 spent, < 0 overspent",
        ),
    ),
)


def budget_remaining_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    rows = BUDGET_CONTRACT.select(frame)
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    reduction = Reduction.MIN
    data = compact(
        rows.group_by(bucket_start("minute_ts", buckets).alias("bucket"), "slo")
        .agg(reduction.expr("budget_remaining_ratio"))
        .select(epoch_ms("bucket").alias("ts"), "slo", "budget_remaining_ratio")
        .sort("ts", "slo"),
        figures=RATIO_FIGURES,
    )
    slos = natural_order(data["slo"].to_list())
    lines = series_lines(
        data,
        y="budget_remaining_ratio",
        y_title="error budget remaining (% of period's budget)",
        color="slo",
        color_title="SLO",
        domain=domain,
        order=slos,
        value_format=".1%",
        points=buckets.minutes <= 30,
    ).encode(
        alt.Y(
            "budget_remaining_ratio:Q",
            title="error budget remaining (%)",
            axis=alt.Axis(format="%"),
        )
    )
    layers = [lines, *level_rule(0.0, label="budget spent", color="#c0392b")]
    subtitle = [
        f"Share of each SLO's error budget left over its rolling period, per {buckets.label}.",
        buckets.note(reduction),
    ]
    chart = alt.layer(*layers).properties(width=WIDTH_PX, height=HEIGHT_PX)
    return titled(chart, title="Error budget remaining", subtitle=[s for s in subtitle if s])
