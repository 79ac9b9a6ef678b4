"""Metric SLIs from stored series: PromQL aggregation order (increase, then sum by le, then
quantile), hit rates from counter increases, gauge statistics, router series left out."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl
import pytest

from servewatch.pipeline.metric_sli import (
    Scope,
    counter_increases,
    counter_ratio,
    gauge_stats,
    histogram_quantiles,
    series_dimensions,
)
from servewatch.pipeline.promql import histogram_quantile
from servewatch.pipeline.signals import Signal

T0 = 1_795_000_000.0
BOUNDS = ("0.1", "0.5", "1.0", "+Inf")
# cumulative bucket counts at t0 and t0+60 for each replica
COUNTS = {
    "r0": ((0, 2, 3, 3), (10, 30, 38, 40)),
    "r1": ((5, 5, 5, 5), (6, 20, 40, 45)),
}


def ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC).replace(tzinfo=None)


def build() -> tuple[pl.LazyFrame, pl.LazyFrame]:
    series_rows, point_rows = [], []
    sid = 0
    for replica, (before, after) in COUNTS.items():
        for bound, c0, c1 in zip(BOUNDS, before, after, strict=True):
            sid += 1
            labels = json.dumps({"engine": "0", "le": bound}, sort_keys=True)
            series_rows.append(
                (
                    sid,
                    replica,
                    "ttft_s",
                    "vllm:time_to_first_token_seconds_bucket",
                    labels,
                    "vllm_engine",
                )
            )
            point_rows += [(sid, ts(T0), float(c0)), (sid, ts(T0 + 60), float(c1))]
    # a router re-export of the same histogram must not be added in
    sid += 1
    series_rows.append(
        (
            sid,
            "r0",
            "ttft_s",
            "vllm:time_to_first_token_seconds_bucket",
            json.dumps({"le": "+Inf", "server": "x"}),
            "vllm_router",
        )
    )
    point_rows += [(sid, ts(T0), 0.0), (sid, ts(T0 + 60), 1000.0)]
    for replica, (queries, hits) in {"r0": (1000.0, 250.0), "r1": (3000.0, 300.0)}.items():
        for signal, metric, total in (
            ("prefix_cache_queries_tokens", "vllm:prefix_cache_queries_total", queries),
            ("prefix_cache_hits_tokens", "vllm:prefix_cache_hits_total", hits),
        ):
            sid += 1
            series_rows.append((sid, replica, signal, metric, '{"engine":"0"}', "vllm_engine"))
            point_rows += [(sid, ts(T0), 0.0), (sid, ts(T0 + 60), total)]
        sid += 1
        series_rows.append(
            (sid, replica, "kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", "{}", "vllm_engine")
        )
        point_rows += [(sid, ts(T0 + 15), 0.2), (sid, ts(T0 + 30), 0.6), (sid, ts(T0 + 75), 0.9)]
    series = pl.LazyFrame(
        series_rows,
        schema=["series_id", "target_id", "signal", "metric", "labels", "source"],
        orient="row",
    )
    targets = pl.LazyFrame(
        {
            "target_id": ["r0", "r1"],
            "replica": ["r0", "r1"],
            "host": ["h0", "h0"],
            "zone": ["z", "z"],
            "pool": ["chat", "chat"],
            "model": ["m", "m"],
        }
    )
    points = pl.LazyFrame(point_rows, schema=["series_id", "ts", "value"], orient="row")
    return points, series_dimensions(series, targets)


def expected(q: float, replicas: list[str]) -> float:
    summed = [sum(COUNTS[r][1][i] - COUNTS[r][0][i] for r in replicas) for i in range(len(BOUNDS))]
    return histogram_quantile(q, [(float(b), c) for b, c in zip(BOUNDS, summed, strict=True)])


@pytest.mark.parametrize("q", [0.5, 0.9, 0.95, 0.99])
def test_fleet_and_replica_quantiles_follow_promql_order(q: float) -> None:
    points, dims = build()
    common = {"signal": Signal.TTFT_S, "q": q, "range_s": 60.0, "window_ends_s": [T0 + 60]}
    fleet = histogram_quantiles(points, dims, scope=Scope.FLEET, **common).collect()  # type: ignore[arg-type]
    assert fleet["quantile"].to_list() == pytest.approx([expected(q, ["r0", "r1"])])
    per = histogram_quantiles(points, dims, scope=Scope.REPLICA, **common).collect()  # type: ignore[arg-type]
    got = dict(zip(per["replica"], per["quantile"], strict=True))
    assert got == pytest.approx({"r0": expected(q, ["r0"]), "r1": expected(q, ["r1"])})


def test_hit_rate_is_a_ratio_of_increases() -> None:
    points, dims = build()
    args = {"range_s": 60.0, "window_ends_s": [T0 + 60], "scope": Scope.POOL}
    hits = counter_increases(points, dims, signal=Signal.PREFIX_CACHE_HITS_TOKENS, **args)  # type: ignore[arg-type]
    queries = counter_increases(points, dims, signal=Signal.PREFIX_CACHE_QUERIES_TOKENS, **args)  # type: ignore[arg-type]
    ratio = counter_ratio(hits, queries, scope=Scope.POOL, name="hit_ratio").collect()
    assert ratio["hit_ratio"].to_list() == pytest.approx([550 / 4000])


def test_gauge_stats_per_window() -> None:
    points, dims = build()
    stats = gauge_stats(
        points,
        dims,
        signal=Signal.KV_CACHE_USAGE_RATIO,
        range_s=60.0,
        window_ends_s=[T0 + 60, T0 + 120],
        scope=Scope.REPLICA,
    ).collect()
    first = stats.filter(pl.col("window_end_s") == T0 + 60)
    assert first["mean"].to_list() == pytest.approx([0.4, 0.4])
    assert first["max"].to_list() == pytest.approx([0.6, 0.6])
    assert stats.filter(pl.col("window_end_s") == T0 + 120)["max"].to_list() == [0.9, 0.9]


def test_overlapping_gauge_windows_are_refused() -> None:
    points, dims = build()
    with pytest.raises(ValueError, match="overlap"):
        gauge_stats(
            points,
            dims,
            signal=Signal.KV_CACHE_USAGE_RATIO,
            range_s=60.0,
            window_ends_s=[T0 + 30, T0 + 60],
            scope=Scope.FLEET,
        )
