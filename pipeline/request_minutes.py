"""Minute rollups of traced requests: additive counts per replica and minute.

Counts (requests, failures, tokens, good events) are additive, so any window is a sum of its
minutes and a rate over it is exact rather than an average of ratios. The per-minute latency
percentiles are descriptive only (percentiles do not add); windowed percentiles come from the
raw requests. A request belongs to the minute in which it finished.

These Polars transforms are the definition; the rollup job runs the same computation inside
DuckDB (`Store.recompute_request_minutes`, `Store.recompute_slo_minutes`) so a day of requests
never leaves the database, and the tests hold the two equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from servewatch.pipeline.request_sli import with_tpot
from servewatch.pipeline.tables import SLO_MINUTES_SCHEMA

SLO_DIMENSIONS = ("replica", "pool", "model", "tenant", "adapter")


@dataclass(frozen=True)
class EventCriterion:
    """What makes a request a good event for one SLO: it succeeded and met every given limit.

    With no latency limit this is availability. Limits are inclusive, and a single-token output
    meets any TPOT limit (as `vllm bench serve --goodput` counts it).
    """

    name: str
    ttft_limit_s: float | None = None
    tpot_limit_s: float | None = None
    e2e_limit_s: float | None = None

    def good(self) -> pl.Expr:
        condition = pl.col("ok")
        if self.ttft_limit_s is not None:
            condition &= pl.col("ttft_s") <= self.ttft_limit_s
        if self.tpot_limit_s is not None:
            condition &= pl.col("tpot_s").fill_null(0.0) <= self.tpot_limit_s
        if self.e2e_limit_s is not None:
            condition &= pl.col("e2e_s") <= self.e2e_limit_s
        return condition.fill_null(value=False)


MINUTE = "1m"


def with_minute(requests: pl.LazyFrame) -> pl.LazyFrame:
    return requests.with_columns(minute_ts=pl.col("end_ts").dt.truncate(MINUTE))


# The latencies a minute rollup describes (request column after `with_tpot`, column stem),
# and at which percentiles: `request_minutes` holds `{stem}_p{percentile}_s` for each.
MINUTE_LATENCIES = (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2e"))
MINUTE_PERCENTILES = (50, 95, 99)


def latency_percentile(column: str, percentile: float) -> pl.Expr:
    """The `percentile` of a latency column over the successful requests of a group, linearly
    interpolated (as DuckDB's `quantile_cont`, which the store's rollup uses with the same
    percentiles): the one definition of a per-minute latency percentile."""
    return pl.col(column).filter(pl.col("ok")).quantile(percentile / 100, interpolation="linear")


def request_minutes(requests: pl.LazyFrame) -> pl.LazyFrame:
    """One row per (replica, minute): counts, tokens and descriptive latency percentiles."""
    ok = pl.col("ok")
    latency = [
        latency_percentile(column, p).alias(f"{stem}_p{p}_s")
        for column, stem in MINUTE_LATENCIES
        for p in MINUTE_PERCENTILES
    ]
    return (
        requests.pipe(with_tpot)
        .pipe(with_minute)
        .group_by("replica", "minute_ts")
        .agg(
            pl.len().cast(pl.Int64).alias("requests"),
            (~ok).sum().cast(pl.Int64).alias("failed_requests"),
            pl.col("prompt_tokens").filter(ok).sum().cast(pl.Int64).alias("prompt_tokens"),
            pl.col("completion_tokens").filter(ok).sum().cast(pl.Int64).alias("completion_tokens"),
            *latency,
        )
        .sort("minute_ts", "replica", nulls_last=True)
    )


def slo_minutes(requests: pl.LazyFrame, *, criteria: Sequence[EventCriterion]) -> pl.LazyFrame:
    """Good and total events per SLO, minute and request dimensions (replica, pool, model,
    tenant, adapter, so SLO scopes can select on them): the input of budgets and burn rates.
    Beside the request counts, the output tokens of the good requests and of all requests (a
    request without a token count adds none): the events of token goodput SLOs."""
    if not criteria:
        return pl.LazyFrame(schema=SLO_MINUTES_SCHEMA)
    prepared = requests.pipe(with_tpot).pipe(with_minute)
    per_slo = [
        prepared.group_by("minute_ts", *SLO_DIMENSIONS)
        .agg(
            criterion.good().sum().cast(pl.Int64).alias("good"),
            pl.len().cast(pl.Int64).alias("total"),
            pl.col("completion_tokens")
            .filter(criterion.good())
            .sum()
            .cast(pl.Int64)
            .alias("good_output_tokens"),
            pl.col("completion_tokens").sum().cast(pl.Int64).alias("output_tokens"),
        )
        .with_columns(slo=pl.lit(criterion.name))
        for criterion in criteria
    ]
    return (
        pl.concat(per_slo)
        .select(SLO_MINUTES_SCHEMA.names())
        .sort("slo", "minute_ts", *SLO_DIMENSIONS, nulls_last=True)
    )
