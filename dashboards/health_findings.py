"""Health findings: what the fleet-health detectors found, as a timeline and as a table.

`findings_frame` flattens `health.finding.Finding`s into one row each (kind, scope,
start, end, confidence, summary, evidence as text, suggestion); the charts read that frame.
The timeline draws a bar per finding from its start to its end (an ongoing one to the end of
the report window, marked "ongoing"), one row per affected scope, coloured by failure mode;
the table prints every finding in full (summary, suggested action, evidence numbers, wrapped
rather than cut off), so the report carries the same facts as `servewatch health --json`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import Column, ColumnKind, FrameContract, time_column
from servewatch.dashboards.panel import (
    ROW_PX,
    WIDTH_PX,
    TimeDomain,
    data_chart,
    epoch_ms,
    epoch_ms_of,
    open_interval_end,
    time_tooltip,
    time_x,
    titled,
)
from servewatch.health.finding import Finding, FindingKind

KIND_COLORS = {
    FindingKind.SLOW_REPLICA.value: "#d62728",
    FindingKind.KV_PRESSURE.value: "#9467bd",
    FindingKind.AFFINITY_LOSS.value: "#17becf",
    FindingKind.TRAFFIC_STEP.value: "#ff7f0e",
    FindingKind.ROLLOUT_REGRESSION.value: "#8c564b",
    FindingKind.ERROR_BURST.value: "#e377c2",
    FindingKind.HOST_LOSS.value: "#1f77b4",
    FindingKind.ZONE_LOSS.value: "#393b79",
    FindingKind.STARTUP_DEPENDENCY.value: "#7f7f7f",
    FindingKind.LOSS_OVERLOAD.value: "#bcbd22",
    FindingKind.GATEWAY_REJECTION.value: "#2ca02c",
    FindingKind.AUTOSCALER_LAG.value: "#ffbb78",
    FindingKind.DEPENDENCY.value: "#aec7e8",
}
EVIDENCE_SHOWN = 6
TABLE_LINE_PX = ROW_PX + 2
# (style, font weight, colour) of the table's printed lines.
LINE_STYLES = (
    ("head", "bold", "#000000"),
    ("body", "normal", "#000000"),
    ("evidence", "normal", "#555555"),
)
# Characters per printed line of the table at the chart's width and the default font size.
TABLE_LINE_CHARS = 100

FINDINGS_SCHEMA = pl.Schema(
    {
        "kind": pl.String(),
        "scope_unit": pl.String(),
        "scope": pl.String(),
        "start_ts": pl.Datetime("us"),
        "end_ts": pl.Datetime("us"),
        "confidence": pl.Float64(),
        "summary": pl.String(),
        "evidence": pl.String(),
        "suggestion": pl.String(),
    }
)
FINDINGS_CONTRACT = FrameContract(
    "health findings",
    (
        Column("kind", ColumnKind.TEXT, "failure mode (slow_replica, dependency, ...)"),
        Column("scope_unit", ColumnKind.TEXT, "replica, host, zone, pool, version or fleet"),
        Column("scope", ColumnKind.TEXT, "the affected replica, host, zone, pool or version"),
        time_column("start_ts", "when the finding starts, naive UTC"),
        time_column("end_ts", "when it ends, naive UTC; null while ongoing"),
        Column("confidence", ColumnKind.NUMBER, "0-1, how sure the detector is"),
        Column("summary", ColumnKind.TEXT, "one sentence: what, where, since when"),
        Column("evidence", ColumnKind.TEXT, "the numbers behind it"),
        Column("suggestion", ColumnKind.TEXT, "what to do"),
    ),
)


def _number(value: float) -> str:
    return f"{value:.4g}"


def evidence_text(finding: Finding, *, limit: int = EVIDENCE_SHOWN) -> str:
    """`name value unit (baseline b)` for the first `limit` evidence numbers, then the
    findings it explains (its consequences), by kind and scope."""
    parts = [
        f"{e.name} {_number(e.value)} {e.unit}"
        + ("" if e.baseline is None else f" (baseline {_number(e.baseline)})")
        for e in finding.evidence[:limit]
    ]
    more = len(finding.evidence) - limit
    text = "; ".join(parts) + (f"; {more} more" if more > 0 else "")
    if finding.consequences:
        explained = ", ".join(f"{c.kind.value} {c.scope}" for c in finding.consequences)
        text += f"; explains {explained}"
    return text


def findings_frame(findings: Sequence[Finding]) -> pl.DataFrame:
    """One row per finding, in the given order (FINDINGS_SCHEMA)."""
    return pl.DataFrame(
        {
            "kind": [f.kind.value for f in findings],
            "scope_unit": [f.scope_unit.value for f in findings],
            "scope": [f.scope for f in findings],
            "start_ts": [f.start for f in findings],
            "end_ts": [f.end for f in findings],
            "confidence": [f.confidence for f in findings],
            "summary": [f.summary for f in findings],
            "evidence": [evidence_text(f) for f in findings],
            "suggestion": [f.suggestion for f in findings],
        },
        schema=FINDINGS_SCHEMA,
    )


def _rows(frame: pl.DataFrame | pl.LazyFrame, *, domain: TimeDomain | None) -> pl.DataFrame:
    rows = FINDINGS_CONTRACT.select(frame)
    until = open_interval_end(rows, domain=domain)
    return rows.with_columns(
        where=pl.format("{} {}", "scope_unit", "scope"),
        ts=epoch_ms("start_ts"),
        ts_end=pl.coalesce(epoch_ms("end_ts"), pl.lit(epoch_ms_of(until))),
        state=pl.when(pl.col("end_ts").is_null())
        .then(pl.lit("ongoing"))
        .otherwise(pl.lit("ended")),
        confidence_pct=(pl.col("confidence") * 100).round(0),
    ).drop("start_ts", "end_ts")


def _kind_scale(kinds: Sequence[str]) -> Any:
    order = [k for k in KIND_COLORS if k in kinds] + sorted(set(kinds) - set(KIND_COLORS))
    return alt.Scale(domain=order, range=[KIND_COLORS.get(k, "#7f7f7f") for k in order])


def findings_timeline_chart(
    frame: pl.DataFrame | pl.LazyFrame, *, domain: TimeDomain | None = None
) -> Any:
    """A bar per finding on its scope's row, from start to end (or the window's end)."""
    rows = _rows(frame, domain=domain)
    if rows.is_empty():
        raise ValueError("health findings timeline: there are no findings to draw")
    scopes = list(dict.fromkeys(rows["where"].to_list()))
    chart = (
        data_chart(rows)
        .mark_bar(height=10)
        .encode(
            time_x(domain=domain),
            alt.X2("ts_end:T"),
            alt.Y("where:N", title="scope", sort=scopes),
            alt.Color("kind:N", title="failure mode", scale=_kind_scale(rows["kind"].to_list())),
            tooltip=[
                alt.Tooltip("kind:N", title="failure mode"),
                alt.Tooltip("where:N", title="scope"),
                time_tooltip("ts", title="from"),
                time_tooltip("ts_end", title="until"),
                alt.Tooltip("state:N"),
                alt.Tooltip("confidence_pct:Q", title="confidence %"),
                alt.Tooltip("summary:N"),
                alt.Tooltip("evidence:N"),
                alt.Tooltip("suggestion:N"),
            ],
        )
        .properties(width=WIDTH_PX, height=max(60, 2 * ROW_PX * len(scopes)))
    )
    ongoing = rows.filter(pl.col("state") == "ongoing").height
    subtitle = [
        f"{rows.height} finding(s) of the fleet-health detectors"
        + (f", {ongoing} still ongoing at the end of the window" if ongoing else "")
        + "; hover a bar for its evidence and suggestion.",
    ]
    return titled(chart, title="Health findings over time", subtitle=subtitle)


def _wrapped(text: str, *, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text, width=TABLE_LINE_CHARS, initial_indent=first, subsequent_indent=rest
    ) or [first.rstrip()]


def table_lines(rows: pl.DataFrame) -> pl.DataFrame:
    """The table's text, one row per printed line: a head line per finding (when, failure mode,
    scope, confidence), then its summary, suggested action and evidence in full, wrapped.
    Columns: line (0, 1, ... down the table), text, style (head or body)."""
    lines: list[tuple[str, str]] = []
    for row in rows.iter_rows(named=True):
        start = datetime.fromtimestamp(row["ts"] / 1000, tz=UTC)
        until = (
            "ongoing"
            if row["state"] == "ongoing"
            else f"{datetime.fromtimestamp(row['ts_end'] / 1000, tz=UTC):%H:%M}"
        )
        head = (
            f"{start:%m-%d %H:%M} to {until} · {row['kind']} · {row['where']} · "
            f"confidence {row['confidence_pct']:.0f}%"
        )
        lines.append((head, "head"))
        lines += [(t, "body") for t in _wrapped(row["summary"], first="  ", rest="  ")]
        action = _wrapped(row["suggestion"], first="  Action: ", rest="          ")
        lines += [(t, "body") for t in action]
        if row["evidence"]:
            evidence = _wrapped(row["evidence"], first="  Evidence: ", rest="            ")
            lines += [(t, "evidence") for t in evidence]
    return pl.DataFrame(
        {
            "line": list(range(len(lines))),
            "text": [t for t, _ in lines],
            "style": [s for _, s in lines],
        },
        schema={"line": pl.Int64(), "text": pl.String(), "style": pl.String()},
    )


def findings_table_chart(frame: pl.DataFrame | pl.LazyFrame) -> Any:
    """Every finding in full: when, what, where, how sure, its summary, the suggested action
    and the evidence numbers, as printed lines (nothing cut off, nothing behind hover)."""
    rows = _rows(frame, domain=None)
    if rows.is_empty():
        raise ValueError("health findings table: there are no findings to list")
    lines = table_lines(rows)
    y = alt.Y("line:O", axis=None, scale=alt.Scale(domain=lines["line"].to_list()))
    layers = [
        data_chart(lines.filter(pl.col("style") == style))
        .mark_text(align="left", baseline="middle", limit=0, fontWeight=weight, color=color)
        .encode(y, x=alt.value(0), text="text:N")
        for style, weight, color in LINE_STYLES
        if (lines["style"] == style).any()
    ]
    chart = alt.layer(*layers).properties(
        width=WIDTH_PX, height=max(40, TABLE_LINE_PX * lines.height)
    )
    subtitle = [
        (
            "Start to end (UTC), failure mode, scope and confidence; then the summary, the "
            "suggested action and the evidence numbers (as `servewatch health --json` has them)."
        ),
    ]
    return titled(chart, title="Health findings", subtitle=subtitle)
