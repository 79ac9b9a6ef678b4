"""Capacity curve: per-replica latency against load, the fitted line, its knee and the SLO limit.

Points are the windows the capacity fit used (one per replica and window: load and a latency
percentile). `CapacityCurve` is the fit: latency = intercept + slope x load, the knee (the load
where the line meets the limit: the capacity at the SLO) and the knee's confidence interval,
field for field as `capacity.capacity_fit.CapacityFit` has them. The line is solid over the
observed loads and dashed beyond: a knee past the data is an extrapolation and the chart shows
it as one. A fleet-day holds tens of thousands of windows; above `MAX_POINTS` an evenly spaced
sample is drawn and the subtitle says how many (the fit itself used all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import REPLICA, Column, ColumnKind, FrameContract
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    WIDTH_PX,
    compact,
    data_chart,
    level_rule,
    number_text,
    titled,
)

MAX_POINTS = 4_000
LIMIT_COLOR = "#c0392b"
KNEE_COLOR = "#2ca02c"

CAPACITY_POINTS_CONTRACT = FrameContract(
    "capacity curve chart",
    (
        Column("load", ColumnKind.NUMBER, "load on one replica in the window, in the fit's unit"),
        Column("latency_s", ColumnKind.NUMBER, "the fitted latency percentile, seconds"),
    ),
    optional=(REPLICA,),
)


@dataclass(frozen=True)
class CapacityCurve:
    intercept_s: float
    slope_s_per_load: float
    knee_load: float
    knee_low_load: float
    knee_high_load: float
    latency_limit_s: float
    load_unit: str
    confidence_ratio: float
    latency_label: str = "p95 latency"

    def __post_init__(self) -> None:
        if not self.latency_limit_s > 0:
            raise ValueError(f"capacity curve: latency limit {self.latency_limit_s!r}; allowed > 0")
        if not 0 < self.confidence_ratio < 1:
            raise ValueError(
                f"capacity curve: confidence {self.confidence_ratio!r}; allowed: between 0 and 1"
            )

    def latency_at(self, load: float) -> float:
        return self.intercept_s + self.slope_s_per_load * load


def _sample(rows: pl.DataFrame, max_points: int) -> tuple[pl.DataFrame, int]:
    stride = math.ceil(rows.height / max_points) if rows.height > max_points else 1
    return rows.gather_every(stride), stride


def capacity_curve_chart(
    points: pl.DataFrame | pl.LazyFrame,
    *,
    curve: CapacityCurve,
    max_points: int = MAX_POINTS,
) -> Any:
    rows = CAPACITY_POINTS_CONTRACT.select(points).filter(
        pl.col("load").is_finite() & pl.col("latency_s").is_finite()
    )
    if rows.is_empty():
        raise ValueError("capacity curve chart: no finite (load, latency_s) points")
    load_max = float(rows["load"].max())  # type: ignore[arg-type]
    shown, stride = _sample(rows, max_points)
    unit = curve.load_unit
    x_title = f"load per replica ({unit})"
    y_title = f"{curve.latency_label} (s)"
    scatter = (
        data_chart(compact(shown.select("load", "latency_s")))
        .mark_circle(size=14, opacity=0.35, color="#4c78a8")
        .encode(
            alt.X("load:Q", title=x_title),
            alt.Y("latency_s:Q", title=y_title),
            tooltip=[
                alt.Tooltip("load:Q", title=x_title, format=".3g"),
                alt.Tooltip("latency_s:Q", title=y_title, format=".3g"),
            ],
        )
    )
    knee_known = math.isfinite(curve.knee_load)
    right = load_max
    if knee_known:
        right = max(right, curve.knee_load)
    if math.isfinite(curve.knee_high_load):
        right = max(right, curve.knee_high_load)
    right *= 1.1
    ends = [(0.0, load_max, "observed"), (load_max, right, "extrapolated")]
    line_rows = pl.DataFrame(
        {
            "load": [x for lo, hi, _ in ends for x in (lo, hi)],
            "latency_s": [curve.latency_at(x) for lo, hi, _ in ends for x in (lo, hi)],
            "part": [part for _, _, part in ends for _ in range(2)],
        }
    )
    line = (
        data_chart(compact(line_rows))
        .mark_line(color="#1f3b63", strokeWidth=2)
        .encode(
            x="load:Q",
            y="latency_s:Q",
            detail="part:N",
            strokeDash=alt.StrokeDash(
                "part:N",
                title="fitted line",
                scale=alt.Scale(domain=["observed", "extrapolated"], range=[[1, 0], [6, 4]]),
            ),
        )
    )
    layers: list[Any] = []
    subtitle = [
        (
            f"Each dot: one replica-window; line: {curve.latency_label} = "
            f"{number_text(curve.intercept_s)} s + {curve.slope_s_per_load:.3g} s per {unit} "
            "(dashed past the highest observed load)."
        ),
    ]
    if knee_known:
        low = curve.knee_low_load if math.isfinite(curve.knee_low_load) else 0.0
        high = curve.knee_high_load if math.isfinite(curve.knee_high_load) else right
        interval = pl.DataFrame({"low": [low], "high": [high]})
        layers.append(
            data_chart(interval)
            .mark_rect(opacity=0.15, color=KNEE_COLOR)
            .encode(x="low:Q", x2="high:Q")
        )
        knee = pl.DataFrame(
            {"knee": [curve.knee_load], "label": [f"knee {number_text(curve.knee_load)} {unit}"]}
        )
        layers.append(
            data_chart(knee).mark_rule(color=KNEE_COLOR, strokeWidth=2).encode(x="knee:Q")
        )
        layers.append(
            data_chart(knee)
            .mark_text(align="left", baseline="top", dx=4, dy=4, color=KNEE_COLOR)
            .encode(x="knee:Q", y=alt.value(0), text="label:N")
        )
        where = (
            f"extrapolated, {curve.knee_load / load_max:.1f}x the highest observed load"
            if curve.knee_load > load_max
            else "within the observed loads"
        )
        subtitle.append(
            f"Knee (capacity at the SLO): {number_text(curve.knee_load)} {unit}, {where}; "
            f"shaded: its {curve.confidence_ratio:.0%} interval "
            f"{number_text(curve.knee_low_load)} to {number_text(curve.knee_high_load)}."
        )
    else:
        subtitle.append("Latency did not rise with load: no knee can be located.")
    layers += [scatter, line]
    limit_label = f"SLO limit {number_text(curve.latency_limit_s)} s"
    layers += level_rule(curve.latency_limit_s, label=limit_label, color=LIMIT_COLOR)
    if stride > 1:
        subtitle.append(
            f"Sampled: every {stride}th of {rows.height:,} windows drawn "
            f"({shown.height:,}); the fit used all of them."
        )
    chart = alt.layer(*layers).properties(width=WIDTH_PX, height=HEIGHT_PX + 60)
    return titled(
        chart, title=f"Capacity: {curve.latency_label} against load per replica", subtitle=subtitle
    )
