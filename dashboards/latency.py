"""Latency percentiles over time: TTFT, TPOT, inter-token latency and e2e, with the SLO limit.

The chart takes one row per minute and percentile (`LATENCY_COLUMNS`), whoever computed it: exact
percentiles of traced requests (`latency_from_requests`, vLLM's definitions) or quantiles of
vLLM's histograms. A percentile cannot be averaged, so when a long window is downsampled each
bucket keeps its worst minute; the subtitle says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.alert_band import band_rows, firing_bands_layer
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
    epoch_ms,
    level_rule,
    number_text,
    series_lines,
    titled,
)
from servewatch.pipeline.request_minutes import latency_percentile, with_minute
from servewatch.pipeline.request_sli import with_tpot

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
LIMIT_COLOR = "#c0392b"
PERCENTILE_COLORS = {
    "p50": "#4c78a8",
    "p90": "#72b7b2",
    "p95": "#f58518",
    "p99": "#8c564b",
    "mean": "#54a24b",
}


class LatencyStat(Enum):
    """Which latency; values are the stems used in column names (`ttft_s`, `tpot_p95_s`)."""

    TTFT = "ttft"
    TPOT = "tpot"
    ITL = "itl"
    E2E = "e2e"

    @property
    def title(self) -> str:
        return {
            LatencyStat.TTFT: "Time to first token (TTFT)",
            LatencyStat.TPOT: "Time per output token (TPOT)",
            LatencyStat.ITL: "Inter-token latency (ITL)",
            LatencyStat.E2E: "End-to-end request latency (e2e)",
        }[self]

    @property
    def short(self) -> str:
        return self.value.upper()

    @property
    def request_column(self) -> str:
        """The per-request column of `requests` (after `with_tpot`); ITL has none."""
        if self is LatencyStat.ITL:
            raise ValueError(
                "inter-token latency is per decode step, not per request: it comes from "
                "vLLM's inter_token_latency_seconds histogram, not from traced requests"
            )
        return f"{self.value}_s"


LATENCY_CONTRACT = FrameContract(
    "latency percentiles chart",
    (
        MINUTE_TS,
        Column("percentile", ColumnKind.TEXT, "p50, p90, p95, p99 or mean"),
        Column("latency_s", ColumnKind.NUMBER, "latency in seconds"),
    ),
)


def latency_from_requests(
    requests: pl.LazyFrame, *, stat: LatencyStat, percentiles: Sequence[int] = PERCENTILES
) -> pl.LazyFrame:
    """Fleet percentiles per minute over successful requests (the minute they finished in)."""
    column = stat.request_column
    wide = (
        requests.pipe(with_tpot)
        .pipe(with_minute)
        .group_by("minute_ts")
        .agg(latency_percentile(column, p).alias(f"p{p}") for p in percentiles)
    )
    return (
        wide.unpivot(index="minute_ts", variable_name="percentile", value_name="latency_s")
        .drop_nulls("latency_s")
        .sort("minute_ts", "percentile")
    )


def _colors(order: Sequence[str]) -> Any:
    # Fixed colours per percentile, so p99 looks the same on every latency chart.
    return alt.Scale(
        domain=list(order),
        range=[PERCENTILE_COLORS.get(label, "#888888") for label in order],
    )


def _percentile_order(labels: Sequence[str]) -> list[str]:
    def key(label: str) -> tuple[int, float]:
        digits = label.removeprefix("p")
        return (0, float(digits)) if digits.replace(".", "", 1).isdigit() else (1, 0.0)

    return sorted(set(labels), key=key)


def latency_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    stat: LatencyStat,
    limit_s: float | None = None,
    source: str = "traced requests",
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
    alerts: pl.DataFrame | pl.LazyFrame | None = None,
) -> Any:
    """Lines per percentile over time; a dashed line at the SLO limit when given; shaded
    behind them, the intervals in which a burn-rate alert fired (`alerts`: alert_band rows)."""
    rows = LATENCY_CONTRACT.select(frame)
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    reduction = Reduction.MAX
    data = compact(
        rows.group_by(bucket_start("minute_ts", buckets).alias("bucket"), "percentile")
        .agg(reduction.expr("latency_s"))
        .select(epoch_ms("bucket").alias("ts"), "percentile", "latency_s")
        .sort("ts", "percentile")
    )
    order = _percentile_order(data["percentile"].to_list())
    y_title = f"{stat.short} (s)"
    lines = series_lines(
        data,
        y="latency_s",
        y_title=y_title,
        color="percentile",
        color_title="percentile",
        domain=domain,
        order=order,
        points=buckets.minutes <= 30,
    ).encode(alt.Color("percentile:N", title="percentile", sort=order, scale=_colors(order)))
    layers: list[Any] = []
    what = f"Fleet {stat.short} percentiles per {buckets.label}, from {source}."
    bands = band_rows(alerts, domain=domain) if alerts is not None else None
    if bands is not None and not bands.is_empty():
        layers.append(firing_bands_layer(bands, domain=domain))
        what += " Shaded: intervals in which an SLO alert was firing."
    layers.append(lines)
    if limit_s is not None:
        label = f"SLO limit {number_text(limit_s)} s"
        layers += level_rule(limit_s, label=label, color=LIMIT_COLOR)
        what += f" Dashed: {label}."
    chart = (
        alt.layer(*layers)
        .resolve_scale(color="independent")
        .properties(width=WIDTH_PX, height=HEIGHT_PX)
    )
    return titled(
        chart, title=stat.title, subtitle=[s for s in (what, buckets.note(reduction)) if s]
    )
