"""The seven boxes on one page: gateway, router, scheduler, replicas, KV tier, autoscaler and
observer, a table each, every row a signal with its state, the number behind it and how it was
computed.

`box_signals` gathers every box's signals from the report's frames (`request_path_boxes`,
`engine_boxes`, `fleet_boxes`); `seven_boxes_chart` prints them. Text is wrapped, never cut,
so a row carries its whole reason; a box with nothing collected still shows, its rows saying
`no signal` and what would provide one.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.box_signal import Box, BoxFrames, BoxSignal, BoxState, box_state
from servewatch.dashboards.engine_boxes import (
    kv_tier_signals,
    replica_signals,
    scheduler_signals,
)
from servewatch.dashboards.fleet_boxes import autoscaler_signals, observer_signals
from servewatch.dashboards.panel import ROW_PX, WIDTH_PX, data_chart, titled
from servewatch.dashboards.request_path_boxes import gateway_signals, router_signals

# Left edge of the signal, state and text columns, px; characters per wrapped line of each.
COLUMN_X = (0, 150, 230)
SIGNAL_CHARS = 24
TEXT_CHARS = 76
LINE_PX = ROW_PX + 2
STATE_COLORS = {
    BoxState.OK: "#2ca02c",
    BoxState.DEGRADED: "#d62728",
    BoxState.NO_SIGNAL: "#7f7f7f",
}
# (style, font weight, colour) of printed lines other than states.
LINE_STYLES = (
    ("signal", "bold", "#000000"),
    ("value", "normal", "#000000"),
    ("how", "normal", "#666666"),
)


def box_signals(frames: BoxFrames) -> tuple[BoxSignal, ...]:
    """Every box's signals, boxes in `Box` order."""
    return (
        *gateway_signals(frames),
        *router_signals(frames),
        *scheduler_signals(frames),
        *replica_signals(frames),
        *kv_tier_signals(frames),
        *autoscaler_signals(frames),
        *observer_signals(frames),
    )


def box_lines(signals: Sequence[BoxSignal]) -> pl.DataFrame:
    """The printed lines of one box's table: line, x, text, style (signal, a state's value,
    value or how)."""
    cells: list[tuple[int, int, str, str]] = []
    line = 0
    for signal in signals:
        names = textwrap.wrap(signal.signal, SIGNAL_CHARS) or [signal.signal]
        values = textwrap.wrap(signal.value, TEXT_CHARS) or [signal.value]
        hows = textwrap.wrap(f"How: {signal.how}", TEXT_CHARS)
        cells += [(line + i, COLUMN_X[0], text, "signal") for i, text in enumerate(names)]
        cells.append((line, COLUMN_X[1], signal.state.value, signal.state.value))
        texts = [(text, "value") for text in values] + [(text, "how") for text in hows]
        cells += [(line + i, COLUMN_X[2], text, style) for i, (text, style) in enumerate(texts)]
        line += max(len(names), len(texts)) + 1
    return pl.DataFrame(cells, schema=["line", "x", "text", "style"], orient="row")


def _table(box: Box, signals: Sequence[BoxSignal]) -> Any:
    lines = box_lines(signals)
    styles = [(s, w, c) for s, w, c in LINE_STYLES]
    styles += [(state.value, "bold", color) for state, color in STATE_COLORS.items()]
    y = alt.Y("line:O", axis=None)
    layers = [
        data_chart(lines.filter(pl.col("style") == style))
        .mark_text(align="left", baseline="middle", limit=0, fontWeight=weight, color=color)
        .encode(y, x=alt.X("x:Q", axis=None, scale=None), text="text:N")
        for style, weight, color in styles
        if (lines["style"] == style).any()
    ]
    height = LINE_PX * (int(lines.select(pl.col("line").max()).item()) + 1)
    state = box_state(signals)
    return alt.layer(*layers).properties(
        width=WIDTH_PX,
        height=height,
        title=alt.TitleParams(
            f"{box.value[0].upper()}{box.value[1:]}: {state.value}",
            subtitle=[box.job],
            fontSize=12,
            color=STATE_COLORS[state],
            subtitleColor="#555555",
            anchor="start",
        ),
    )


def seven_boxes_chart(signals: Sequence[BoxSignal]) -> Any:
    boxes = [box for box in Box if any(s.box is box for s in signals)]
    if not boxes:
        raise ValueError("seven boxes: there are no signals to print")
    tables = [_table(box, [s for s in signals if s.box is box]) for box in boxes]
    states = {box: box_state([s for s in signals if s.box is box]) for box in boxes}
    subtitle = [
        (
            "Each box of the platform with the signals servewatch holds for it: its state "
            "(ok, degraded, or no signal when nothing collected shows it), the number behind "
            "it, and how that number was computed. A box is as bad as its worst signal."
        ),
    ]
    for state in (BoxState.DEGRADED, BoxState.NO_SIGNAL):
        named = [box.value for box in boxes if states[box] is state]
        if named:
            subtitle.append(f"{state.value.capitalize()}: {', '.join(named)}.")
    chart = alt.vconcat(*tables, spacing=18)
    return titled(chart, title="The seven boxes", subtitle=subtitle)
