"""Alert bands: when each burn-rate alert was firing, as bands on a timeline.

Input is one row per firing interval: the alert (SLO, severity, long and short window), when it
started firing and when it resolved (null while it still fires; drawn to the end of the report
window and marked "still firing"). `firing_intervals` builds these rows from the alert state
history (one row per state change, as the `alerts` table keeps it); only FIRING counts, since a
pending alert has paged nobody.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import Column, ColumnKind, FrameContract, time_column
from servewatch.dashboards.panel import (
    ROW_PX,
    WIDTH_PX,
    TimeDomain,
    data_chart,
    duration_label,
    epoch_ms,
    epoch_ms_of,
    open_interval_end,
    time_tooltip,
    time_x,
    titled,
)

SEVERITY_COLORS = {"page": "#d62728", "ticket": "#ff7f0e"}

ALERT_BAND_CONTRACT = FrameContract(
    "alert bands",
    (
        Column("slo", ColumnKind.TEXT, "SLO name"),
        Column("severity", ColumnKind.TEXT, "page or ticket"),
        Column("long_window_s", ColumnKind.NUMBER, "long window of the alert, seconds"),
        Column("short_window_s", ColumnKind.NUMBER, "short window of the alert, seconds"),
        time_column("start_ts", "when it started firing, naive UTC"),
        time_column("end_ts", "when it resolved, naive UTC; null while still firing"),
    ),
)
ALERT_CHANGES_CONTRACT = FrameContract(
    "alert state history",
    (
        Column("slo", ColumnKind.TEXT, "SLO name"),
        Column("severity", ColumnKind.TEXT, "page or ticket"),
        Column("long_window_s", ColumnKind.NUMBER, "long window, seconds"),
        Column("short_window_s", ColumnKind.NUMBER, "short window, seconds"),
        Column("state", ColumnKind.TEXT, "pending, firing, resolved or inactive"),
        time_column("changed_ts", "when the state changed, naive UTC"),
    ),
)
ALERT_KEY = ("slo", "severity", "long_window_s", "short_window_s")


def firing_intervals(changes: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Firing intervals from state changes: each FIRING change to the alert's next change."""
    rows = ALERT_CHANGES_CONTRACT.select(changes).sort([*ALERT_KEY, "changed_ts"])
    return (
        rows.with_columns(end_ts=pl.col("changed_ts").shift(-1).over(ALERT_KEY))
        .filter(pl.col("state") == "firing")
        .select(*ALERT_KEY, pl.col("changed_ts").alias("start_ts"), "end_ts")
    )


def _alert_label() -> pl.Expr:
    return pl.format(
        "{} {} {}/{}",
        pl.col("slo"),
        pl.col("severity"),
        pl.col("long_window_s").map_elements(duration_label, return_dtype=pl.String),
        pl.col("short_window_s").map_elements(duration_label, return_dtype=pl.String),
    )


def band_rows(frame: pl.DataFrame | pl.LazyFrame, *, domain: TimeDomain | None) -> pl.DataFrame:
    """Intervals as chart rows: epoch ms start and end, open ones closed at the window end."""
    rows = ALERT_BAND_CONTRACT.select(frame)
    until = open_interval_end(rows, domain=domain)
    return rows.select(
        alert=_alert_label(),
        severity="severity",
        slo="slo",
        ts=epoch_ms("start_ts"),
        ts_end=pl.coalesce(epoch_ms("end_ts"), pl.lit(epoch_ms_of(until))),
        state=pl.when(pl.col("end_ts").is_null())
        .then(pl.lit("still firing"))
        .otherwise(pl.lit("resolved")),
    ).sort("slo", "alert", "ts")


def severity_scale(severities: list[str]) -> Any:
    # The same colours everywhere, whichever severities a chart happens to show.
    order = sorted(
        set(severities) | set(SEVERITY_COLORS), key=lambda s: (s not in SEVERITY_COLORS, s)
    )
    return alt.Scale(domain=order, range=[SEVERITY_COLORS.get(s, "#9467bd") for s in order])


def firing_bands_layer(bands: pl.DataFrame, *, domain: TimeDomain | None) -> Any:
    """Full-height shaded bands for layering behind another time chart."""
    return (
        data_chart(bands)
        .mark_rect(opacity=0.15)
        .encode(
            time_x(domain=domain),
            alt.X2("ts_end:T"),
            alt.Color(
                "severity:N",
                title="firing alert",
                scale=severity_scale(bands["severity"].to_list()),
            ),
            tooltip=[
                alt.Tooltip("alert:N", title="alert"),
                time_tooltip("ts", title="firing from"),
                time_tooltip("ts_end", title="until"),
                alt.Tooltip("state:N"),
            ],
        )
    )


def alert_bands_chart(
    frame: pl.DataFrame | pl.LazyFrame, *, domain: TimeDomain | None = None
) -> Any:
    """One row per alert, a bar for each interval it was firing."""
    bands = band_rows(frame, domain=domain)
    alerts = sorted(set(bands["alert"].to_list()))
    chart = (
        data_chart(bands)
        .mark_bar(height=10)
        .encode(
            time_x(domain=domain),
            alt.X2("ts_end:T"),
            alt.Y("alert:N", title="alert (SLO, severity, windows)", sort=alerts),
            alt.Color(
                "severity:N", title="severity", scale=severity_scale(bands["severity"].to_list())
            ),
            tooltip=[
                alt.Tooltip("alert:N", title="alert"),
                time_tooltip("ts", title="firing from"),
                time_tooltip("ts_end", title="until"),
                alt.Tooltip("state:N"),
            ],
        )
        .properties(width=WIDTH_PX, height=max(60, 2 * ROW_PX * max(len(alerts), 1)))
    )
    still = bands.filter(pl.col("state") == "still firing").height
    subtitle = [
        f"Intervals in which each burn-rate alert was firing ({bands.height} in the window"
        + (f", {still} still firing at its end" if still else "")
        + "); pending time is not shown.",
    ]
    return titled(chart, title="Firing alerts", subtitle=subtitle)
