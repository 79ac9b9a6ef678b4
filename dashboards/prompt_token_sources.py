"""Prompt tokens by source: how much of the fleet's prompt work was prefilled, found in a
prefix cache, or received over a KV connector, as stacked tokens per second over time.

Input is `pipeline.prompt_token_sources` output: per minute, counter (`prompt` for vLLM's
`prompt_tokens_by_source_total`, `cached` for `prompt_tokens_cached_by_source_total`), the
engine's `source` label and the tokens counted. A bucket's rate is its tokens over its length
(counts add, so downsampling is exact); the increases were already spread over their scrape
intervals, so buckets not aligned to scrapes draw the traffic, not the scrape schedule. A
second panel, when the engine exports it, splits the cached tokens by the tier that held them.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import (
    MAX_POINTS_PER_SERIES,
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
    time_tooltip,
    time_x,
    titled,
)
from servewatch.pipeline.prompt_token_sources import SourceCounter

# vLLM's own values first, in the order work is saved: computed, then found, then fetched.
SOURCE_ORDER = ("local_compute", "local_cache_hit", "external_kv_transfer")
SOURCE_WORDS = {
    "local_compute": "prefilled here",
    "local_cache_hit": "this engine's prefix cache",
    "external_kv_transfer": "KV received from a connector",
}
PANEL_TITLES = {
    SourceCounter.PROMPT: "All prompt tokens by source (vLLM prompt_tokens_by_source_total)",
    SourceCounter.CACHED: (
        "Cached prompt tokens by the tier that held them (vLLM "
        "prompt_tokens_cached_by_source_total)"
    ),
}

PROMPT_SOURCES_CONTRACT = FrameContract(
    "prompt tokens by source",
    (
        MINUTE_TS,
        Column("counter", ColumnKind.TEXT, "prompt (all prompt tokens) or cached (cached ones)"),
        Column("token_source", ColumnKind.TEXT, "the engine's source label"),
        Column("tokens", ColumnKind.NUMBER, "tokens counted in the minute"),
    ),
)


def source_order(sources: list[str]) -> list[str]:
    known = [s for s in SOURCE_ORDER if s in sources]
    return known + sorted(set(sources) - set(SOURCE_ORDER))


def source_shares(rows: pl.DataFrame, *, counter: SourceCounter) -> dict[str, float]:
    """Each source's share (0-1) of the counter's tokens over the whole frame."""
    chosen = rows.filter(pl.col("counter") == counter.value)
    total = float(chosen["tokens"].sum())
    if total <= 0:
        return {}
    sums = chosen.group_by("token_source").agg(pl.col("tokens").sum())
    return {row["token_source"]: row["tokens"] / total for row in sums.iter_rows(named=True)}


def _panel(
    rows: pl.DataFrame, counter: SourceCounter, *, buckets: TimeBuckets, domain: TimeDomain | None
) -> Any:
    chosen = rows.filter(pl.col("counter") == counter.value)
    order = source_order(chosen["token_source"].unique().to_list())
    rates = chosen.group_by(bucket_start("minute_ts", buckets).alias("bucket"), "token_source").agg(
        tokens_per_s=pl.col("tokens").sum() / buckets.width_s
    )
    # Every source in every bucket (0 where it counted nothing), so the stack never interpolates
    # a missing layer across a bucket.
    grid = rates.select("bucket").unique().join(rates.select("token_source").unique(), how="cross")
    data = compact(
        grid.join(rates, on=["bucket", "token_source"], how="left")
        .with_columns(pl.col("tokens_per_s").fill_null(0.0))
        .select(
            epoch_ms("bucket").alias("ts"),
            "token_source",
            "tokens_per_s",
            rank=pl.col("token_source").replace_strict(
                {s: i for i, s in enumerate(order)}, return_dtype=pl.Int64
            ),
        )
        .sort("ts", "rank")
    )
    return (
        data_chart(data)
        .mark_area()
        .encode(
            time_x(domain=domain),
            alt.Y("tokens_per_s:Q", title="prompt tokens/s (fleet)", stack="zero"),
            alt.Color("token_source:N", title="source", sort=order),
            alt.Order("rank:Q"),
            tooltip=[
                time_tooltip(),
                alt.Tooltip("token_source:N", title="source"),
                alt.Tooltip("tokens_per_s:Q", title="tokens/s", format=",.1f"),
            ],
        )
        .properties(
            width=WIDTH_PX,
            height=HEIGHT_PX,
            title=alt.TitleParams(PANEL_TITLES[counter], fontSize=11),
        )
    )


def _share_text(shares: dict[str, float]) -> str:
    parts = []
    for source in source_order(list(shares)):
        words = SOURCE_WORDS.get(source)
        named = source if words is None else f"{source} ({words})"
        parts.append(f"{named} {shares[source]:.1%}")
    return ", ".join(parts)


def prompt_token_sources_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    rows = PROMPT_SOURCES_CONTRACT.select(frame)
    counters = [c for c in SourceCounter if (rows["counter"] == c.value).any()]
    if not counters:
        raise ValueError(
            "prompt tokens by source: no rows of counter "
            + " or ".join(c.value for c in SourceCounter)
        )
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    panels = [_panel(rows, c, buckets=buckets, domain=domain) for c in counters]
    subtitle = [
        (
            f"Fleet prompt tokens per second per {buckets.label}, stacked by the engine's "
            "source label: each counter increase spread evenly over the time between its two "
            "scrapes, summed over replicas, then the bucket's tokens / its length."
        ),
    ]
    for counter in counters:
        shares = source_shares(rows, counter=counter)
        if shares:
            what = "prompt tokens" if counter is SourceCounter.PROMPT else "cached prompt tokens"
            subtitle.append(f"Over the window, of all {what}: {_share_text(shares)}.")
    subtitle.append(buckets.note_with("tokens in it / its length"))
    chart = panels[0] if len(panels) == 1 else alt.vconcat(*panels).resolve_scale(x="shared")
    return titled(chart, title="Prompt tokens by source", subtitle=[s for s in subtitle if s])
