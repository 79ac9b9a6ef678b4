"""Recorded SLIs: what each series `servewatch rules sli` makes a Prometheus record is in
`servewatch sli`'s terms, and the SLIs answered from recorded samples at an instant.

A record is named `level:metric:operation` (slo/sli_rules.py): the level `replica`, `pool` or
`pool_model` (the labels it keeps); the metric a vLLM family with its prefix, `:` written `_`
(`vllm_time_to_first_token_seconds`); the operation `p90_5m` (a quantile, in percent with `.`
written `_`), `rate5m`, `ratio_rate5m` or `mean5m`, the rule's window last. The bucket-rate
records (`..._bucket:rate5m`) feed no SLI of their own and are not SLIs here.

The value of a record at an instant is what a Prometheus instant query answers there: the
series' latest sample at or before it, no older than a lookback (Prometheus' is 5 minutes).
A recorded figure covers its rule's window ending at its sample's time: evaluated by
Prometheus it is what `pipeline.metric_sli` computes from the raw series over
`[ts - window_s, ts]` (MetricsQL's rates differ, docs/prometheus-import.md).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import orjson
import polars as pl

from servewatch.pipeline.natural_sort import natural_key

LEVELS: tuple[str, ...] = ("replica", "pool", "pool_model")
DEFAULT_LOOKBACK_S = 300.0

# Latency histograms, by the family the record is named after -> the stem `servewatch sli`
# gives it (pipeline.metric_sli.LATENCY_HISTOGRAMS): `ttft_p90_s`, ...
LATENCY_RECORDS: dict[str, str] = {
    "time_to_first_token_seconds": "ttft",
    "inter_token_latency_seconds": "itl",
    "request_time_per_output_token_seconds": "tpot",
    "e2e_request_latency_seconds": "e2e",
}
# Every other record: (family, operation) -> the SLI. Rates are per second over the window,
# means time-averages (a usage ratio averaged over the level's engines, queues summed).
VALUE_RECORDS: dict[tuple[str, str], str] = {
    ("request_success", "rate"): "requests_per_s",
    ("prompt_tokens", "rate"): "prompt_tokens_per_s",
    ("generation_tokens", "rate"): "generation_tokens_per_s",
    ("request_errors", "ratio_rate"): "error_ratio",
    ("prefix_cache_hits", "ratio_rate"): "prefix_cache_hit_ratio",
    ("kv_cache_usage_perc", "mean"): "kv_cache_usage_ratio_mean",
    ("num_requests_waiting", "mean"): "requests_waiting_mean",
    ("num_requests_running", "mean"): "requests_running_mean",
}
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_FAMILIES = sorted({*LATENCY_RECORDS, *(family for family, _ in VALUE_RECORDS)})
# The metric is the prefix (ending in `_`, or none) and the family; the family alternatives are
# whole names, so a prefix can never take part of one.
_RECORD = (
    r"^(?P<level>" + "|".join(LEVELS) + r"):"
    r"(?:[A-Za-z0-9_]*_)?(?P<family>" + "|".join(_FAMILIES) + r"):"
    r"(?:p(?P<percent>[0-9]+(?:_[0-9]+)?)_|(?P<operation>rate|ratio_rate|mean))"
    r"(?P<window>[0-9]+)(?P<unit>[smhd])$"
)

CATALOGUE_SCHEMA = pl.Schema(
    {"record": pl.String(), "level": pl.String(), "sli": pl.String(), "window_s": pl.Float64()}
)


def record_catalogue(records: pl.LazyFrame) -> pl.LazyFrame:
    """The records (column `record`) that are SLIs, with their `level`, `sli` (the name
    `servewatch sli --recorded` reports, e.g. `ttft_p90_s`, `requests_per_s`) and the rule's
    `window_s`; every other name is left out."""
    part = pl.col("_parts").struct.field
    value_slis = {
        f"{family}:{operation}": sli for (family, operation), sli in VALUE_RECORDS.items()
    }
    stem = part("family").replace_strict(LATENCY_RECORDS, default=None, return_dtype=pl.String)
    sli = (
        pl.when(part("percent").is_not_null())
        .then(pl.concat_str(stem, pl.lit("_p"), part("percent"), pl.lit("_s")))
        .otherwise(
            pl.concat_str(part("family"), pl.lit(":"), part("operation")).replace_strict(
                value_slis, default=None, return_dtype=pl.String
            )
        )
    )
    window_s = part("window").cast(pl.Float64) * part("unit").replace_strict(
        _UNIT_S, default=None, return_dtype=pl.Float64
    )
    return (
        records.select("record")
        .with_columns(_parts=pl.col("record").str.extract_groups(_RECORD))
        .select("record", level=part("level"), sli=sli, window_s=window_s)
        .filter(pl.col("sli").is_not_null())
        .cast(CATALOGUE_SCHEMA)
    )


def recorded_at(points: pl.LazyFrame, *, at_ts: datetime, lookback_s: float) -> pl.LazyFrame:
    """Each recorded series' value at `at_ts`: its latest sample in `[at_ts - lookback_s,
    at_ts]`, as a Prometheus instant query answers. `points` has `recorded_points`' columns.
    Columns: source, level, labels, sli, window_s, ts, value."""
    earliest = at_ts - timedelta(seconds=lookback_s)
    latest = (
        points.filter(pl.col("ts").is_between(earliest, at_ts, closed="both"))
        .sort("ts")
        .group_by("source", "record", "labels")
        .agg(pl.col("ts").last(), pl.col("value").last())
    )
    catalogue = record_catalogue(latest.select("record").unique())
    return (
        latest.join(catalogue, on="record", how="inner")
        .select("source", "level", "labels", "sli", "window_s", "ts", "value")
        .sort("source", "level", "labels", "sli")
    )


def _group_key(labels: dict[str, Any]) -> tuple[tuple[tuple[int, int | str], ...], ...]:
    return tuple(natural_key(str(value)) for _, value in sorted(labels.items()))


def recorded_groups(rows: pl.DataFrame, *, level: str) -> list[dict[str, Any]]:
    """`recorded_at`'s rows of one level as JSON-ready groups, one per source, labels and
    window: `{source, labels, window_s, at, slis: {sli: value}}` (`at` the newest evaluation
    among the group's records; a NaN, a ratio over no traffic, is null), in natural order."""
    groups: dict[tuple[str, str, float], dict[str, Any]] = {}
    for row in rows.filter(pl.col("level") == level).iter_rows(named=True):
        key = (row["source"], row["labels"], row["window_s"])
        group = groups.setdefault(
            key,
            {
                "source": row["source"],
                "labels": orjson.loads(row["labels"]),
                "window_s": row["window_s"],
                "at": row["ts"],
                "slis": {},
            },
        )
        group["at"] = max(group["at"], row["ts"])
        value = row["value"]
        group["slis"][row["sli"]] = None if value is None or math.isnan(value) else value
    return sorted(
        groups.values(),
        key=lambda g: (g["source"], g["window_s"], _group_key(g["labels"])),
    )
