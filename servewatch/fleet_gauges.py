"""Fleet gauges: the SLO, capacity and finding figures `servewatch run` serves on `/metrics`
for the user's Prometheus, Grafana and KEDA (names in docs/live.md; a dashboard is generated
against them, so they are a contract).

The evaluation job computes one `FleetGaugeSnapshot` a minute from the store; the collector
serves the last one whole, so a scrape never sees half of one evaluation and half of the next.
The event counters are the one stateful part: monotonic, as Prometheus counters must be, they
start from each SLO's events over its period at the service's first evaluation and grow by
each minute's events as they are evaluated (late events of a minute still in the period are
added when they arrive; a count that shrinks, which ingest never causes, is not subtracted).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from servewatch.health.finding import FindingKind
from servewatch.pipeline.metric_sli import Scope, gauge_stats, series_dimensions
from servewatch.pipeline.signals import Signal
from servewatch.slo.burn_rate import evaluation_minute
from servewatch.slo.finding_alerts import FindingEvaluation
from servewatch.slo.spec import SloSpec
from servewatch.slo.status import SloStatus
from servewatch.store import Store

# Queue depth and KV usage are the mean of each replica's samples over this last stretch.
GAUGE_RANGE_S = 60.0
# Demand is the traced completions of this last stretch, per second.
DEMAND_RANGE = timedelta(minutes=5)
# A target last scraped longer ago than this does not count as serving.
SERVING_WITHIN = timedelta(minutes=2)
FLEET_POOL = "all"
"""The pool label of a recommendation sized on the whole fleet rather than one pool."""


@dataclass(frozen=True)
class SloGauges:
    slo: str
    good_events: float
    events: float
    budget_remaining_ratio: float | None
    attainment_ratio: float | None
    burn_rates: tuple[tuple[str, float | None], ...]


@dataclass(frozen=True)
class PoolGauges:
    pool: str
    recommended_replicas: int | None = None
    # (low, mid, high) requests per second the pool's serving replicas hold at the SLO.
    capacity_rps: tuple[float | None, float | None, float | None] | None = None
    headroom_ratio: float | None = None
    queue_depth: float | None = None
    kv_usage_ratio: float | None = None


@dataclass(frozen=True)
class FleetGaugeSnapshot:
    at: datetime | None = None  # the evaluation instant (None before the first)
    slos: tuple[SloGauges, ...] = ()
    pools: tuple[PoolGauges, ...] = ()
    findings_active: Mapping[str, int] = field(default_factory=dict)


class EventCounters:
    """Per SLO, good and total events counted so far, each minute's counted once (and its
    late events when they arrive)."""

    def __init__(self) -> None:
        self._counted: dict[tuple[str, datetime], tuple[int, int]] = {}
        self._totals: dict[str, tuple[float, float]] = {}

    def add(
        self, minutes: pl.DataFrame, *, specs: Sequence[SloSpec], at: datetime
    ) -> dict[str, tuple[float, float]]:
        """Count the whole minutes before `at` of `minutes` (slo, minute_ts, good, total) that
        lie in each SLO's period; returns (good, total) per SLO."""
        end = evaluation_minute(at)
        starts = {s.name: end - timedelta(seconds=s.period_s) for s in specs}
        per_minute = (
            minutes.filter(pl.col("minute_ts") < end)
            .group_by("slo", "minute_ts")
            .agg(pl.col("good").sum(), pl.col("total").sum())
        )
        for slo, minute, good, total in per_minute.iter_rows():
            if slo not in starts or minute < starts[slo]:
                continue
            seen_good, seen_total = self._counted.get((slo, minute), (0, 0))
            add_good, add_total = max(good - seen_good, 0), max(total - seen_total, 0)
            self._counted[(slo, minute)] = (max(good, seen_good), max(total, seen_total))
            old_good, old_total = self._totals.get(slo, (0.0, 0.0))
            self._totals[slo] = (old_good + add_good, old_total + add_total)
        # Minutes past every period can no longer change what is counted.
        oldest = min(starts.values(), default=end)
        self._counted = {k: v for k, v in self._counted.items() if k[1] >= oldest}
        return {s.name: self._totals.get(s.name, (0.0, 0.0)) for s in specs}


def slo_gauges(
    statuses: Sequence[SloStatus], counted: Mapping[str, tuple[float, float]]
) -> tuple[SloGauges, ...]:
    return tuple(
        SloGauges(
            slo=status.slo,
            good_events=counted.get(status.slo, (0.0, 0.0))[0],
            events=counted.get(status.slo, (0.0, 0.0))[1],
            # A window without events has no budget figure to show (absent, not full).
            budget_remaining_ratio=status.budget_remaining_ratio if status.total else None,
            attainment_ratio=status.good / status.total if status.total else None,
            burn_rates=tuple((w.window, w.burn_rate) for w in status.windows),
        )
        for status in statuses
    )


def findings_active(evaluation: FindingEvaluation | None) -> dict[str, int]:
    """Active finding alerts by failure mode, every mode present (0 when none is active)."""
    counts = {kind.value: 0 for kind in FindingKind}
    if evaluation is None:
        return counts
    for condition in evaluation.conditions:
        kind = dict(condition.labels).get("kind")
        if condition.active and kind in counts:
            counts[kind] += 1
    return counts


def _last_record(store: Store) -> dict[str, Any] | None:
    last = store.read_recommendations().collect().tail(1)
    if last.height == 0:
        return None
    record: dict[str, Any] = json.loads(last.item(0, "record"))
    return record


def _replica_means(
    points: pl.LazyFrame, dimensions: pl.LazyFrame, *, signal: Signal, end_s: float
) -> pl.LazyFrame:
    return gauge_stats(
        points,
        dimensions,
        signal=signal,
        range_s=GAUGE_RANGE_S,
        window_ends_s=[end_s],
        scope=Scope.REPLICA,
    ).select("replica", pl.col("mean"))


def pool_gauges(store: Store, *, at: datetime) -> tuple[PoolGauges, ...]:
    """Per pool: the last recommendation's replicas and capacity (scaled to the replicas
    serving now), headroom against the last minutes' traced demand, queue depth (requests
    waiting, summed over replicas) and KV-cache usage (mean over replicas)."""
    naive_end = at.astimezone(UTC).replace(tzinfo=None) if at.tzinfo is not None else at
    end_s = (naive_end - datetime(1970, 1, 1)).total_seconds()
    targets = store.read_targets().collect()
    pools_of = (
        targets.filter(pl.col("replica").is_not_null())
        .group_by("replica")
        .agg(pl.col("pool").drop_nulls().first())
        .filter(pl.col("pool").is_not_null())
    )
    serving = (
        targets.filter(
            pl.col("replica").is_not_null()
            & pl.col("pool").is_not_null()
            & (pl.col("last_seen_ts") >= naive_end - SERVING_WITHIN)
        )
        .group_by("pool")
        .agg(pl.col("replica").n_unique().alias("replicas"))
    )
    points = store.read_points(
        from_ts=naive_end - timedelta(seconds=2 * GAUGE_RANGE_S), to_ts=naive_end
    )
    dimensions = series_dimensions(store.read_series(), store.read_targets()).collect().lazy()

    def by_pool(signal: Signal, how: pl.Expr, name: str) -> dict[str, float]:
        means = _replica_means(points, dimensions, signal=signal, end_s=end_s).collect()
        joined = means.join(pools_of, on="replica", how="inner")
        folded = joined.group_by("pool").agg(how.alias(name))
        return dict(zip(folded["pool"].to_list(), folded[name].to_list(), strict=True))

    queue = by_pool(Signal.REQUESTS_WAITING, pl.col("mean").sum(), "queue")
    kv = by_pool(Signal.KV_CACHE_USAGE_RATIO, pl.col("mean").mean(), "kv")
    demand_rows = (
        store.read_requests(from_ts=naive_end - DEMAND_RANGE, to_ts=naive_end)
        .filter(pl.col("pool").is_not_null())
        .group_by("pool")
        .agg(pl.len().alias("requests"))
        .collect()
    )
    demand_rps = {pool: n / DEMAND_RANGE.total_seconds() for pool, n in demand_rows.iter_rows()}
    replicas_now = dict(serving.iter_rows())
    record = _last_record(store)
    per_replica: dict[str, tuple[float | None, float | None, float | None]] = {}
    recommended: dict[str, int] = {}
    if record is not None:
        for pool in record.get("capacity_by_pool") or []:
            per_replica[pool["pool"]] = (
                pool.get("capacity_low_rps"),
                pool.get("capacity_rps_per_replica"),
                pool.get("capacity_high_rps"),
            )
        if record.get("recommendation"):
            fit = record.get("capacity_fit") or {}
            recommended[fit.get("pool") or FLEET_POOL] = record["recommendation"]["replicas"]
    names = sorted(set(queue) | set(kv) | set(per_replica) | set(recommended) | set(replicas_now))
    gauges = []
    for name in names:
        capacity: tuple[float | None, float | None, float | None] | None = None
        headroom = None
        if name in per_replica and replicas_now.get(name):
            count = replicas_now[name]
            low, mid, high = (None if v is None else v * count for v in per_replica[name])
            capacity = (low, mid, high)
            if mid:
                headroom = 1.0 - demand_rps.get(name, 0.0) / mid
        gauges.append(
            PoolGauges(
                pool=name,
                recommended_replicas=recommended.get(name),
                capacity_rps=capacity,
                headroom_ratio=headroom,
                queue_depth=queue.get(name),
                kv_usage_ratio=kv.get(name),
            )
        )
    return tuple(gauges)


class FleetGaugeCollector(Collector):
    """Serves the last snapshot; `update` replaces it whole."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot = FleetGaugeSnapshot(findings_active=findings_active(None))

    def update(self, snapshot: FleetGaugeSnapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    @property
    def snapshot(self) -> FleetGaugeSnapshot:
        with self._lock:
            return self._snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        good = CounterMetricFamily(
            "servewatch_slo_good_events",
            "Good events of the SLO, counted as evaluated (requests, or output tokens).",
            labels=["slo"],
        )
        total = CounterMetricFamily(
            "servewatch_slo_events",
            "All events of the SLO, counted as evaluated (requests, or output tokens).",
            labels=["slo"],
        )
        budget = _gauge(
            "servewatch_slo_budget_remaining_ratio",
            "Error budget left over the SLO's period (absent while the period has no events).",
            ["slo"],
        )
        burn = _gauge(
            "servewatch_slo_burn_rate",
            "Burn rate over each alert window (1 spends the budget exactly over the period).",
            ["slo", "window"],
        )
        attainment = _gauge(
            "servewatch_slo_attainment_ratio", "Good over all events in the SLO's period.", ["slo"]
        )
        for s in snap.slos:
            good.add_metric([s.slo], s.good_events)
            total.add_metric([s.slo], s.events)
            _add(budget, [s.slo], s.budget_remaining_ratio)
            _add(attainment, [s.slo], s.attainment_ratio)
            for window, rate in s.burn_rates:
                _add(burn, [s.slo, window], rate)
        replicas = _gauge(
            "servewatch_pool_recommended_replicas",
            "Replicas the last capacity recommendation asks for.",
            ["pool"],
        )
        capacity = _gauge(
            "servewatch_pool_capacity_rps",
            "Requests per second the pool's serving replicas hold at the SLO (bound: the "
            "interval's low and high ends, mid the estimate).",
            ["pool", "bound"],
        )
        headroom = _gauge(
            "servewatch_pool_headroom_ratio",
            "1 - demand over capacity at the SLO (negative: over capacity).",
            ["pool"],
        )
        queue = _gauge(
            "servewatch_pool_queue_depth", "Requests waiting, summed over replicas.", ["pool"]
        )
        kv = _gauge(
            "servewatch_pool_kv_usage_ratio", "KV-cache usage, mean over replicas.", ["pool"]
        )
        for p in snap.pools:
            _add(replicas, [p.pool], p.recommended_replicas)
            if p.capacity_rps is not None:
                for bound, value in zip(("low", "mid", "high"), p.capacity_rps, strict=True):
                    _add(capacity, [p.pool, bound], value)
            _add(headroom, [p.pool], p.headroom_ratio)
            _add(queue, [p.pool], p.queue_depth)
            _add(kv, [p.pool], p.kv_usage_ratio)
        findings = _gauge(
            "servewatch_findings_active", "Fleet-health findings active, by mode.", ["mode"]
        )
        for mode, count in sorted(snap.findings_active.items()):
            findings.add_metric([mode], count)
        yield from (good, total, budget, burn, attainment)
        yield from (replicas, capacity, headroom, queue, kv, findings)


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


def _add(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, float(value))
