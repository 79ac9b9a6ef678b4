"""`servewatch drill`: a fleet drilled through its named failure, from a fleet config or from
what the store shows.

From a fleet config (the emulator's TOML): its engine, topology, router and workload at the
stated demand. From the store and a requirement: the engine fitted from the pool's traced
requests (the knee search's model) at the requirement's demand, for the recommended fleet and
one host fewer (what `recommend` drills), or for a stated host count.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from servewatch.capacity.drill import (
    ConfiguredWorkload,
    DrillFleet,
    DrillResult,
    DrillSpec,
    run_drill,
)
from servewatch.capacity.fleet_drills import DrilledRow, FleetDrills, drill_row, drill_spec
from servewatch.capacity.parallel import process_map
from servewatch.capacity.pool_capacity import PoolCapacity
from servewatch.capacity.recommendation import drill_demand_rps
from servewatch.capacity.requirement import Requirement
from servewatch.capacity.traffic_step import TrafficStepSpec, WarmPool, warm_pool
from servewatch.emulator.fleet_config import FleetConfig
from servewatch.emulator.ground_truth import fleet_capacity_for_config
from servewatch.recommend_service import recommend_from_store
from servewatch.store import Store


class DrillSetupError(Exception):
    """What a drill needs is missing (no fitted engine, no SLO limit)."""


@dataclass(frozen=True)
class StepSettings:
    """`drill --traffic-step`: the step, the autoscaler's lag, what it counts a replica for."""

    ratio: float
    over_s: float
    lag_s: float
    replica_rps: float | None  # None: the fleet's own capacity at the SLO, searched


def _config_fleet(config: FleetConfig) -> DrillFleet:
    return DrillFleet(
        engine=config.engine,
        topology=config.topology,
        router=config.router,
        workload=ConfiguredWorkload(config.workload),
    )


def config_drill(config: FleetConfig, spec: DrillSpec) -> DrillResult:
    """The fleet config's own fleet drilled (its failures are replaced by the drill's)."""
    return run_drill(_config_fleet(config), spec)


def config_warm_pool(config: FleetConfig, spec: DrillSpec, step: StepSettings) -> WarmPool:
    """The warm pool that keeps the config's fleet within its SLO through `step`."""
    replica_rps = step.replica_rps
    if replica_rps is None:
        replica_rps = fleet_capacity_for_config(config, seed=spec.seed).capacity_rps
    return warm_pool(
        _config_fleet(config),
        TrafficStepSpec(
            demand_rps=spec.demand_rps,
            ratio=step.ratio,
            over_s=step.over_s,
            lag_s=step.lag_s,
            cold_start_s=spec.replacement_startup_s,
            replica_rps=replica_rps,
            ttft_limit_s=spec.ttft_limit_s,
            tpot_limit_s=spec.tpot_limit_s,
            target_ratio=spec.target_ratio,
            seed=spec.seed,
        ),
    )


@dataclass(frozen=True)
class StoreDrills:
    """What the store's fleet drilled: the recommendation's drills, or one stated size."""

    drills: FleetDrills | None
    stated: DrilledRow | None
    verdict: str
    notes: tuple[str, ...]


def store_drill(
    store: Store,
    *,
    requirement: Requirement,
    hosts: int | None,
    from_ts: datetime | None,
    to_ts: datetime | None,
) -> StoreDrills:
    """Fit, size and drill as `recommend` does; with `hosts`, also drill that many hosts."""
    with process_map() as mapper:
        record, measured = recommend_from_store(
            store, requirement=requirement, from_ts=from_ts, to_ts=to_ts, mapper=mapper
        )
    fit = record.capacity_fit
    if not isinstance(fit, PoolCapacity) or fit.engine_model is None:
        raise DrillSetupError(
            "no engine model was fitted from the store's traced requests (a drill needs "
            "the requirement's slo.ttft_limit_s or slo.tpot_limit_s and traced requests of "
            f"the pool); notes: {'; '.join(measured.notes) or 'none'}"
        )
    stated = None
    if hosts is not None:
        spec = drill_spec(
            record.requirement,
            demand_rps=drill_demand_rps(record.fleet, record.requirement),
            seed=fit.attainment.spec.seed,
        )
        stated = drill_row(record.fleet.table, hosts=hosts, model=fit.engine_model, spec=spec)
    return StoreDrills(
        drills=record.drills, stated=stated, verdict=record.verdict(), notes=measured.notes
    )
