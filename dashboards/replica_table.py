"""Replica table: which replica is bad. Per replica: SLO attainment, p95 TTFT and TPOT, its
share of the fleet's requests, and its GPUs' figures; as a sortable table and as small
multiples, the worst attainment first.

Rows come from the SLI report by replica: traced requests for attainment, latency and load,
the scraped series for GPU figures. GPU figures are the GPUs attributed to the replica
(`pipeline.gpu_attribution`), never its host's total; a replica with no attributed GPU shows
none. Ties and the name column sort naturally (vllm-2 before vllm-10).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.panel import data_chart, titled
from servewatch.pipeline.natural_sort import natural_key

REPLICA_ROWS_SCHEMA = pl.Schema(
    {
        "replica": pl.String(),
        "requests": pl.Int64(),
        "failed_requests": pl.Int64(),
        "load_share_ratio": pl.Float64(),
        "attainment_ratio": pl.Float64(),
        "ttft_p95_s": pl.Float64(),
        "tpot_p95_s": pl.Float64(),
        "gpu_util_ratio": pl.Float64(),
        "gpu_power_w": pl.Float64(),
        "gpu_fb_used_bytes": pl.Float64(),
        "gpu_temperature_c": pl.Float64(),
    }
)
GPU_COLUMNS = ("gpu_util_ratio", "gpu_power_w", "gpu_fb_used_bytes", "gpu_temperature_c")
PANEL_WIDTH_PX = 150
BAR_PX = 16
BAD_COLOR = "#d62728"
GOOD_COLOR = "#4c78a8"


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _mean(block: Mapping[str, Any] | None, key: str, stat: str = "mean") -> float | None:
    if not block:
        return None
    inner = block.get(key)
    return _number(inner.get(stat)) if isinstance(inner, Mapping) else None


def replica_rows(sli_report: Mapping[str, Any] | None) -> pl.DataFrame:
    """One row per replica, worst attainment first (a replica without requests last), ties in
    natural order. Empty when the report is not by replica."""
    if sli_report is None or sli_report.get("by") != "replica":
        return pl.DataFrame(schema=REPLICA_ROWS_SCHEMA)
    groups = [g for g in sli_report.get("groups", []) if g.get("replica") is not None]
    scraped = {
        g["replica"]: g
        for g in (sli_report.get("histograms") or {}).get("groups", [])
        if g.get("replica") is not None
    }
    total = sum(int(g.get("requests") or 0) for g in groups)
    rows = []
    for name in {*(g["replica"] for g in groups), *scraped}:
        traced: Mapping[str, Any] = next((g for g in groups if g["replica"] == name), {})
        gpu = scraped.get(name)
        requests = int(traced.get("requests") or 0)
        rows.append(
            {
                "replica": str(name),
                "requests": requests,
                "failed_requests": int(traced.get("failed_requests") or 0),
                "load_share_ratio": requests / total if total else None,
                "attainment_ratio": _number(traced.get("attainment_ratio")),
                "ttft_p95_s": _number((traced.get("ttft_s") or {}).get("p95")),
                "tpot_p95_s": _number((traced.get("tpot_s") or {}).get("p95")),
                "gpu_util_ratio": _mean(gpu, "gpu_util_ratio"),
                "gpu_power_w": _mean(gpu, "gpu_power_w"),
                "gpu_fb_used_bytes": _mean(gpu, "gpu_fb_used_bytes"),
                "gpu_temperature_c": _mean(gpu, "gpu_temperature_c", "max"),
            }
        )

    def badness(row: dict[str, Any]) -> tuple[int, float, tuple[tuple[int, int | str], ...]]:
        ratio = row["attainment_ratio"]
        return (ratio is None, 0.0 if ratio is None else ratio, natural_key(row["replica"]))

    return pl.DataFrame(sorted(rows, key=badness), schema=REPLICA_ROWS_SCHEMA)


def has_gpu_figures(rows: pl.DataFrame) -> bool:
    return any(rows[c].drop_nulls().len() > 0 for c in GPU_COLUMNS)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def _plain(digits: int) -> Callable[[float | None], str]:
    return lambda value: "-" if value is None else f"{value:,.{digits}f}"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:,.1f}"


COLUMNS: tuple[tuple[str, str, Callable[[float | None], str]], ...] = (
    ("attainment_ratio", "attainment", _pct),
    ("ttft_p95_s", "TTFT p95 ms", _ms),
    ("tpot_p95_s", "TPOT p95 ms", _ms),
    ("requests", "requests", _plain(0)),
    ("failed_requests", "failed", _plain(0)),
    ("load_share_ratio", "load share", _pct),
    ("gpu_util_ratio", "GPU util", _pct),
    ("gpu_power_w", "GPU W", _plain(0)),
    ("gpu_fb_used_bytes", "GPU memory GiB", _gib),
    ("gpu_temperature_c", "GPU max °C", _plain(0)),
)


def is_bad(row: Mapping[str, Any], *, objective_ratio: float | None) -> bool:
    ratio = row["attainment_ratio"]
    return objective_ratio is not None and ratio is not None and ratio < objective_ratio


def replica_table_html(rows: pl.DataFrame, *, objective_ratio: float | None = None) -> str:
    """The sortable table (the page's script sorts on a header click, by each cell's
    `data-value`); rows below `objective_ratio` are marked bad."""
    if rows.is_empty():
        return ""
    gpu = has_gpu_figures(rows)
    columns = [c for c in COLUMNS if gpu or c[0] not in GPU_COLUMNS]
    head = '<th data-sort="text">replica</th>' + "".join(
        f'<th data-sort="number">{html.escape(title)}</th>' for _, title, _ in columns
    )
    body = []
    for row in rows.iter_rows(named=True):
        bad = is_bad(row, objective_ratio=objective_ratio)
        cells = "".join(
            f'<td data-value="{"" if row[key] is None else repr(float(row[key]))}">'
            f"{html.escape(render(row[key]))}</td>"
            for key, _, render in columns
        )
        mark = ' class="bad"' if bad else ""
        body.append(
            f'<tr{mark} data-replica="{html.escape(row["replica"])}">'
            f'<th data-value="{html.escape(row["replica"])}">{html.escape(row["replica"])}'
            f"{' (below objective)' if bad else ''}</th>{cells}</tr>"
        )
    notes = [
        (
            "Worst attainment first; click a header to sort. Attainment: requests that met every "
            "latency limit; load share: the replica's share of the fleet's traced requests."
        )
    ]
    if objective_ratio is not None:
        notes.append(f"Marked: below the objective of {objective_ratio:.2%}.")
    if not gpu:
        notes.append(
            "No GPU figures: no DCGM GPU is attributed to a replica (see the facts for GPUs "
            "that serve none)."
        )
    else:
        notes.append("GPU figures: the replica's own GPUs (means over the window), not its host's.")
    return (
        f'<table class="sortable replicas" id="replica-table"><caption>'
        f"{html.escape(' '.join(notes))}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def replica_chart(rows: pl.DataFrame, *, objective_ratio: float | None = None) -> Any:
    """Small multiples: one bar panel per figure, the replicas down the side in the table's
    order (worst first), bad ones in red."""
    order = rows["replica"].to_list()
    panels: list[tuple[str, str, str]] = [
        ("attainment_ratio", "attainment", ".1%"),
        ("ttft_p95_s", "TTFT p95 (s)", ".3f"),
        ("tpot_p95_s", "TPOT p95 (s)", ".3f"),
        ("load_share_ratio", "load share", ".1%"),
    ]
    if has_gpu_figures(rows):
        panels += [("gpu_util_ratio", "GPU util", ".0%"), ("gpu_power_w", "GPU W", ",.0f")]
    data = rows.with_columns(
        bad=pl.Series(
            [is_bad(r, objective_ratio=objective_ratio) for r in rows.iter_rows(named=True)],
            dtype=pl.Boolean,
        )
    ).with_columns(
        flag=pl.when(pl.col("bad")).then(pl.lit("below objective")).otherwise(pl.lit("ok"))
    )
    charts = []
    for index, (column, title, fmt) in enumerate(panels):
        charts.append(
            data_chart(data.select("replica", "flag", column))
            .mark_bar()
            .encode(
                alt.Y(
                    "replica:N",
                    sort=order,
                    title=None,
                    axis=alt.Axis(labels=index == 0, ticks=index == 0),
                ),
                alt.X(f"{column}:Q", title=title, axis=alt.Axis(format=fmt, tickCount=3)),
                alt.Color(
                    "flag:N",
                    title="replica",
                    scale=alt.Scale(
                        domain=["below objective", "ok"], range=[BAD_COLOR, GOOD_COLOR]
                    ),
                    legend=alt.Legend(orient="bottom"),
                ),
                tooltip=["replica:N", alt.Tooltip(f"{column}:Q", title=title, format=fmt)],
            )
            .properties(width=PANEL_WIDTH_PX, height=BAR_PX * max(len(order), 1))
        )
    chart = alt.hconcat(*charts, spacing=8)
    subtitle = [
        "Per replica over the window, worst attainment first: SLO attainment, p95 TTFT and "
        "TPOT from traced requests, share of the fleet's requests"
        + (", and GPU figures of its own GPUs." if has_gpu_figures(rows) else "."),
    ]
    return titled(chart, title="Replicas side by side", subtitle=subtitle)
