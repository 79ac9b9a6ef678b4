"""`servewatch recommend`: the capacity recommendation fed by what the fleet did.

Reads from the store what the capacity package needs: the traced requests (each pool's SLO
attainment against load, when the requirement's SLO states TTFT or TPOT limits) or per replica
and minute the load and the p95 latency the SLO names (the line fit, when it states only a
latency limit); the scraped running batch and prefix-cache counters per minute (the latency
models, and the hit ratio's spread); and where replicas sit (targets: replica, host, zone).
Whatever is missing is left to the requirement's stated figures, and the record says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from servewatch.capacity.attainment_fit import AttainmentSpec
from servewatch.capacity.cache_hit_rate import HITS, QUERIES, HitRatioSpread, observe_hit_ratio
from servewatch.capacity.capacity_fit import FitSpec, KneeFit, LoadUnit, fit_capacity
from servewatch.capacity.decision_record import DecisionRecord
from servewatch.capacity.observed_demand import ObservedDemand, observed_demand
from servewatch.capacity.parallel import Mapper, serial_map
from servewatch.capacity.placement import NO_LAYOUT, Layout, layout_from_inventory
from servewatch.capacity.pool_capacity import PoolCapacity, engine_model_settings, pool_capacities
from servewatch.capacity.recommendation import recommend
from servewatch.capacity.requirement import Requirement
from servewatch.capacity.sizing import RateCapacity
from servewatch.pipeline.metric_frames import metric_minute_frames
from servewatch.pipeline.metric_minutes import MINUTE_S
from servewatch.pipeline.metric_sli import series_dimensions
from servewatch.store import Store

FIT_SEED = 20261129
HIT_RATIO_WINDOWS = 6  # at least this many windows for the hit ratio's spread, up to hourly
HIT_RATIO_LONGEST_MIN = 60


@dataclass(frozen=True)
class Measurements:
    fit: KneeFit | None
    hit_ratio: HitRatioSpread | None
    layout: Layout
    notes: tuple[str, ...]
    pools: tuple[PoolCapacity, ...] = ()
    demand: ObservedDemand | None = None


def hit_ratio_every(window: tuple[datetime, datetime]) -> str:
    """Hourly windows, or shorter ones (whole minutes) when the data spans too few hours to
    show a spread."""
    span_min = (window[1] - window[0]).total_seconds() / 60.0
    minutes = max(1, min(HIT_RATIO_LONGEST_MIN, int(span_min // HIT_RATIO_WINDOWS)))
    return "1h" if minutes == HIT_RATIO_LONGEST_MIN else f"{minutes}m"


def _chosen_pool(
    pools: tuple[PoolCapacity, ...], wanted: str | None
) -> tuple[PoolCapacity | None, str | None]:
    """The pool whose capacity replaces the stated one, and a note when the choice was made."""
    if not pools:
        return None, None
    if wanted is not None:
        named = [p for p in pools if p.pool == wanted]
        if not named:
            seen = ", ".join(p.pool for p in pools)
            return None, f"replica.pool {wanted!r} was not observed (pools seen: {seen})"
        return named[0], None
    if len(pools) == 1:
        return pools[0], None
    lowest = min(pools, key=lambda p: p.knee_load)
    return lowest, (
        f"{len(pools)} pools observed and replica.pool not stated: sized on pool "
        f"{lowest.pool!r}, the lowest capacity per replica"
    )


def _latency_column(requirement: Requirement) -> str:
    named = requirement.slo.latency.lower()
    if "ttft" in named:
        return "ttft_p95_s"
    if "e2e" in named:
        return "e2e_p95_s"
    return "tpot_p95_s"


def _window(
    store: Store, from_ts: datetime | None, to_ts: datetime | None, *, partitions: Path | None
) -> tuple[datetime, datetime] | None:
    span = (
        store.request_minute_span(from_ts=from_ts, to_ts=to_ts)
        if partitions is None
        else store.rolled_minute_span(from_ts=from_ts, to_ts=to_ts)
    )
    return None if span is None else (from_ts or span[0], to_ts or span[1])


def _requests(
    store: Store, window: tuple[datetime, datetime], *, partitions: Path | None
) -> pl.LazyFrame:
    start, end = window
    if partitions is None:
        return store.read_requests(from_ts=start, to_ts=end)
    return store.read_partition_requests(partitions, from_ts=start, to_ts=end)


def measure(
    store: Store,
    *,
    requirement: Requirement,
    from_ts: datetime | None,
    to_ts: datetime | None,
    mapper: Mapper = serial_map,
    partitions: Path | None = None,
) -> Measurements:
    """What the fleet did in the window: its layout, the capacity fit per pool, the cache hit
    ratio and the observed demand. The traced requests come from the store, or from the
    compacted `partitions` (`servewatch compact`) of a store rolled up from them."""
    notes: list[str] = []
    layout = _layout(store, notes)
    fit: KneeFit | None = None
    limit = requirement.slo.latency_limit_s
    window = _window(store, from_ts, to_ts, partitions=partitions)
    # One read of the scraped series serves the running-batch load and the hit ratio.
    frames = (
        {}
        if window is None
        else metric_minute_frames(
            store.read_points(from_ts=window[0], to_ts=window[1]),
            series_dimensions(store.read_series(), store.read_targets()).collect().lazy(),
            start=window[0],
            end=window[1],
        )
    )
    # One read of the window's requests serves the capacity fit and the observed demand.
    requests = None if window is None else _requests(store, window, partitions=partitions)
    pools: tuple[PoolCapacity, ...] = ()
    slo = requirement.slo
    if window is None or requests is None:  # one is None only with the other
        notes.append("no traced request minutes in the window: capacity taken as stated")
    elif slo.attainment:
        spec = AttainmentSpec(
            ttft_limit_s=slo.ttft_limit_s,
            tpot_limit_s=slo.tpot_limit_s,
            target_ratio=slo.target_ratio,
            seed=FIT_SEED,
        )
        pools, pool_notes = pool_capacities(
            requests,
            spec=spec,
            data=f"traced requests, {window[0]:%Y-%m-%d %H:%M} to {window[1]:%Y-%m-%d %H:%M} UTC",
            running=frames.get("scheduler_state"),
            prefix=frames.get("prefix_cache"),
            engine_model=engine_model_settings(requirement),
            mapper=mapper,
        )
        notes.extend(pool_notes)
        fit, pool_note = _chosen_pool(pools, requirement.pool)
        if pool_note is not None:
            notes.append(pool_note)
    elif limit is None:
        notes.append(
            "the requirement states no slo.ttft_limit_s, slo.tpot_limit_s or "
            "slo.latency_limit_s: capacity taken as stated"
        )
    else:
        column = _latency_column(requirement)
        stored, _ = store.current_request_minutes(requests, from_ts=window[0], to_ts=window[1])
        minutes = stored.filter(pl.col("replica").is_not_null())
        if isinstance(requirement.replica, RateCapacity):
            frame = minutes.select(
                "replica", load=pl.col("requests") / MINUTE_S, latency_p95_s=pl.col(column)
            )
            unit = LoadUnit.REQ_PER_S
        else:
            running = frames["scheduler_state"].select(
                "replica", "minute_ts", load=pl.col("running_requests")
            )
            frame = running.join(
                minutes.select("replica", "minute_ts", latency_p95_s=pl.col(column)),
                on=["replica", "minute_ts"],
            ).select("replica", "load", "latency_p95_s")
            unit = LoadUnit.RUNNING_BATCH
        try:
            fit = fit_capacity(
                frame.drop_nulls(),
                spec=FitSpec(latency_limit_s=limit, load_unit=unit, seed=FIT_SEED),
                data=f"{column} per replica-minute, {window[0]:%Y-%m-%d %H:%M} to "
                f"{window[1]:%Y-%m-%d %H:%M} UTC",
            )
        except ValueError as exc:
            notes.append(f"capacity fit not usable: {exc}")

    hit_ratio = None
    if window is not None:
        # The dashboards' per-minute prefix-cache frame, summed over replicas.
        minutes_frame = (
            frames["prefix_cache"]
            .group_by("minute_ts")
            .agg(
                pl.col("hits_tokens").sum().alias(HITS),
                pl.col("queries_tokens").sum().alias(QUERIES),
            )
        )
        every = hit_ratio_every(window)
        try:
            hit_ratio = observe_hit_ratio(
                minutes_frame, every=every, data=f"fleet prefix cache, per {every}"
            )
        except ValueError as exc:
            notes.append(f"cache hit ratio spread not usable: {exc}")
    demand = None if requests is None else _observed_demand(requests, requirement, notes)
    return Measurements(
        fit=fit, hit_ratio=hit_ratio, layout=layout, notes=tuple(notes), pools=pools, demand=demand
    )


def _layout(store: Store, notes: list[str]) -> Layout:
    """Where replicas sit today, from the scrape targets that name their replica and host."""
    placed = (
        store.read_targets()
        .filter(
            (pl.col("kind") == "vllm")
            & pl.col("replica").is_not_null()
            & pl.col("host").is_not_null()
        )
        .collect()
    )
    if not placed.height:
        notes.append("no scrape targets with replica and host: placement taken as stated")
        return NO_LAYOUT
    rows = placed.select("replica", "host", pl.col("zone").fill_null("(no zone)")).rows()
    return layout_from_inventory(rows)


def _observed_demand(
    requests: pl.LazyFrame, requirement: Requirement, notes: list[str]
) -> ObservedDemand | None:
    """The window's traced arrivals, of the requirement's pool when it names one."""
    if requirement.pool is not None:
        requests = requests.filter(pl.col("pool") == requirement.pool)
    demand = observed_demand(requests)
    if demand is None:
        notes.append("demand not observed: the traced requests span under three minutes")
    return demand


def recommend_from_store(
    store: Store,
    *,
    requirement: Requirement,
    from_ts: datetime | None = None,
    to_ts: datetime | None = None,
    now: datetime | None = None,
    mapper: Mapper = serial_map,
    partitions: Path | None = None,
) -> tuple[DecisionRecord, Measurements]:
    """Measure, size and drill; `mapper` spreads the simulations (capacity/parallel.py)."""
    measured = measure(
        store,
        requirement=requirement,
        from_ts=from_ts,
        to_ts=to_ts,
        mapper=mapper,
        partitions=partitions,
    )
    record = recommend(
        requirement,
        now=now or datetime.now(UTC),
        fit=measured.fit,
        hit_ratio=measured.hit_ratio,
        layout=measured.layout,
        pools=measured.pools,
        observed=measured.demand,
        mapper=mapper,
    )
    return record, measured
