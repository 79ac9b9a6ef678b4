"""GPU replicas: the DCGM exporter dashboard's panels (Grafana 12239), one row per replica.

NVIDIA's dashboard draws a line per GPU of temperature, power, SM clock, utilisation
(`DCGM_FI_PROF_GR_ENGINE_ACTIVE`), tensor-core activity and framebuffer used, with the fleet's
mean temperature and total power as gauges. Here each panel is a heatmap of replicas against
time, since the question is which replica, and a line per GPU of a large fleet hides it. Input
is per replica and minute, each replica's GPUs already folded as `gpu_attribution` folds them
under tensor parallelism (power and memory summed, the hottest GPU, ratios and clocks the
mean); only GPUs attributed to a replica count, never a host's total, and GPUs that serve no
replica are listed apart (`gpu_unmatched`). A signal no GPU reported is named in the subtitle
rather than drawn empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import altair as alt
import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, REPLICA, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import (
    MAX_POINTS_PER_SERIES,
    Reduction,
    bucket_start,
    buckets_for,
)
from servewatch.dashboards.panel import (
    ROW_PX,
    TimeDomain,
    bucket_span,
    compact,
    natural_order,
    number_text,
    time_heatmap,
    titled,
)

# Heatmap cells per panel, as for KV-cache usage.
MAX_CELLS = 20_000
GIB = 1024.0**3


Scheme = Literal["viridis", "oranges", "reds", "blues", "greens"]


@dataclass(frozen=True)
class GpuPanel:
    """One of the dashboard's panels: the frame's column, its title and how it is shown."""

    column: str
    title: str
    legend: str
    folded: str  # how a replica's GPUs combine
    scale: float = 1.0  # the column's unit into the shown one
    legend_format: str = ",.0f"
    scheme: Scheme = "viridis"


PANELS: tuple[GpuPanel, ...] = (
    GpuPanel("gpu_util_ratio", "GPU utilisation", "utilisation (%)", "mean", legend_format=".0%"),
    GpuPanel(
        "graphics_active_ratio",
        "Graphics engine active",
        "engine active (%)",
        "mean",
        legend_format=".0%",
    ),
    GpuPanel(
        "tensor_active_ratio",
        "Tensor core utilisation",
        "tensor active (%)",
        "mean",
        legend_format=".0%",
    ),
    GpuPanel("power_w", "GPU power", "power (W)", "sum", scheme="oranges"),
    GpuPanel("temperature_c", "GPU temperature", "temperature (°C)", "hottest", scheme="reds"),
    GpuPanel("sm_clock_hz", "SM clock", "SM clock (MHz)", "mean", scale=1e-6),
    GpuPanel(
        "fb_used_bytes",
        "Framebuffer memory used",
        "memory used (GiB)",
        "sum",
        scale=1 / GIB,
        legend_format=",.1f",
        scheme="blues",
    ),
    GpuPanel(
        "fb_free_bytes",
        "Framebuffer memory free",
        "memory free (GiB)",
        "sum",
        scale=1 / GIB,
        legend_format=",.1f",
        scheme="greens",
    ),
)

GPU_REPLICAS_CONTRACT = FrameContract(
    "GPU per-replica panels",
    (MINUTE_TS, REPLICA),
    optional=tuple(
        Column(p.column, ColumnKind.NUMBER, f"{p.title}, {p.folded} of the replica's GPUs")
        for p in PANELS
    ),
)


def fleet_figures(rows: pl.DataFrame) -> list[str]:
    """The dashboard's two gauges over the window: mean GPU temperature (here the mean of each
    replica's hottest GPU) and the fleet's power (the replicas' summed power, window mean)."""
    figures = []
    if _reported(rows, "temperature_c"):
        mean_c = rows.select(pl.col("temperature_c").mean()).item()
        figures.append(f"mean of the replicas' hottest GPUs {number_text(float(mean_c))} °C")
    if _reported(rows, "power_w"):
        per_minute = rows.group_by("minute_ts").agg(pl.col("power_w").sum())
        total = per_minute.select(pl.col("power_w").mean()).item()
        figures.append(f"fleet power {number_text(float(total))} W on average")
    return figures


def _reported(rows: pl.DataFrame, column: str) -> bool:
    return column in rows.columns and rows[column].drop_nulls().len() > 0


def _panel(
    rows: pl.DataFrame, panel: GpuPanel, *, replicas: list[str], domain: TimeDomain | None
) -> Any:
    per_row = min(MAX_POINTS_PER_SERIES, max(1, MAX_CELLS // max(len(replicas), 1)))
    buckets = buckets_for(rows, domain=domain, max_points=per_row)
    data = compact(
        rows.drop_nulls(panel.column)
        .group_by(bucket_start("minute_ts", buckets).alias("bucket"), "replica")
        .agg(Reduction.MEAN.expr(panel.column))
        .select(
            *bucket_span(buckets.width_s),
            "replica",
            (pl.col(panel.column) * panel.scale).alias("value"),
        )
        .sort("replica", "ts")
    )
    return time_heatmap(
        data,
        y=alt.Y("replica:N", title="replica", sort=replicas),
        color=alt.Color(
            "value:Q",
            title=panel.legend,
            scale=alt.Scale(scheme=panel.scheme),
            legend=alt.Legend(format=panel.legend_format),
        ),
        tooltip=[
            alt.Tooltip("replica:N"),
            alt.Tooltip("value:Q", title=panel.legend, format=panel.legend_format),
        ],
        domain=domain,
        height_px=max(60, ROW_PX * len(replicas)),
    ).properties(
        title=alt.TitleParams(f"{panel.title} ({panel.folded} of each replica's GPUs)", fontSize=11)
    )


def _sentence(parts: list[str]) -> str:
    if not parts:
        return ""
    text = "; ".join(parts)
    return f"Over the window: {text}."


def gpu_replicas_chart(
    frame: pl.DataFrame | pl.LazyFrame, *, domain: TimeDomain | None = None
) -> Any:
    rows = GPU_REPLICAS_CONTRACT.select(frame)
    replicas = natural_order([r for r in rows["replica"].to_list() if r is not None])
    shown = [p for p in PANELS if _reported(rows, p.column)]
    if not shown or not replicas:
        raise ValueError("GPU per-replica panels: no replica has a DCGM reading to draw")
    missing = [p.title.lower() for p in PANELS if p not in shown]
    buckets = buckets_for(
        rows,
        domain=domain,
        max_points=min(MAX_POINTS_PER_SERIES, max(1, MAX_CELLS // len(replicas))),
    )
    subtitle = [
        (
            f"DCGM readings per replica and {buckets.label}, from the GPUs attributed to it "
            "(never its host's other GPUs): power and memory summed over its GPUs, the hottest "
            "GPU's temperature, the mean of ratios and clocks."
        ),
        _sentence(fleet_figures(rows)),
        f"Not reported by any GPU: {', '.join(missing)}." if missing else "",
        buckets.note(Reduction.MEAN),
    ]
    chart = alt.vconcat(
        *(_panel(rows, p, replicas=replicas, domain=domain) for p in shown)
    ).resolve_scale(color="independent", x="shared")
    return titled(chart, title="GPUs per replica (DCGM)", subtitle=[s for s in subtitle if s])
