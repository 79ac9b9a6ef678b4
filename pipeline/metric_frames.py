"""Per-minute frames of scraped vLLM signals, in the long shapes the dashboards draw: KV-cache
usage, prefix-cache hits and queries, running and waiting requests with preemptions, token
throughput, and latency percentiles from the histograms (the only source of inter-token
latency). Counts are reset-corrected increments between samples, by the minute of the later
sample (exact whatever the scrape interval), except token throughput, whose increases are spread
over the time between their samples (`counter_spread`) since it is read as a rate over time;
gauges are minute means.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from servewatch.pipeline.counter_spread import spread_counter_minutes
from servewatch.pipeline.gpu_attribution import unmatched_gpu_readings
from servewatch.pipeline.metric_minutes import MINUTE_S, minute_ends_s
from servewatch.pipeline.metric_sli import (
    Scope,
    attributed,
    counter_minutes,
    gauge_stats,
    series_window_stats,
)
from servewatch.pipeline.prompt_token_sources import prompt_token_source_minutes
from servewatch.pipeline.promql import histogram_quantile_frame
from servewatch.pipeline.signals import SIGNALS, Aggregation, Signal

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


# The GPU health chart's columns: (column, signal), each replica's GPUs folded by the signal's
# aggregation (mean activity, summed power, hottest GPU).
# The rest are the per-replica GPU panels' (the DCGM exporter dashboard's signals).
GPU_COLUMNS: tuple[tuple[str, Signal], ...] = (
    ("tensor_active_ratio", Signal.GPU_TENSOR_ACTIVE_RATIO),
    ("power_w", Signal.GPU_POWER_W),
    ("temperature_c", Signal.GPU_TEMPERATURE_C),
    ("gpu_util_ratio", Signal.GPU_UTIL_RATIO),
    ("graphics_active_ratio", Signal.GPU_GRAPHICS_ACTIVE_RATIO),
    ("sm_clock_hz", Signal.GPU_SM_CLOCK_HZ),
    ("fb_used_bytes", Signal.GPU_FB_USED_BYTES),
    ("fb_free_bytes", Signal.GPU_FB_FREE_BYTES),
)


def gpu_minutes(
    points: pl.LazyFrame, dimensions: pl.LazyFrame, *, window_ends_s: list[float]
) -> pl.LazyFrame:
    """Per replica and minute, its GPUs' minute means folded by each signal's aggregation
    (`GPU_COLUMNS`). Only GPUs attributed to a replica count (`gpu_attribution`)."""
    signals = [signal.value for _, signal in GPU_COLUMNS]
    chosen = attributed(dimensions).filter(
        pl.col("signal").is_in(signals) & pl.col("replica").is_not_null()
    )
    per_series = series_window_stats(
        points, chosen, range_s=MINUTE_S, window_ends_s=window_ends_s
    ).join(chosen.select("series_id", "replica", "signal"), on="series_id", how="inner")
    signal = pl.col("signal")
    folds = {
        Aggregation.SUM: pl.Expr.sum,
        Aggregation.MEAN: pl.Expr.mean,
        Aggregation.MAX: pl.Expr.max,
    }
    return _minute(
        per_series.group_by("replica", "window_end_s").agg(
            pl.when((signal == gpu.value).any())
            .then(folds[SIGNALS[gpu].aggregation](pl.col("avg").filter(signal == gpu.value)))
            .alias(name)
            for name, gpu in GPU_COLUMNS
        )
    )


def xid_events(points: pl.LazyFrame, dimensions: pl.LazyFrame) -> pl.LazyFrame:
    """Samples of an attributed GPU's last-XID field that name an XID (non-zero): ts,
    replica, xid."""
    chosen = attributed(dimensions).filter(
        (pl.col("signal") == Signal.GPU_LAST_XID.value) & pl.col("replica").is_not_null()
    )
    return (
        points.join(chosen.select("series_id", "replica"), on="series_id", how="inner")
        .filter(pl.col("value") > 0)
        .select("ts", "replica", xid=pl.col("value"))
    )


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

    def spread(signal: Signal, name: str) -> pl.LazyFrame:
        chosen = dimensions.filter((pl.col("signal") == signal.value) & pl.col("le").is_null())
        return spread_counter_minutes(points, chosen, by=["replica"], name=name)

    def quantiles(signal: Signal, q: float) -> pl.LazyFrame:
        buckets = dimensions.filter(
            (pl.col("signal") == signal.value) & pl.col("le").is_not_null()
        ).select("series_id", "le")
        summed = counter_minutes(points, buckets, by=["le"], name="delta")
        return histogram_quantile_frame(summed, q=q, by=["minute_ts"], count_column="delta")

    def histogram(stat: str, signal: Signal) -> pl.LazyFrame:
        buckets = dimensions.filter(
            (pl.col("signal") == signal.value) & pl.col("le").is_not_null()
        ).select("series_id", "le")
        counted = counter_minutes(points, buckets, by=["le"], name="count")
        return counted.select("minute_ts", stat=pl.lit(stat), le="le", count="count")

    on = ["replica", "minute_ts"]
    scheduler = (
        gauge(Signal.REQUESTS_RUNNING, "running_requests")
        .join(gauge(Signal.REQUESTS_WAITING, "waiting_requests"), on=on, how="full", coalesce=True)
        # Full: a counter's increase is filed under its later sample's minute, which need not
        # be a minute the gauges' windows hold a sample in (scrapes on the minute boundary).
        .join(counter(Signal.PREEMPTIONS, "preemptions"), on=on, how="full", coalesce=True)
    )
    prefix = counter(Signal.PREFIX_CACHE_HITS_TOKENS, "hits_tokens").join(
        counter(Signal.PREFIX_CACHE_QUERIES_TOKENS, "queries_tokens"),
        on=on,
        how="full",
        coalesce=True,
    )
    # Rates over time: each increase spread over its scrape interval, so that buckets not
    # aligned to scrapes draw the traffic, not the scrape schedule.
    throughput = spread(Signal.PROMPT_TOKENS, "prompt_tokens").join(
        spread(Signal.GENERATION_TOKENS, "generation_tokens"), on=on, how="full", coalesce=True
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
        "gpu": gpu_minutes(points, dimensions, window_ends_s=ends),
        "xid_events": xid_events(points, dimensions),
        "unmatched_gpus": unmatched_gpu_readings(points, dimensions),
        "kv_cache_usage": gauge(Signal.KV_CACHE_USAGE_RATIO, "kv_cache_usage_ratio"),
        "prefix_cache": prefix,
        "scheduler_state": scheduler,
        "token_throughput": throughput,
        "latency_percentiles": latency,
        "latency_buckets": pl.concat(
            [histogram(stat, signal) for stat, signal in LATENCY_SIGNALS], how="vertical_relaxed"
        ),
        "prompt_token_sources": prompt_token_source_minutes(points, dimensions),
    }
