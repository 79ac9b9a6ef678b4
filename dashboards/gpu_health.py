"""GPU health: tensor-core activity, power and temperature across the fleet, with XID events.

Input is per replica and minute, the replica's GPUs already combined as the DCGM join does
under tensor parallelism (mean activity, summed power, hottest GPU). Each panel draws the mean
over replicas and a band from the lowest to the highest replica, so one hot or idle replica
stands out without 45 lines. XID events (DCGM's `XID_ERRORS`: the code of the last XID) are
drawn as red rules across every panel, labelled with code and replica on the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import (
    MINUTE_TS,
    REPLICA,
    Column,
    ColumnKind,
    FrameContract,
    time_column,
)
from servewatch.dashboards.downsampling import (
    MAX_POINTS_PER_SERIES,
    Reduction,
    TimeBuckets,
    bucket_start,
    buckets_for,
)
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    WIDTH_PX,
    TimeDomain,
    compact,
    data_chart,
    epoch_ms,
    inline_values,
    time_tooltip,
    time_x,
    titled,
)

XID_COLOR = "#d62728"

GPU_CONTRACT = FrameContract(
    "GPU health chart",
    (
        MINUTE_TS,
        REPLICA,
        Column("tensor_active_ratio", ColumnKind.NUMBER, "mean tensor-pipe activity, 0-1"),
        Column("power_w", ColumnKind.NUMBER, "mean power of the replica's GPUs summed, W"),
        Column("temperature_c", ColumnKind.NUMBER, "hottest GPU of the replica, Celsius"),
    ),
)
XID_CONTRACT = FrameContract(
    "GPU health chart (XID events)",
    (
        time_column("ts", "when the XID was seen, naive UTC"),
        REPLICA,
        Column("xid", ColumnKind.NUMBER, "XID code"),
    ),
)


@dataclass(frozen=True)
class _Signal:
    column: str
    title: str
    axis: alt.Axis
    tooltip_format: str


SIGNALS: tuple[_Signal, ...] = (
    _Signal("tensor_active_ratio", "tensor activity (%)", alt.Axis(format=".0%"), ".1%"),
    _Signal("power_w", "power per replica (W)", alt.Axis(), ",.0f"),
    _Signal("temperature_c", "temperature (°C)", alt.Axis(), ".1f"),
)


def _panel(
    rows: pl.DataFrame,
    signal: _Signal,
    *,
    buckets: TimeBuckets,
    domain: TimeDomain | None,
    xids: pl.DataFrame | None,
    label_xids: bool,
) -> Any:
    per_replica = rows.group_by(bucket_start("minute_ts", buckets).alias("bucket"), "replica").agg(
        Reduction.MEAN.expr(signal.column)
    )
    data = compact(
        per_replica.group_by("bucket")
        .agg(
            mean=pl.col(signal.column).mean(),
            lowest=pl.col(signal.column).min(),
            highest=pl.col(signal.column).max(),
        )
        .select(epoch_ms("bucket").alias("ts"), "mean", "lowest", "highest")
        .sort("ts")
    )
    # One copy of the rows for both layers: they are set on the layer, not on each mark.
    base = alt.Chart().encode(time_x(domain=domain))
    band = base.mark_area(opacity=0.25, color="#4c78a8").encode(
        alt.Y("lowest:Q", title=signal.title, axis=signal.axis), alt.Y2("highest:Q")
    )
    line = base.mark_line(color="#4c78a8", point=buckets.minutes <= 30).encode(
        alt.Y("mean:Q", title=signal.title, axis=signal.axis),
        tooltip=[
            time_tooltip(),
            alt.Tooltip("mean:Q", title="mean over replicas", format=signal.tooltip_format),
            alt.Tooltip("lowest:Q", title="lowest replica", format=signal.tooltip_format),
            alt.Tooltip("highest:Q", title="highest replica", format=signal.tooltip_format),
        ],
    )
    layers: list[Any] = [alt.layer(band, line, data=inline_values(data))]
    if xids is not None and not xids.is_empty():
        rules = (
            data_chart(xids)
            .mark_rule(color=XID_COLOR, strokeWidth=1.5)
            .encode(
                time_x(domain=domain),
                tooltip=[time_tooltip(), "replica:N", alt.Tooltip("xid:Q", title="XID")],
            )
        )
        layers.append(rules)
        if label_xids:
            layers.append(
                data_chart(xids)
                .mark_text(align="left", baseline="top", dx=3, dy=2, color=XID_COLOR)
                .encode(time_x(domain=domain), y=alt.value(0), text="label:N")
            )
    return alt.layer(*layers).properties(width=WIDTH_PX, height=HEIGHT_PX // 2 + 30)


def gpu_health_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    xid_events: pl.DataFrame | pl.LazyFrame | None = None,
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    rows = GPU_CONTRACT.select(frame)
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    xids = None
    if xid_events is not None:
        events = XID_CONTRACT.select(xid_events)
        xids = events.select(
            epoch_ms("ts").alias("ts"),
            "replica",
            pl.col("xid").cast(pl.Int64),
            label=pl.format("XID {} {}", pl.col("xid").cast(pl.Int64), pl.col("replica")),
        ).sort("ts", "replica")
    panels = [
        _panel(rows, signal, buckets=buckets, domain=domain, xids=xids, label_xids=index == 0)
        for index, signal in enumerate(SIGNALS)
    ]
    replicas = rows["replica"].n_unique()
    subtitle = [
        (
            f"Per {buckets.label}: mean over {replicas} replicas (line), lowest to highest replica "
            "(band). Red rules: XID events."
        ),
        buckets.note_with("mean of its minutes per replica before the fleet is summarised"),
    ]
    chart = alt.vconcat(*panels).resolve_scale(x="shared")
    return titled(chart, title="GPU health (DCGM)", subtitle=[s for s in subtitle if s])
