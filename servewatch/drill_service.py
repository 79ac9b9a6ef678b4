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

from capacity.drill import ConfiguredWorkload, DrillFleet, DrillResult, DrillSpec, run_drill
from capacity.fleet_drills import DrilledRow, FleetDrills, drill_row, drill_spec
from capacity.pool_capacity import PoolCapacity
from capacity.recommendation import drill_demand_rps
from capacity.requirement import Requirement
from emulator.fleet_config import FleetConfig
from pipeline.store import Store
from servewatch.recommend_service import recommend_from_store


class DrillSetupError(Exception):
    """What a drill needs is missing (no fitted engine, no SLO limit)."""


def config_drill(config: FleetConfig, spec: DrillSpec) -> DrillResult:
    """The fleet config's own fleet drilled (its failures are replaced by the drill's)."""
    fleet = DrillFleet(
        engine=config.engine,
        topology=config.topology,
        router=config.router,
        workload=ConfiguredWorkload(config.workload),
    )
    return run_drill(fleet, spec)


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
    record, measured = recommend_from_store(
        store, requirement=requirement, from_ts=from_ts, to_ts=to_ts
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
