"""Per-minute frames of scraped vLLM signals, in the long shapes the dashboards draw: KV-cache
usage, prefix-cache hits and queries, running and waiting requests with preemptions, token
throughput, and latency percentiles from the histograms (the only source of inter-token
latency). Counts are reset-corrected increments between samples, by the minute of the later
sample (exact whatever the scrape interval); gauges are minute means.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from servewatch.pipeline.metric_minutes import MINUTE_S, minute_ends_s
from servewatch.pipeline.metric_sli import Scope, counter_minutes, gauge_stats
from servewatch.pipeline.promql import histogram_quantile_frame
from servewatch.pipeline.signals import Signal

PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))
LATENCY_SIGNALS = (
    ("ttft", Signal.TTFT_S),
    ("tpot", Signal.REQUEST_TPOT_S),
    ("itl", Signal.INTER_TOKEN_LATENCY_S),
    ("e2e", Signal.E2E_LATENCY_S),
)


def _minute(frame: pl.LazyFrame) -> pl.LazyFrame:
    """`window_end_s` (end of a minute, epoch s) as `minute_ts` (its start, naive UTC)."""
    return frame.with_columns(
        minute_ts=pl.from_epoch(
            ((pl.col("window_end_s") - MINUTE_S) * 1_000_000).cast(pl.Int64), time_unit="us"
        )
    ).drop("window_end_s")


def metric_minute_frames(
    points: pl.LazyFrame, dimensions: pl.LazyFrame, *, start: datetime, end: datetime
) -> dict[str, pl.LazyFrame]:
    """Frames keyed by the dashboards' `ReportInputs` field names."""
    ends = minute_ends_s(start, end)

    def gauge(signal: Signal, name: str) -> pl.LazyFrame:
        return _minute(
            gauge_stats(
                points,
                dimensions,
                signal=signal,
                scope=Scope.REPLICA,
                range_s=MINUTE_S,
                window_ends_s=ends,
            ).select("replica", "window_end_s", pl.col("mean").alias(name))
        )

    def counter(signal: Signal, name: str) -> pl.LazyFrame:
        chosen = dimensions.filter((pl.col("signal") == signal.value) & pl.col("le").is_null())
        return counter_minutes(points, chosen, by=["replica"], name=name)

    def quantiles(signal: Signal, q: float) -> pl.LazyFrame:
        buckets = dimensions.filter(
            (pl.col("signal") == signal.value) & pl.col("le").is_not_null()
        ).select("series_id", "le")
        summed = counter_minutes(points, buckets, by=["le"], name="delta")
        return histogram_quantile_frame(summed, q=q, by=["minute_ts"], count_column="delta")

    on = ["replica", "minute_ts"]
    scheduler = (
        gauge(Signal.REQUESTS_RUNNING, "running_requests")
        .join(gauge(Signal.REQUESTS_WAITING, "waiting_requests"), on=on, how="full", coalesce=True)
        .join(counter(Signal.PREEMPTIONS, "preemptions"), on=on, how="left")
    )
    prefix = counter(Signal.PREFIX_CACHE_HITS_TOKENS, "hits_tokens").join(
        counter(Signal.PREFIX_CACHE_QUERIES_TOKENS, "queries_tokens"),
        on=on,
        how="full",
        coalesce=True,
    )
    throughput = counter(Signal.PROMPT_TOKENS, "prompt_tokens").join(
        counter(Signal.GENERATION_TOKENS, "generation_tokens"), on=on, how="full", coalesce=True
    )
    latency = pl.concat(
        [
            quantiles(signal, q).select(
                "minute_ts",
                percentile=pl.lit(label),
                latency_s=pl.col("quantile"),
                stat=pl.lit(stat),
            )
            for stat, signal in LATENCY_SIGNALS
            for label, q in PERCENTILES
        ]
    ).filter(pl.col("latency_s").is_finite())
    return {
        "kv_cache_usage": gauge(Signal.KV_CACHE_USAGE_RATIO, "kv_cache_usage_ratio"),
        "prefix_cache": prefix,
        "scheduler_state": scheduler,
        "token_throughput": throughput,
        "latency_percentiles": latency,
    }
