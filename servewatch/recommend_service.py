"""`servewatch recommend`: the capacity recommendation fed by what the fleet did.

Reads from the store what the capacity package needs: per replica and minute the load and the
p95 latency the requirement's SLO names (for the capacity fit), the fleet's prefix-cache hit
ratio per minute (for its spread), and where replicas sit (targets: replica, host, zone).
Whatever is missing is left to the requirement's stated figures, and the record says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl

from capacity.cache_hit_rate import HITS, QUERIES, HitRatioSpread, observe_hit_ratio
from capacity.capacity_fit import CapacityFit, FitSpec, LoadUnit, fit_capacity
from capacity.decision_record import DecisionRecord
from capacity.placement import NO_LAYOUT, Layout, layout_from_inventory
from capacity.recommendation import recommend
from capacity.requirement import Requirement
from capacity.sizing import RateCapacity
from pipeline.metric_frames import metric_minute_frames
from pipeline.metric_minutes import MINUTE_S
from pipeline.metric_sli import series_dimensions
from pipeline.rollup_job import roll_up_request_minutes
from pipeline.store import Store

FIT_SEED = 20261129


@dataclass(frozen=True)
class Measurements:
    fit: CapacityFit | None
    hit_ratio: HitRatioSpread | None
    layout: Layout
    notes: tuple[str, ...]


def _latency_column(requirement: Requirement) -> str:
    named = requirement.slo.latency.lower()
    if "ttft" in named:
        return "ttft_p95_s"
    if "e2e" in named:
        return "e2e_p95_s"
    return "tpot_p95_s"


def _window(
    store: Store, from_ts: datetime | None, to_ts: datetime | None
) -> tuple[datetime, datetime] | None:
    minutes = (
        store.read_request_minutes(from_ts=from_ts, to_ts=to_ts)
        .select(pl.col("minute_ts").min().alias("lo"), pl.col("minute_ts").max().alias("hi"))
        .collect()
    )
    lo, hi = minutes.row(0)
    return None if lo is None else (from_ts or lo, to_ts or hi)


def measure(
    store: Store, *, requirement: Requirement, from_ts: datetime | None, to_ts: datetime | None
) -> Measurements:
    notes: list[str] = []
    roll_up_request_minutes(store)
    targets = store.read_targets().collect()
    placed = targets.filter(
        (pl.col("kind") == "vllm") & pl.col("replica").is_not_null() & pl.col("host").is_not_null()
    )
    layout = NO_LAYOUT
    if placed.height:
        rows = placed.select("replica", "host", pl.col("zone").fill_null("(no zone)")).rows()
        layout = layout_from_inventory(rows)
    else:
        notes.append("no scrape targets with replica and host: placement taken as stated")

    fit = None
    limit = requirement.slo.latency_limit_s
    window = _window(store, from_ts, to_ts)
    # One read of the scraped series serves the running-batch load and the hit ratio.
    frames = (
        {}
        if window is None
        else metric_minute_frames(
            store.read_points(from_ts=window[0], to_ts=window[1]),
            series_dimensions(store.read_series(), store.read_targets()),
            start=window[0],
            end=window[1],
        )
    )
    if limit is None:
        notes.append("the requirement states no slo.latency_limit_s: capacity taken as stated")
    elif window is None:
        notes.append("no traced request minutes in the window: capacity taken as stated")
    else:
        column = _latency_column(requirement)
        minutes = store.read_request_minutes(from_ts=window[0], to_ts=window[1]).filter(
            pl.col("replica").is_not_null()
        )
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
        try:
            hit_ratio = observe_hit_ratio(
                minutes_frame, every="1h", data="fleet prefix cache, hourly"
            )
        except ValueError as exc:
            notes.append(f"cache hit ratio spread not usable: {exc}")
    return Measurements(fit=fit, hit_ratio=hit_ratio, layout=layout, notes=tuple(notes))


def recommend_from_store(
    store: Store,
    *,
    requirement: Requirement,
    from_ts: datetime | None = None,
    to_ts: datetime | None = None,
    now: datetime | None = None,
) -> tuple[DecisionRecord, Measurements]:
    measured = measure(store, requirement=requirement, from_ts=from_ts, to_ts=to_ts)
    record = recommend(
        requirement,
        now=now or datetime.now(UTC),
        fit=measured.fit,
        hit_ratio=measured.hit_ratio,
        layout=measured.layout,
    )
    return record, measured
