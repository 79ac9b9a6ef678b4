"""SLIs from scraped metric series, with PromQL's semantics: histogram quantiles as
`histogram_quantile(q, sum by (le) (increase(x_bucket[w])))`, counter increases and ratios,
and gauge statistics, per replica, pool, model or the whole fleet.

Series are grouped through their target (replica, host, zone, pool, model). Router re-exports
(source `vllm_router`) are left out: they repeat what the engines already count.
All functions are pure LazyFrame transforms; window ends are epoch seconds, each window spans
`range_s` back from its end, both edges included, as a PromQL range selector does.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from itertools import pairwise

import polars as pl

from servewatch.pipeline.gpu_attribution import UNATTRIBUTED, attribute_series
from servewatch.pipeline.promql import histogram_quantile_frame, increase_frame
from servewatch.pipeline.signals import ENGINE_SOURCES as ENGINES
from servewatch.pipeline.signals import SIGNALS, Aggregation, Signal, Source

ENGINE_SOURCES = (*(source.value for source in ENGINES), Source.DCGM.value)
# The gateway's series name no replica (its target is a pool's front door); they are kept so
# that the detectors can read what it refused, and no replica- or signal-keyed read sees them.
KEPT_SOURCES = (*ENGINE_SOURCES, Source.INFERENCE_GATEWAY.value)
DIMENSIONS = ("replica", "host", "zone", "pool", "model")


class Scope(Enum):
    REPLICA = "replica"
    POOL = "pool"
    MODEL = "model"
    FLEET = "fleet"

    @property
    def columns(self) -> list[str]:
        return [] if self is Scope.FLEET else [self.value]


def series_dimensions(series: pl.LazyFrame, targets: pl.LazyFrame) -> pl.LazyFrame:
    """Series with their target's dimensions and the labels SLIs group by: `le` as a float
    (null for non-bucket series), `finished_reason`, and `model` (the target's, else the
    series' model_name label). DCGM series get the replica their GPU serves, by
    `gpu_attribution` (its `gpu_rule` column says by which rule, or why none), never every
    replica of their host."""
    label = pl.col("labels").str.json_path_match
    names = targets.collect_schema().names()
    if "gpus" not in names:
        targets = targets.with_columns(gpus=pl.lit(None, pl.Int32()))
    if "gpu_uuids" not in names:
        targets = targets.with_columns(gpu_uuids=pl.lit(None, pl.List(pl.String())))
    dimensions = (
        series.join(
            targets.select("target_id", *DIMENSIONS, "gpus", "gpu_uuids").rename(
                {"model": "target_model"}
            ),
            on="target_id",
            how="left",
        )
        .with_columns(
            le=pl.when(pl.col("metric").str.ends_with("_bucket"))
            .then(label("$.le").cast(pl.Float64, strict=False))
            .otherwise(None),
            finished_reason=label("$.finished_reason"),
            model=pl.coalesce(pl.col("target_model"), label("$.model_name")),
        )
        .drop("target_model")
        .filter(pl.col("source").is_null() | pl.col("source").is_in(KEPT_SOURCES))
    )
    return attribute_series(dimensions)


def series_increases(
    points: pl.LazyFrame, chosen: pl.LazyFrame, *, range_s: float, window_ends_s: Sequence[float]
) -> pl.LazyFrame:
    wanted = points.join(chosen.select("series_id"), on="series_id", how="semi")
    return increase_frame(wanted, range_s=range_s, window_ends_s=window_ends_s).join(
        chosen, on="series_id", how="left"
    )


def histogram_quantiles(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    signal: Signal,
    q: float,
    range_s: float,
    window_ends_s: Sequence[float],
    scope: Scope,
) -> pl.LazyFrame:
    """The q-quantile of a latency histogram per scope group and window:
    `histogram_quantile(q, sum by (group, le) (increase(signal_bucket[range])))`.
    Columns: the scope's column, `window_end_s`, `quantile`."""
    buckets = dimensions.filter((pl.col("signal") == signal.value) & pl.col("le").is_not_null())
    by = [*scope.columns, "window_end_s"]
    summed = (
        series_increases(points, buckets, range_s=range_s, window_ends_s=window_ends_s)
        .group_by(*by, "le")
        .agg(pl.col("increase").sum())
    )
    return histogram_quantile_frame(summed, q=q, by=by, count_column="increase")


def counter_increases(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    signal: Signal,
    range_s: float,
    window_ends_s: Sequence[float],
    scope: Scope,
    by_labels: Sequence[str] = (),
    metric_suffix: str | None = None,
) -> pl.LazyFrame:
    """`sum by (group) (increase(counter[range]))` per window. For a histogram signal give
    `metric_suffix="_count"` (observations) or `"_sum"`. Columns: scope, labels, window_end_s,
    increase."""
    chosen = dimensions.filter(pl.col("signal") == signal.value)
    if metric_suffix is not None:
        chosen = chosen.filter(pl.col("metric").str.ends_with(metric_suffix))
    else:
        chosen = chosen.filter(pl.col("le").is_null())
    by = [*scope.columns, *by_labels, "window_end_s"]
    return series_counter_sums(points, chosen, range_s=range_s, window_ends_s=window_ends_s, by=by)


def series_counter_sums(
    points: pl.LazyFrame,
    chosen: pl.LazyFrame,
    *,
    range_s: float,
    window_ends_s: Sequence[float],
    by: Sequence[str],
) -> pl.LazyFrame:
    """`sum by (by) (increase(x[range]))` of the `chosen` series (with `by`'s columns, of
    which `window_end_s` is one). Columns: `by`, increase."""
    return (
        series_increases(points, chosen, range_s=range_s, window_ends_s=window_ends_s)
        .group_by(by)
        .agg(pl.col("increase").sum())
        .sort(by, nulls_last=True)
    )


def counter_ratio(
    numerator: pl.LazyFrame, denominator: pl.LazyFrame, *, scope: Scope, name: str
) -> pl.LazyFrame:
    """increase(numerator) / increase(denominator) per group and window (e.g. prefix-cache hit
    rate = hits / queries over the window, never the lifetime ratio); null where nothing was
    counted."""
    by = [*scope.columns, "window_end_s"]
    return (
        numerator.rename({"increase": "_num"})
        .join(denominator.rename({"increase": "_den"}), on=by, how="full", coalesce=True)
        .with_columns(pl.when(pl.col("_den") > 0).then(pl.col("_num") / pl.col("_den")).alias(name))
        .select(*by, name)
        .sort(by, nulls_last=True)
    )


def gauge_stats(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    signal: Signal,
    range_s: float,
    window_ends_s: Sequence[float],
    scope: Scope,
) -> pl.LazyFrame:
    """Mean and max of a gauge over each window's samples, per group (e.g. KV-cache usage).
    Columns: scope, window_end_s, mean, max, samples.

    Windows must not overlap (each window end at least `range_s` after the previous one): a
    sample counts in the first window ending at or after it, so cost stays linear in samples.
    """
    chosen = attributed(dimensions).filter(pl.col("signal") == signal.value)
    return series_gauge_stats(
        points, chosen, range_s=range_s, window_ends_s=window_ends_s, scope=scope
    )


def series_gauge_stats(
    points: pl.LazyFrame,
    chosen: pl.LazyFrame,
    *,
    range_s: float,
    window_ends_s: Sequence[float],
    scope: Scope,
) -> pl.LazyFrame:
    """`gauge_stats` of the `chosen` series (attributed dimensions rows)."""
    ends_sorted = sorted(window_ends_s)
    if any(b - a < range_s for a, b in pairwise(ends_sorted)):
        raise ValueError(f"gauge windows overlap: ends closer than range_s={range_s}")
    ends = pl.LazyFrame({"window_end_s": ends_sorted}, schema={"window_end_s": pl.Float64})
    samples = (
        points.join(chosen.select("series_id", *DIMENSIONS), on="series_id", how="inner")
        .with_columns(ts_s=pl.col("ts").dt.epoch("us").cast(pl.Float64) / 1e6)
        .sort("ts_s")
        .join_asof(ends, left_on="ts_s", right_on="window_end_s", strategy="forward")
        .filter(pl.col("ts_s") >= pl.col("window_end_s") - range_s)
    )
    by = [*scope.columns, "window_end_s"]
    return (
        samples.group_by(by)
        .agg(
            pl.col("value").mean().alias("mean"),
            pl.col("value").max().alias("max"),
            pl.len().alias("samples"),
        )
        .sort(by, nulls_last=True)
    )


def counter_deltas(points: pl.LazyFrame, chosen: pl.LazyFrame) -> pl.LazyFrame:
    """Per-sample counter increments of the chosen series, reset-corrected (a drop means the
    counter restarted from zero, so the new value is the increment), each attributed to the
    minute of the later sample. Unlike `increase`, these add up exactly over any set of
    minutes, whatever the scrape interval. Columns: series dimensions, minute_ts, delta."""
    value = pl.col("value")
    previous = value.shift(1).over("series_id", order_by="ts")
    return (
        points.join(chosen, on="series_id", how="inner")
        .with_columns(
            delta=pl.when(previous.is_null())
            .then(None)
            .when(value < previous)
            .then(value)
            .otherwise(value - previous)
        )
        .filter(pl.col("delta").is_not_null())
        .with_columns(minute_ts=pl.col("ts").dt.truncate("1m"))
    )


def counter_minutes(
    points: pl.LazyFrame, chosen: pl.LazyFrame, *, by: Sequence[str], name: str
) -> pl.LazyFrame:
    """`counter_deltas` of the chosen series summed per minute and `by` columns (which
    `chosen` carries beside `series_id`), in column `name`."""
    return (
        counter_deltas(points, chosen.select("series_id", *by))
        .group_by("minute_ts", *by)
        .agg(pl.col("delta").sum().alias(name))
    )


# The histogram-sourced latency SLIs of `servewatch sli`: (name stem, signal).
LATENCY_HISTOGRAMS: tuple[tuple[str, Signal], ...] = (
    ("ttft", Signal.TTFT_S),
    ("itl", Signal.INTER_TOKEN_LATENCY_S),
    ("tpot", Signal.REQUEST_TPOT_S),
    ("e2e", Signal.E2E_LATENCY_S),
)
QUANTILES: tuple[tuple[int, float], ...] = ((50, 0.5), (90, 0.9), (95, 0.95), (99, 0.99))
# Counters reported as increases over the window: (column, signal).
COUNTERS: tuple[tuple[str, Signal], ...] = (
    ("prompt_tokens", Signal.PROMPT_TOKENS),
    ("generation_tokens", Signal.GENERATION_TOKENS),
    ("preemptions", Signal.PREEMPTIONS),
    ("prefix_cache_hits_tokens", Signal.PREFIX_CACHE_HITS_TOKENS),
    ("prefix_cache_queries_tokens", Signal.PREFIX_CACHE_QUERIES_TOKENS),
    ("spec_decode_draft_tokens", Signal.SPEC_DECODE_DRAFT_TOKENS),
    ("spec_decode_accepted_tokens", Signal.SPEC_DECODE_ACCEPTED_TOKENS),
)
# Gauges: (column stem, signal). The series of a group combine by the signal's `Aggregation`
# (pipeline/signals.py), as a tensor-parallel replica folds its GPUs: counts, power and memory
# add up over the group (`sum by (group) (avg_over_time(x[w]))`, the time-average of the
# total); ratios average (`avg by (group) (avg_over_time(x[w]))`); temperatures take the
# hottest (`max by (group) (avg_over_time(x[w]))`). The max is always the highest one series
# reached (`max by (group) (max_over_time(x[w]))`). GPUs that serve no replica
# (`gpu_attribution`) count in no group, the fleet included: they are listed apart.
GAUGES: tuple[tuple[str, Signal], ...] = (
    ("kv_cache_usage_ratio", Signal.KV_CACHE_USAGE_RATIO),
    ("requests_running", Signal.REQUESTS_RUNNING),
    ("requests_waiting", Signal.REQUESTS_WAITING),
    ("gpu_util_ratio", Signal.GPU_UTIL_RATIO),
    ("gpu_power_w", Signal.GPU_POWER_W),
    ("gpu_fb_used_bytes", Signal.GPU_FB_USED_BYTES),
    ("gpu_temperature_c", Signal.GPU_TEMPERATURE_C),
    # an engine's own hit-rate gauge (SGLang, TensorRT-LLM, vLLM V0), beside the counters' one
    ("prefix_cache_hit_ratio_reported", Signal.PREFIX_CACHE_HIT_RATIO),
)


def attributed(dimensions: pl.LazyFrame) -> pl.LazyFrame:
    """Dimensions without the DCGM series of GPUs that serve no replica."""
    unattributed = [rule.value for rule in UNATTRIBUTED]
    return dimensions.filter(~pl.col("gpu_rule").is_in(unattributed).fill_null(value=False))


def _group_series(dimensions: pl.LazyFrame, scope: Scope) -> pl.LazyFrame:
    return dimensions.select("series_id", "signal", *scope.columns).unique()


def latency_quantiles(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    range_s: float,
    window_ends_s: Sequence[float],
    scope: Scope,
) -> pl.LazyFrame:
    """p50/p90/p95/p99 of every latency histogram of `LATENCY_HISTOGRAMS`, each
    `histogram_quantile(q, sum by (group, le) (increase(x_bucket[range])))`, with the number
    of observations (the +Inf bucket's increase). One row per group and window; columns
    `<stem>_p<p>_s` and `<stem>_observations`."""
    signals = [signal.value for _, signal in LATENCY_HISTOGRAMS]
    buckets = dimensions.filter(pl.col("signal").is_in(signals) & pl.col("le").is_not_null())
    by = [*scope.columns, "window_end_s"]
    summed = (
        series_increases(
            points,
            buckets.select("series_id", "le", "signal", *scope.columns).unique(),
            range_s=range_s,
            window_ends_s=window_ends_s,
        )
        .group_by("signal", *by, "le")
        .agg(pl.col("increase").sum())
    )
    columns: list[pl.LazyFrame] = [summed.select(by).unique()]
    for stem, signal in LATENCY_HISTOGRAMS:
        of_signal = summed.filter(pl.col("signal") == signal.value)
        columns.append(
            of_signal.filter(pl.col("le") == float("inf"))
            .group_by(by)
            .agg(pl.col("increase").sum().alias(f"{stem}_observations"))
        )
        columns.extend(
            histogram_quantile_frame(
                of_signal, q=q, by=by, count_column="increase", value_column=f"{stem}_p{p}_s"
            )
            for p, q in QUANTILES
        )
    joined = columns[0]
    for frame in columns[1:]:
        joined = joined.join(frame, on=by, how="left", nulls_equal=True)
    return joined.sort(by, nulls_last=True)


def counter_table(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    range_s: float,
    window_ends_s: Sequence[float],
    scope: Scope,
) -> pl.LazyFrame:
    """`sum by (group) (increase(c[range]))` of every counter of `COUNTERS`, one column each
    (null where the group exposes no such series), the prefix-cache hit ratio from the two
    prefix-cache increases (`counter_ratio`) and the speculative acceptance ratio (accepted /
    draft tokens). One row per group and window.

    An engine that counts hits but no lookups (SGLang, TensorRT-LLM, llama.cpp) looks up every
    prompt token, so its prompt tokens are its lookups; that is decided per target, so a group
    mixing engines divides hits by the lookups of the same targets."""
    signals = [signal.value for _, signal in COUNTERS]
    chosen = dimensions.filter(pl.col("signal").is_in(signals) & pl.col("le").is_null())
    by = [*scope.columns, "window_end_s"]
    per_target = [*by, "target_id"]
    series = chosen.select("series_id", "signal", "target_id", *scope.columns).unique()
    increases = series_increases(points, series, range_s=range_s, window_ends_s=window_ends_s)
    signal = pl.col("signal")
    targets = increases.group_by(per_target).agg(
        pl.when((signal == counter.value).any())
        .then(pl.col("increase").filter(signal == counter.value).sum())
        .alias(name)
        for name, counter in COUNTERS
    )
    lookups = pl.when(pl.col("prefix_cache_hits_tokens").is_not_null()).then(
        pl.coalesce("prefix_cache_queries_tokens", "prompt_tokens")
    )
    names = [name for name, _ in COUNTERS]
    table = (
        targets.with_columns(_lookups=lookups)
        .group_by(by)
        .agg(
            *(pl.when(pl.col(n).is_not_null().any()).then(pl.col(n).sum()).alias(n) for n in names),
            pl.when(pl.col("_lookups").is_not_null().any())
            .then(pl.col("_lookups").sum())
            .alias("_lookups"),
        )
    )
    hits = table.select(*by, increase=pl.col("prefix_cache_hits_tokens"))
    queries = table.select(*by, increase=pl.col("_lookups"))
    ratio = counter_ratio(hits, queries, scope=scope, name="prefix_cache_hit_ratio")
    accepted = table.select(*by, increase=pl.col("spec_decode_accepted_tokens"))
    drafted = table.select(*by, increase=pl.col("spec_decode_draft_tokens"))
    acceptance = counter_ratio(accepted, drafted, scope=scope, name="spec_decode_acceptance_ratio")
    return (
        table.drop("_lookups")
        .join(ratio, on=by, how="left", nulls_equal=True)
        .join(acceptance, on=by, how="left", nulls_equal=True)
        .sort(by, nulls_last=True)
    )


def finish_reasons(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    range_s: float,
    window_ends_s: Sequence[float],
    scope: Scope,
) -> pl.LazyFrame:
    """Finished requests by reason: `sum by (group, finished_reason)
    (increase(request_success_total[range]))`. Columns: scope, finished_reason, window_end_s,
    increase."""
    return counter_increases(
        points,
        dimensions,
        signal=Signal.REQUESTS_FINISHED,
        range_s=range_s,
        window_ends_s=window_ends_s,
        scope=scope,
        by_labels=["finished_reason"],
    )


def series_window_stats(
    points: pl.LazyFrame, chosen: pl.LazyFrame, *, range_s: float, window_ends_s: Sequence[float]
) -> pl.LazyFrame:
    """Each chosen series' `avg_over_time` (`avg`) and `max_over_time` (`top`) per window;
    a sample counts in the first window ending at or after it (windows must not overlap).
    Columns: series_id, window_end_s, avg, top."""
    ends = pl.LazyFrame(
        {"window_end_s": sorted(window_ends_s)}, schema={"window_end_s": pl.Float64}
    )
    return (
        points.join(chosen.select("series_id").unique(), on="series_id", how="semi")
        .with_columns(ts_s=pl.col("ts").dt.epoch("us").cast(pl.Float64) / 1e6)
        .sort("ts_s")
        .join_asof(ends, left_on="ts_s", right_on="window_end_s", strategy="forward")
        .filter(pl.col("ts_s") >= pl.col("window_end_s") - range_s)
        .group_by("series_id", "window_end_s")
        .agg(avg=pl.col("value").mean(), top=pl.col("value").max())
    )


def gauge_table(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    range_s: float,
    window_ends_s: Sequence[float],
    scope: Scope,
) -> pl.LazyFrame:
    """Every gauge of `GAUGES` over each window: `<stem>_mean` (the group's combination of
    each series' `avg_over_time`) and `<stem>_max` (`max_over_time` of the highest series).
    Windows must not overlap, as for `gauge_stats`. One row per group and window."""
    ends_sorted = sorted(window_ends_s)
    if any(b - a < range_s for a, b in pairwise(ends_sorted)):
        raise ValueError(f"gauge windows overlap: ends closer than range_s={range_s}")
    signals = [signal.value for _, signal in GAUGES]
    chosen = attributed(dimensions).filter(pl.col("signal").is_in(signals))
    per_series = series_window_stats(points, chosen, range_s=range_s, window_ends_s=ends_sorted)
    by = [*scope.columns, "window_end_s"]
    grouped = per_series.join(_group_series(chosen, scope), on="series_id", how="inner")
    signal = pl.col("signal")
    aggregations: list[pl.Expr] = []
    for stem, gauge in GAUGES:
        mine = signal == gauge.value
        average = pl.col("avg").filter(mine)
        combined = {
            Aggregation.SUM: average.sum(),
            Aggregation.MEAN: average.mean(),
            Aggregation.MAX: average.max(),
        }[SIGNALS[gauge].aggregation]
        aggregations += [
            pl.when(mine.any()).then(combined).alias(f"{stem}_mean"),
            pl.col("top").filter(mine).max().alias(f"{stem}_max"),
        ]
    return grouped.group_by(by).agg(aggregations).sort(by, nulls_last=True)
