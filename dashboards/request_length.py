"""Request lengths: prompt and generation token counts as a distribution over time.

Like vLLM's dashboard heatmaps of `request_prompt_tokens` and `request_generation_tokens`, the
input is a histogram per minute: requests per length bucket, each bucket named by its upper
bound `le_tokens` (counts per bucket, not cumulative; +inf for the last). A histogram's minute
increases fit as they are; traced requests are binned by `lengths_from_requests` on vLLM's own
1-2-5 bounds. Beside the heatmap, the window's total per bucket.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import MAX_POINTS_PER_SERIES, bucket_start, buckets_for
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    WIDTH_PX,
    TimeDomain,
    compact,
    data_chart,
    epoch_ms,
    time_tooltip,
    time_x,
    titled,
)

MAX_CELLS = 8_000
# vLLM's length histogram buckets: 1, 2, 5, 10, 20, 50, ... (up to max_model_len).
BOUNDS_TOKENS: tuple[float, ...] = (
    *tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5)),
    math.inf,
)


class LengthKind(Enum):
    PROMPT = "prompt"
    GENERATION = "generation"

    @property
    def request_column(self) -> str:
        return "prompt_tokens" if self is LengthKind.PROMPT else "completion_tokens"

    @property
    def title(self) -> str:
        return "Prompt length" if self is LengthKind.PROMPT else "Generation (output) length"


LENGTH_CONTRACT = FrameContract(
    "request length chart",
    (
        MINUTE_TS,
        Column("le_tokens", ColumnKind.NUMBER, "upper bound of the length bucket in tokens"),
        Column(
            "requests", ColumnKind.NUMBER, "requests in the bucket that minute (not cumulative)"
        ),
    ),
)


def lengths_from_requests(requests: pl.LazyFrame, *, kind: LengthKind) -> pl.LazyFrame:
    """Requests per minute (of arrival) and vLLM length bucket."""
    bounds = pl.Series("le_tokens", BOUNDS_TOKENS)
    tokens = pl.col(kind.request_column).cast(pl.Float64)
    return (
        requests.filter(pl.col(kind.request_column).is_not_null())
        .select(minute_ts=pl.col("arrival_ts").dt.truncate("1m"), tokens=tokens)
        .with_columns(
            le_tokens=pl.lit(bounds).gather(
                pl.lit(bounds).search_sorted(pl.col("tokens"), side="left")
            )
        )
        .group_by("minute_ts", "le_tokens")
        .agg(pl.len().cast(pl.Int64).alias("requests"))
        .sort("minute_ts", "le_tokens")
    )


def _bucket_label(le_tokens: float, previous: float | None) -> str:
    if math.isinf(le_tokens):
        return f"> {previous:,.0f}" if previous is not None else "any"
    low = 0 if previous is None else previous
    return f"{low:,.0f}-{le_tokens:,.0f}" if low + 1 < le_tokens else f"{le_tokens:,.0f}"


def request_length_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    kind: LengthKind,
    source: str = "vLLM length histogram",
    domain: TimeDomain | None = None,
) -> Any:
    rows = LENGTH_CONTRACT.select(frame).filter(pl.col("requests") > 0)
    bounds = sorted(set(rows["le_tokens"].to_list()))
    # Label by the real lower edge (the next lower bucket bound), not the next observed one.
    every = sorted(set(bounds) | set(BOUNDS_TOKENS))
    labels = {le: _bucket_label(le, _previous(every, le)) for le in bounds}
    order = [labels[le] for le in reversed(bounds)]
    per_row = min(MAX_POINTS_PER_SERIES, max(1, MAX_CELLS // max(len(bounds), 1)))
    buckets = buckets_for(rows, domain=domain, max_points=per_row)
    label = pl.col("le_tokens").replace_strict(labels, return_dtype=pl.String).alias("length")
    cells = compact(
        rows.group_by(bucket_start("minute_ts", buckets).alias("bucket"), "le_tokens")
        .agg(pl.col("requests").sum())
        .select(
            epoch_ms("bucket").alias("ts"),
            (epoch_ms("bucket") + buckets.width_s * 1000).alias("ts_end"),
            label,
            "requests",
        )
        .sort("ts", "length")
    )
    totals = (
        rows.group_by("le_tokens").agg(pl.col("requests").sum()).select(label, "requests")
    ).sort("length")
    y = alt.Y("length:O", title=f"{kind.value} length (tokens)", sort=order)
    height = max(HEIGHT_PX, 16 * len(bounds))
    heat = (
        data_chart(cells)
        .mark_rect()
        .encode(
            time_x(domain=domain),
            alt.X2("ts_end:T"),
            y,
            alt.Color(
                "requests:Q",
                title=f"requests per {buckets.label}",
                scale=alt.Scale(type="sqrt", scheme="oranges"),
            ),
            tooltip=[
                time_tooltip(),
                alt.Tooltip("length:O", title="length (tokens)"),
                alt.Tooltip("requests:Q", format=",.0f"),
            ],
        )
        .properties(width=WIDTH_PX - 180, height=height)
    )
    bars = (
        data_chart(totals)
        .mark_bar(color="#f58518")
        .encode(
            alt.X("requests:Q", title="requests in window (count)"),
            alt.Y("length:O", sort=order, axis=None),
            tooltip=[alt.Tooltip("length:O", title="length (tokens)"), "requests:Q"],
        )
        .properties(width=140, height=height)
    )
    subtitle = [
        (
            f"Requests per {kind.value} length bucket (tokens) per {buckets.label}, from {source}; "
            "right: the whole window."
        ),
        buckets.note_with("total of its minutes"),
    ]
    chart = alt.hconcat(heat, bars).resolve_scale(color="independent")
    return titled(chart, title=kind.title, subtitle=[s for s in subtitle if s])


def _previous(bounds: list[float], le: float) -> float | None:
    lower = [b for b in bounds if b < le]
    return lower[-1] if lower else None
