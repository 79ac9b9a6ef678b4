"""GPUs serving no replica: the DCGM GPUs (and MIG slices) that `gpu_attribution` gave to no
replica, one printed row each with why and what they drew over the window.

They are in no replica's figures and in no fleet total, so a report that drew only the
replicas' GPUs would hide an idle card, another workload's GPUs or a pod mapping gone wrong.
Input is `pipeline.gpu_attribution.unmatched_gpu_readings`.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import Column, ColumnKind, FrameContract
from servewatch.dashboards.panel import ROW_PX, WIDTH_PX, data_chart, titled
from servewatch.pipeline.gpu_attribution import JoinRule

WHY = {
    JoinRule.UNMATCHED.value: "no replica on its host claims it",
    JoinRule.AMBIGUOUS.value: "two replicas claim it alike",
    JoinRule.OTHER_WORKLOAD.value: "its pod is no replica's",
}
HEADERS = ("host", "GPU UUID", "MIG", "pod", "why", "mean W", "mean util")
# Left edge of each column, px.
COLUMN_X = (0, 110, 300, 340, 440, 560, 610)

UNMATCHED_CONTRACT = FrameContract(
    "GPUs serving no replica",
    (
        Column("hostname", ColumnKind.TEXT, "the GPU's node"),
        Column("uuid", ColumnKind.TEXT, "the GPU's UUID"),
        Column("rule", ColumnKind.TEXT, "why no replica has it: unmatched, ambiguous, ..."),
    ),
    optional=(
        Column("gpu_instance", ColumnKind.TEXT, "MIG GPU instance id"),
        Column("pod", ColumnKind.TEXT, "the pod DCGM named"),
        Column("namespace", ColumnKind.TEXT, "the pod's namespace"),
        Column("gpu_power_w_mean", ColumnKind.NUMBER, "mean power over the window, W"),
        Column("gpu_util_ratio_mean", ColumnKind.NUMBER, "mean utilisation, 0-1"),
    ),
)


def _text(value: Any, *, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def unmatched_rows(frame: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """The table's cells: row (0 is the header), column (index into HEADERS), text."""
    rows = UNMATCHED_CONTRACT.select(frame).sort("hostname", "uuid", nulls_last=True)
    cells: list[tuple[int, int, str]] = [(0, i, h) for i, h in enumerate(HEADERS)]
    for n, row in enumerate(rows.iter_rows(named=True), start=1):
        pod = row.get("pod")
        values = (
            _text(row["hostname"]),
            _text(row["uuid"]),
            _text(row.get("gpu_instance")),
            "-" if pod is None else f"{row.get('namespace') or '?'}/{pod}",
            WHY.get(row["rule"], row["rule"]),
            _text(row.get("gpu_power_w_mean"), fmt="{:,.0f}"),
            _text(row.get("gpu_util_ratio_mean"), fmt="{:.0%}"),
        )
        cells += [(n, i, v) for i, v in enumerate(values)]
    return pl.DataFrame(
        {
            "row": [c[0] for c in cells],
            "x": [COLUMN_X[c[1]] for c in cells],
            "text": [c[2] for c in cells],
            "header": [c[0] == 0 for c in cells],
        }
    )


def gpu_unmatched_chart(frame: pl.DataFrame | pl.LazyFrame) -> Any:
    cells = unmatched_rows(frame)
    gpus = cells.filter(~pl.col("header"))["row"].n_unique()
    if gpus == 0:
        raise ValueError("GPUs serving no replica: there are no such GPUs to list")
    y = alt.Y("row:O", axis=None)
    layers = [
        data_chart(cells.filter(pl.col("header") == header))
        .mark_text(align="left", baseline="middle", limit=0, fontWeight=weight)
        .encode(y, x=alt.X("x:Q", axis=None, scale=None), text="text:N")
        for header, weight in ((True, "bold"), (False, "normal"))
    ]
    chart = alt.layer(*layers).properties(width=WIDTH_PX, height=ROW_PX * (gpus + 1) + 8)
    subtitle = [
        (
            f"{gpus} GPU(s) or MIG slice(s) that DCGM reports but no replica was given: in no "
            "replica's GPU figures and in no fleet total. Means over the window."
        ),
    ]
    return titled(chart, title="GPUs serving no replica", subtitle=subtitle)
