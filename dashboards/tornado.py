"""Sensitivity tornado: how far the required replica count moves when each assumption moves
over its range, everything else held.

Input is one row per assumption with a range (the fields of `capacity.risk.TornadoBar`): its
low and high ends and the replicas the sizing needs at each; a null count means no fleet meets
the requirement at that end, drawn as a marker at the axis edge and named in the tooltip. Bars
start at the recommended (baseline) count and are sorted by swing, widest on top, so the
riskiest assumption reads first.
"""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import Column, ColumnKind, FrameContract
from servewatch.dashboards.panel import ROW_PX, WIDTH_PX, data_chart, titled

TORNADO_CONTRACT = FrameContract(
    "sensitivity tornado",
    (
        Column("assumption", ColumnKind.TEXT, "what was moved (a requirement path)"),
        Column("low", ColumnKind.NUMBER, "low end of its range"),
        Column("high", ColumnKind.NUMBER, "high end of its range"),
        Column(
            "replicas_at_low", ColumnKind.NUMBER, "replicas needed at the low end; null: no fleet"
        ),
        Column("replicas_at_high", ColumnKind.NUMBER, "replicas at the high end; null: no fleet"),
    ),
    optional=(Column("unit", ColumnKind.TEXT, "unit of low and high"),),
)
END_COLORS = {"low end": "#4c78a8", "high end": "#f58518"}


def tornado_chart(frame: pl.DataFrame | pl.LazyFrame, *, baseline_replicas: int) -> Any:
    rows = TORNADO_CONTRACT.select(frame)
    if rows.is_empty():
        raise ValueError("sensitivity tornado: no assumption carries a range")
    if "unit" not in rows.columns:
        rows = rows.with_columns(unit=pl.lit(""))
    counts = [v for c in ("replicas_at_low", "replicas_at_high") for v in rows[c].to_list()]
    known = [float(v) for v in counts if v is not None]
    edge = max([*known, float(baseline_replicas)]) + 1
    swing = (
        pl.when(pl.col("replicas_at_low").is_null() | pl.col("replicas_at_high").is_null())
        .then(pl.lit(math.inf))
        .otherwise((pl.col("replicas_at_high") - pl.col("replicas_at_low")).abs().cast(pl.Float64))
    )
    ranked = rows.with_columns(swing=swing).sort("swing", "assumption", descending=[True, False])
    order = ranked["assumption"].to_list()
    ends = pl.concat(
        [
            ranked.select(
                "assumption",
                end=pl.lit(end),
                value=pl.col(side),
                unit="unit",
                replicas=pl.col(f"replicas_at_{side}").cast(pl.Float64),
            )
            for side, end in (("low", "low end"), ("high", "high end"))
        ]
    ).with_columns(
        feasible=pl.col("replicas").is_not_null(),
        drawn=pl.col("replicas").fill_null(edge),
        baseline=pl.lit(float(baseline_replicas)),
        outcome=pl.when(pl.col("replicas").is_null())
        .then(pl.lit("no fleet meets the requirement"))
        .otherwise(pl.format("{} replicas", pl.col("replicas").cast(pl.Int64))),
    )
    y = alt.Y("assumption:N", title="assumption", sort=order, scale=alt.Scale(paddingInner=0.3))
    color = alt.Color(
        "end:N",
        title="assumption at its",
        scale=alt.Scale(domain=list(END_COLORS), range=list(END_COLORS.values())),
    )
    tooltip = [
        alt.Tooltip("assumption:N"),
        alt.Tooltip("end:N", title="moved to"),
        alt.Tooltip("value:Q", title="value", format=",.4g"),
        alt.Tooltip("unit:N"),
        alt.Tooltip("outcome:N", title="sizing needs"),
    ]
    lowest = min([*known, float(baseline_replicas)]) - 1
    x = alt.X(
        "drawn:Q",
        title="replicas required (count)",
        scale=alt.Scale(domain=[max(lowest, 0), edge]),
        axis=alt.Axis(format="d", tickMinStep=1),
    )
    # Each assumption's row holds two thin bars, low end above high end, so the two never hide
    # each other when both move the count the same way.
    offset = alt.YOffset("end:N", sort=list(END_COLORS))
    bars = (
        data_chart(ends.filter("feasible"))
        .mark_bar(opacity=0.85)
        .encode(x, alt.X2("baseline:Q"), y, offset, color, tooltip=tooltip)
    )
    infeasible = (
        data_chart(ends.filter(~pl.col("feasible")))
        .mark_point(shape="triangle-right", size=80, filled=True)
        .encode(x, y, offset, color, tooltip=tooltip)
    )
    # The value each end moved to, beside where its bar ends.
    text = pl.format("{} {}", pl.col("value").round_sig_figs(3), "unit").str.strip_chars()
    labels = (
        data_chart(ends.with_columns(text=text))
        .mark_text(align="left", dx=4, fontSize=10)
        .encode(x, y, offset, text="text:N", color=alt.Color("end:N", legend=None))
    )
    base = pl.DataFrame({"baseline": [baseline_replicas]})
    rule = data_chart(base).mark_rule(color="black").encode(x="baseline:Q")
    chart = (
        alt.layer(bars, infeasible, labels, rule)
        .resolve_scale(color="shared")
        .properties(width=WIDTH_PX, height=max(80, 3 * ROW_PX * len(order)))
    )
    subtitle = [
        (
            f"Replicas required when each assumption moves to the low or high end of its range; "
            f"black line: the recommendation ({baseline_replicas} replicas). Widest swing on top."
        ),
    ]
    if ends.filter(~pl.col("feasible")).height:
        subtitle.append("Triangles at the right edge: no fleet meets the requirement at that end.")
    return titled(chart, title="Sensitivity tornado", subtitle=subtitle)
