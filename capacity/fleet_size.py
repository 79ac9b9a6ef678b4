"""Fleet size: a requirement carried through the sizing chain into the failure table.

The chain says how many replicas' worth of capacity the demand needs (fractional); the failure
table turns that into whole hosts that still carry the demand after the named failure. This is
the function the risk analysis calls again for every perturbed assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

from servewatch.capacity.demand import DemandEstimate, estimate_demand
from servewatch.capacity.failure_table import (
    FailureTable,
    FailureTableSpec,
    RateUnit,
    build_failure_table,
)
from servewatch.capacity.figure import Figure, derived, fmt
from servewatch.capacity.placement import NO_LAYOUT, Layout
from servewatch.capacity.requirement import Requirement
from servewatch.capacity.sizing import SizingChain, size_chain


@dataclass(frozen=True)
class FleetSize:
    demand: DemandEstimate
    chain: SizingChain
    backlog_work: Figure
    table: FailureTable

    @property
    def replicas(self) -> int | None:
        """Replicas of the smallest fleet meeting the requirement; None if none can."""
        return self.table.minimum.replicas if self.table.minimum is not None else None


def backlog_work(requirement: Requirement, demand: DemandEstimate, unit: RateUnit) -> Figure:
    """The backlog in the table's unit of work: requests, or the tokens they still need."""
    backlog = requirement.recovery.backlog_requests
    if unit is RateUnit.REQ_PER_MIN:
        return backlog
    per_request = (
        demand.answer_tokens
        if unit is RateUnit.DECODE_TOKENS_PER_S
        else demand.uncached_prompt_tokens
    )
    assert per_request is not None, "a token-bound chain comes from the token demand model"
    return derived(
        backlog.value * per_request.value,
        unit.work,
        f"{backlog.text()} x {fmt(per_request.value)} {unit.work} per request",
    )


def size_fleet(requirement: Requirement, *, layout: Layout = NO_LAYOUT) -> FleetSize:
    """Size the fleet for `requirement`, growing `layout` (where replicas sit today, if known)."""
    demand = estimate_demand(requirement.demand)
    chain = size_chain(demand, requirement.replica, headroom_ratio=requirement.headroom_ratio)
    backlog = backlog_work(requirement, demand, chain.unit)
    cost = requirement.cost
    spec = FailureTableSpec(
        demand_rate=chain.demand_rate.value,
        replica_rate=chain.replica_rate.value,
        unit=chain.unit,
        failure_unit=requirement.failure_unit,
        zones=requirement.placement.zones,
        replicas_per_host=requirement.placement.replicas_per_host,
        gpus_per_replica=requirement.replica.gpus,
        usd_per_gpu_hour=None if cost.usd_per_gpu_hour is None else cost.usd_per_gpu_hour.value,
        hours_per_month=cost.hours_per_month.value,
        recovery_interval_s=requirement.recovery.interval_s.value,
        backlog_work=backlog.value,
        initial=layout,
        candidate_hosts=requirement.placement.candidate_hosts,
    )
    return FleetSize(
        demand=demand, chain=chain, backlog_work=backlog, table=build_failure_table(spec)
    )
