"""Drill timeline chart: SLO attainment minute by minute through a failure drill, for each
fleet drilled (the recommended one and one host fewer), against the SLO's target.

Input is the drills' minutes (`capacity.drill.DrillMinute`, one row per fleet and minute
counted from the failure) with the fleet's label: the chart shows where a fleet that fails
drops below the target after the loss and whether it comes back once replacements serve.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import Column, ColumnKind, FrameContract
from servewatch.dashboards.panel import HEIGHT_PX, WIDTH_PX, compact, data_chart, level_rule, titled

TARGET_COLOR = "#c0392b"

DRILL_TIMELINE_CONTRACT = FrameContract(
    "drill timeline chart",
    (
        Column("fleet", ColumnKind.TEXT, "the fleet drilled, e.g. '4 hosts (holds)'"),
        Column("minute", ColumnKind.NUMBER, "minutes from the failure (negative before)"),
        Column("attainment_ratio", ColumnKind.NUMBER, "share of attempts meeting the SLO"),
        Column("ready_replicas", ColumnKind.NUMBER, "replicas up in that minute (fewest)"),
        Column("queue_depth_max", ColumnKind.NUMBER, "most requests waiting (and in backoff)"),
    ),
)


def drill_timeline_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    target_ratio: float,
    lost: str,
    recovery_s: float,
    verdicts: Sequence[str] = (),
) -> Any:
    """Attainment per minute, one line per fleet, the failure at minute 0; `verdicts` (one
    sentence per fleet) go under the title."""
    rows = DRILL_TIMELINE_CONTRACT.select(frame).sort("fleet", "minute")
    if rows.is_empty():
        raise ValueError("drill timeline chart: no drilled minutes")
    points = compact(rows)
    lines = (
        data_chart(points)
        .mark_line(point=True)
        .encode(
            alt.X("minute:Q", title="minutes from the failure"),
            alt.Y("attainment_ratio:Q", title="SLO attainment", scale=alt.Scale(domain=[0, 1])),
            alt.Color("fleet:N", title="fleet drilled"),
            tooltip=[
                alt.Tooltip("fleet:N"),
                alt.Tooltip("minute:Q", title="minute"),
                alt.Tooltip("attainment_ratio:Q", title="attainment", format=".1%"),
                alt.Tooltip("ready_replicas:Q", title="ready replicas"),
                alt.Tooltip("queue_depth_max:Q", title="queue (max)"),
            ],
        )
    )
    failure = (
        data_chart(pl.DataFrame({"minute": [0.0, recovery_s / 60.0]}))
        .mark_rule(color="#7f7f7f", strokeDash=[2, 2])
        .encode(x="minute:Q")
    )
    layers = [
        lines,
        failure,
        *level_rule(target_ratio, label=f"target {target_ratio:.0%}", color=TARGET_COLOR),
    ]
    subtitle = [
        (
            f"{lost} lost at minute 0, no replacement until the dotted line "
            f"({recovery_s / 60:.3g} min); each point is the share of that minute's attempts "
            "meeting the SLO, refused and failed ones included."
        ),
        *verdicts,
    ]
    chart = alt.layer(*layers).properties(width=WIDTH_PX, height=HEIGHT_PX)
    return titled(chart, title="Failure drill: attainment through the loss", subtitle=subtitle)
