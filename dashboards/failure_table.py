"""Failure table chart: each candidate fleet's capacity healthy and after the named failure,
against demand.

Input is the failure table's rows (one per candidate host count, the fields of
`capacity.failure_table.FailureRow`): healthy capacity, capacity after losing the named unit,
and whether that still carries the demand. The chart makes seed 000's point visible: a fleet
whose healthy bar clears the demand line can still fall below it after one loss.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import Column, ColumnKind, FrameContract
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    WIDTH_PX,
    compact,
    data_chart,
    level_rule,
    number_text,
    titled,
)

DEMAND_COLOR = "#c0392b"

FAILURE_TABLE_CONTRACT = FrameContract(
    "failure table chart",
    (
        Column("hosts", ColumnKind.NUMBER, "hosts in the candidate fleet"),
        Column("replicas", ColumnKind.NUMBER, "replicas in the candidate fleet"),
        Column("healthy_capacity", ColumnKind.NUMBER, "capacity with every replica up"),
        Column("failed_capacity", ColumnKind.NUMBER, "capacity after losing the named unit"),
        Column("meets_failure", ColumnKind.FLAG, "still carries the demand after the loss"),
    ),
)


def failure_table_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    demand_rate: float,
    rate_unit: str,
    failure_unit: str,
) -> Any:
    """Grouped bars per candidate: healthy and after losing one `failure_unit`."""
    rows = FAILURE_TABLE_CONTRACT.select(frame).sort("hosts")
    if rows.is_empty():
        raise ValueError("failure table chart: the table has no candidate rows")
    after = f"after losing one {failure_unit}"
    candidates = rows.with_columns(
        candidate=pl.format("{} hosts / {} replicas", "hosts", "replicas"),
        verdict=pl.when("meets_failure").then(pl.lit("meets")).otherwise(pl.lit("short")),
    )
    order = candidates["candidate"].to_list()
    bars = compact(
        candidates.unpivot(
            index=["candidate", "verdict"],
            on=["healthy_capacity", "failed_capacity"],
            variable_name="state",
            value_name="capacity",
        ).with_columns(
            pl.col("state").replace_strict(
                {"healthy_capacity": "healthy", "failed_capacity": after}
            )
        )
    )
    capacity_title = f"capacity ({rate_unit})"
    chart_bars = (
        data_chart(bars)
        .mark_bar()
        .encode(
            alt.X("candidate:N", title="candidate fleet", sort=order, axis=alt.Axis(labelAngle=0)),
            alt.XOffset("state:N", sort=["healthy", after]),
            alt.Y("capacity:Q", title=capacity_title),
            alt.Color(
                "state:N",
                title="capacity",
                sort=["healthy", after],
                scale=alt.Scale(domain=["healthy", after], range=["#4c78a8", "#f58518"]),
            ),
            tooltip=[
                alt.Tooltip("candidate:N", title="fleet"),
                alt.Tooltip("state:N", title="state"),
                alt.Tooltip("capacity:Q", title=capacity_title, format=",.4g"),
                alt.Tooltip("verdict:N", title="after the loss"),
            ],
        )
    )
    verdicts = (
        data_chart(bars.filter(pl.col("state") == after))
        .mark_text(dy=-6, fontWeight="bold")
        .encode(
            alt.X("candidate:N", sort=order),
            alt.XOffset("state:N", sort=["healthy", after]),
            alt.Y("capacity:Q"),
            text="verdict:N",
            color=alt.Color(
                "verdict:N",
                scale=alt.Scale(domain=["meets", "short"], range=["#2ca02c", DEMAND_COLOR]),
                legend=None,
            ),
        )
    )
    demand_label = f"demand {number_text(demand_rate)} {rate_unit}"
    layers = [
        chart_bars,
        verdicts,
        *level_rule(demand_rate, label=demand_label, color=DEMAND_COLOR),
    ]
    meeting = candidates.filter(pl.col("meets_failure"))
    smallest = (
        f"smallest fleet that holds: {meeting['candidate'][0]}"
        if meeting.height
        else "no candidate holds the demand after the loss"
    )
    subtitle = [
        (
            f"Capacity of each candidate healthy and {after}, against the demand (dashed); "
            f"{smallest}."
        ),
    ]
    chart = (
        alt.layer(*layers)
        .resolve_scale(color="independent")
        .properties(width=WIDTH_PX, height=HEIGHT_PX + 40)
    )
    return titled(chart, title=f"Failure table: losing one {failure_unit}", subtitle=subtitle)
