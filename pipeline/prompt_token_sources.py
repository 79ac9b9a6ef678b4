"""Prompt token sources: where each prompt token's KV came from, per minute, from vLLM's
`prompt_tokens_by_source_total` and `prompt_tokens_cached_by_source_total` counters.

Both counters carry the origin in their `source` label. The first splits every prompt token
(cached ones included) into `local_compute` (prefilled here), `local_cache_hit` (found in this
engine's prefix cache) and `external_kv_transfer` (received from a KV connector); the second
splits the cached ones by the tier that held them (`device`, `host`, `disk`, ... as the engine
names its tiers). The values are kept as the engine spells them. Each increase is spread over
the time between its two samples (`counter_spread`), since the result is read as a rate over
time, and summed over replicas.
"""

from __future__ import annotations

from enum import Enum

import polars as pl

from servewatch.pipeline.counter_spread import spread_counter_minutes
from servewatch.pipeline.signals import Signal

SOURCE_LABEL = "source"
UNLABELLED = "unlabelled"

PROMPT_TOKEN_SOURCES_SCHEMA = pl.Schema(
    {
        "minute_ts": pl.Datetime("us"),
        "counter": pl.String(),
        "token_source": pl.String(),
        "tokens": pl.Float64(),
    }
)


class SourceCounter(Enum):
    """The two by-source counters, by what they split."""

    PROMPT = "prompt"
    CACHED = "cached"

    @property
    def signal(self) -> Signal:
        if self is SourceCounter.PROMPT:
            return Signal.PROMPT_TOKENS_BY_SOURCE
        return Signal.PROMPT_TOKENS_CACHED_BY_SOURCE


def prompt_token_source_minutes(points: pl.LazyFrame, dimensions: pl.LazyFrame) -> pl.LazyFrame:
    """Per minute, counter (`SourceCounter` value) and `token_source` (the `source` label),
    the tokens counted, summed over every replica (PROMPT_TOKEN_SOURCES_SCHEMA).

    `dimensions` is `metric_sli.series_dimensions` output: series with their signal and raw
    `labels` (JSON). A series without a `source` label counts as `unlabelled`."""
    counter = pl.col("signal").replace_strict(
        {c.signal.value: c.value for c in SourceCounter}, default=None, return_dtype=pl.String
    )
    chosen = (
        dimensions.filter(pl.col("signal").is_in([c.signal.value for c in SourceCounter]))
        .with_columns(
            counter=counter,
            token_source=pl.col("labels")
            .str.json_path_match(f"$.{SOURCE_LABEL}")
            .fill_null(UNLABELLED),
        )
        .select("series_id", "counter", "token_source")
    )
    return (
        spread_counter_minutes(points, chosen, by=["counter", "token_source"], name="tokens")
        .select(
            pl.col("minute_ts").cast(pl.Datetime("us")),
            "counter",
            "token_source",
            pl.col("tokens").cast(pl.Float64),
        )
        .sort("minute_ts", "counter", "token_source")
    )
