"""Burn rate per alert window on a log scale, with the alert thresholds and firing bands.

Input is one row per SLO, window and evaluation minute: the burn rate (error ratio over the
window / the SLO's error budget ratio; 1 spends the budget exactly over the period), as the SLO
jobs compute it from minute counts. Thresholds are rows of the multiwindow, multi-burn-rate
table for the SLO (14.4 for a page on 1 h and 5 min at 30 days). Burn rates span four orders of
magnitude between a quiet hour and an outage, hence the log scale; zero has no place on it, so
rates under `BURN_FLOOR` are drawn at the floor and the subtitle says so. A downsampled bucket
keeps its highest minute, since a short spike is what an alert reacts to.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.alert_band import SEVERITY_COLORS, band_rows, firing_bands_layer
from servewatch.dashboards.columns import MINUTE_TS, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import (
    MAX_POINTS_PER_SERIES,
    Reduction,
    bucket_start,
    buckets_for,
)
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    WIDTH_PX,
    TimeDomain,
    compact,
    data_chart,
    duration_label,
    epoch_ms,
    number_text,
    time_tooltip,
    time_x,
    titled,
)

BURN_FLOOR = 0.01
# Windows in cool colours, so they never read as the red and orange of alert severities.
WINDOW_COLORS = ("#1f77b4", "#17becf", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f", "#bcbd22")

BURN_RATE_CONTRACT = FrameContract(
    "burn rate chart",
    (
        MINUTE_TS,
        Column("slo", ColumnKind.TEXT, "SLO name"),
        Column("window_s", ColumnKind.NUMBER, "length of the window the rate is over, seconds"),
        Column("burn_rate", ColumnKind.NUMBER, "error ratio over the window / error budget ratio"),
    ),
)
THRESHOLD_CONTRACT = FrameContract(
    "burn rate thresholds",
    (
        Column("slo", ColumnKind.TEXT, "SLO name"),
        Column("severity", ColumnKind.TEXT, "page or ticket"),
        Column("long_window_s", ColumnKind.NUMBER, "long window, seconds"),
        Column("short_window_s", ColumnKind.NUMBER, "short window, seconds"),
        Column("burn_threshold", ColumnKind.NUMBER, "burn rate both windows must exceed"),
    ),
)


def _decades(top: float) -> list[float]:
    """Tick values: every power of ten from the floor to above `top` (a log axis' gridlines)."""
    values, value = [], BURN_FLOOR
    while value < top * 10:
        values.append(round(value, 6))
        value *= 10
    return values


def burn_rate_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    slo: str,
    thresholds: pl.DataFrame | pl.LazyFrame | None = None,
    alerts: pl.DataFrame | pl.LazyFrame | None = None,
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    """Burn rate of every window of one SLO; `alerts` are firing intervals (alert_band)."""
    rows = BURN_RATE_CONTRACT.select(frame).filter(pl.col("slo") == slo)
    if rows.is_empty():
        raise ValueError(f"burn rate chart: no rows for SLO {slo!r} in the frame")
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    reduction = Reduction.MAX
    windows = sorted({int(w) for w in rows["window_s"].to_list()})
    labels = {w: duration_label(w) for w in windows}
    data = compact(
        rows.drop_nulls("burn_rate")
        .group_by(bucket_start("minute_ts", buckets).alias("bucket"), "window_s")
        .agg(reduction.expr("burn_rate"))
        .select(
            epoch_ms("bucket").alias("ts"),
            pl.col("window_s")
            .cast(pl.Int64)
            .replace_strict(labels, return_dtype=pl.String)
            .alias("window"),
            "burn_rate",
            drawn=pl.col("burn_rate").clip(lower_bound=BURN_FLOOR),
        )
        .sort("ts", "window")
    )
    top = max([*data["drawn"].drop_nulls().to_list(), 1.0])
    y = alt.Y(
        "drawn:Q",
        title="burn rate (x budget pace, log)",
        scale=alt.Scale(type="log", domainMin=BURN_FLOOR),
        axis=alt.Axis(values=_decades(top), format="~g"),
    )
    window_labels = [labels[w] for w in windows]
    lines = (
        data_chart(data)
        .mark_line(strokeWidth=1.5, point=buckets.minutes <= 30)
        .encode(
            time_x(domain=domain),
            y,
            alt.Color(
                "window:N",
                title="window",
                sort=window_labels,
                scale=alt.Scale(
                    domain=window_labels,
                    range=[WINDOW_COLORS[i % len(WINDOW_COLORS)] for i in range(len(windows))],
                ),
            ),
            tooltip=[
                time_tooltip(),
                alt.Tooltip("window:N"),
                alt.Tooltip("burn_rate:Q", title="burn rate", format=".3g"),
            ],
        )
    )
    layers: list[Any] = []
    subtitle = [
        (
            f"Burn rate of SLO {slo} over each window, per {buckets.label}; 1 spends the budget "
            f"exactly over the period. Under {number_text(BURN_FLOOR)} (and 0) drawn at "
            f"{number_text(BURN_FLOOR)}."
        ),
    ]
    if alerts is not None:
        bands = band_rows(alerts, domain=domain).filter(pl.col("slo") == slo)
        if not bands.is_empty():
            layers.append(firing_bands_layer(bands, domain=domain))
            subtitle.append("Shaded: intervals in which an alert of this SLO was firing.")
    layers.append(lines)
    if thresholds is not None:
        limits = THRESHOLD_CONTRACT.select(thresholds).filter(pl.col("slo") == slo)
        if not limits.is_empty():
            levels = limits.select(
                "severity",
                "burn_threshold",
                label=pl.format(
                    "{} {}/{}: {}",
                    "severity",
                    pl.col("long_window_s").map_elements(duration_label, return_dtype=pl.String),
                    pl.col("short_window_s").map_elements(duration_label, return_dtype=pl.String),
                    pl.col("burn_threshold").round_sig_figs(3),
                ),
            )
            scale = alt.Scale(
                domain=sorted(SEVERITY_COLORS),
                range=[SEVERITY_COLORS[s] for s in sorted(SEVERITY_COLORS)],
            )
            layers.append(
                data_chart(levels)
                .mark_rule(strokeDash=[6, 4])
                .encode(
                    y="burn_threshold:Q",
                    color=alt.Color("severity:N", title="threshold", scale=scale),
                    tooltip=[alt.Tooltip("label:N", title="threshold")],
                )
            )
            layers.append(
                data_chart(levels)
                .mark_text(align="right", dy=-5, fontSize=10)
                .encode(
                    y="burn_threshold:Q",
                    x=alt.value(WIDTH_PX - 2),
                    text="label:N",
                    color=alt.Color("severity:N", scale=scale, legend=None),
                )
            )
            subtitle.append("Dashed: alert thresholds (severity long/short window: burn rate).")
    subtitle.append(buckets.note(reduction))
    chart = (
        alt.layer(*layers)
        .resolve_scale(color="independent")
        .properties(width=WIDTH_PX, height=HEIGHT_PX)
    )
    return titled(chart, title=f"Burn rate: {slo}", subtitle=[s for s in subtitle if s])
