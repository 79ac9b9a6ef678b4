"""Recommendation: a requirement and what the fleet showed, turned into a decision record.

Measurements replace stated assumptions where they exist, and the record says so: a capacity fit
(a pool's attainment knee, or a latency line) replaces the stated per-replica capacity (its
interval becomes the range; an extrapolated knee's range reaches down to the highest observed
load, and a fit that bounds no capacity leaves the stated one with that load as its low end),
and the observed cache hit ratio replaces the stated one (p10-p90 becomes the range; when it is
unstable the range reaches down to the ratio with router affinity lost, since that is what a
restart or a rollout does to it). Observed demand (`capacity.observed_demand`) sizes a
requirement that says `req_per_min = "observed"`, and stands beside a stated demand in the
record. Then the fleet is sized, the risk assessed with the same sizing, and the record
assembled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from functools import partial

from servewatch.capacity.cache_hit_rate import HitRatioSpread
from servewatch.capacity.capacity_fit import CapacityFit, KneeFit, LoadUnit, capacity_figure
from servewatch.capacity.cost import AutoscaledFleet
from servewatch.capacity.decision_record import DecisionRecord
from servewatch.capacity.demand import RateDemand, TokenDemand
from servewatch.capacity.failure_table import RateUnit
from servewatch.capacity.figure import derived, fmt
from servewatch.capacity.fleet_drills import drill_candidates
from servewatch.capacity.fleet_size import FleetSize, size_fleet
from servewatch.capacity.observed_demand import ObservedDemand
from servewatch.capacity.parallel import Mapper, serial_map
from servewatch.capacity.placement import NO_LAYOUT, Layout
from servewatch.capacity.pool_capacity import PoolCapacity, pool_capacity_figure
from servewatch.capacity.requirement import Requirement, RequirementError, figures, replace_figure
from servewatch.capacity.risk import assess_risk, capacity_path
from servewatch.capacity.sizing import RateCapacity


def with_measured_capacity(requirement: Requirement, fit: KneeFit) -> tuple[Requirement, str]:
    """The requirement with its per-replica capacity replaced by the fit, and a note saying so."""
    rate_form = isinstance(requirement.replica, RateCapacity)
    path = capacity_path(requirement)
    stated = figures(requirement)[path]
    if isinstance(fit, PoolCapacity):
        try:
            measured = pool_capacity_figure(fit, rate_form=rate_form)
        except ValueError as exc:
            return _unbounded(requirement, path, fit, rate_form=rate_form, why=str(exc))
    elif isinstance(fit, CapacityFit):
        wanted = LoadUnit.REQ_PER_S if rate_form else LoadUnit.RUNNING_BATCH
        if fit.load_unit is not wanted:
            raise RequirementError(
                f"{requirement.source}: {path}: a capacity fit over load "
                f"in {fit.load_unit.value} cannot replace it; fit over load in {wanted.value}"
            )
        try:
            measured = capacity_figure(fit)
        except ValueError as exc:
            return requirement, f"{path}: kept the stated {stated.text()}: {exc}"
    else:
        raise TypeError(f"no capacity figure for a {type(fit).__name__}")
    note = f"{path}: measured {measured.text()} replaces the stated {stated.text()}"
    return replace_figure(requirement, path, measured), note


def _unbounded(
    requirement: Requirement, path: str, fit: PoolCapacity, *, rate_form: bool, why: str
) -> tuple[Requirement, str]:
    """Keep the stated capacity, but only the highest observed load is shown to meet the SLO,
    so that load becomes the low end of its range."""
    stated = figures(requirement)[path]
    scale = 60.0 if rate_form else fit.attainment.completion_tokens_per_request
    shown = fit.load_max * scale
    if not (math.isinf(fit.knee_load) and fit.load_max > 0 and shown < stated.value):
        return requirement, f"{path}: kept the stated {stated.text()}: {why}"
    low = min(shown, stated.low if stated.low is not None else stated.value)
    high = stated.high if stated.high is not None else stated.value
    kept = stated.with_range(
        low,
        high,
        why=f"low end {fmt(shown)} {stated.unit}, the highest load observed meeting the SLO",
    )
    note = f"{path}: kept the stated {stated.text()} (range low end lowered to {fmt(shown)}): {why}"
    return replace_figure(requirement, path, kept), note


def with_measured_hit_ratio(
    requirement: Requirement, spread: HitRatioSpread
) -> tuple[Requirement, str | None]:
    """The requirement with the observed hit ratio (token demand only), and a note saying so."""
    if not isinstance(requirement.demand, TokenDemand):
        return requirement, None
    path = "demand.cache_hit_ratio"
    stated = requirement.demand.cache_hit_ratio
    observed = spread.figure()
    note = f"{path}: measured {observed.text()} replaces the stated {stated.text()}"
    threshold = requirement.risk.unstable_hit_spread_ratio.value
    lost = requirement.risk.affinity_loss_hit_ratio.value
    if spread.spread_ratio > threshold and observed.low is not None and observed.high is not None:
        observed = observed.with_range(
            min(observed.low, lost),
            observed.high,
            why=(
                f"low end extended to {fmt(lost)}, the ratio with router affinity lost, because "
                f"p90 - p10 = {fmt(spread.spread_ratio)} exceeds {fmt(threshold)}"
            ),
        )
    return replace_figure(requirement, path, observed), note


def recommend(
    requirement: Requirement,
    *,
    now: datetime,
    fit: KneeFit | None = None,
    hit_ratio: HitRatioSpread | None = None,
    layout: Layout = NO_LAYOUT,
    pools: tuple[PoolCapacity, ...] = (),
    observed: ObservedDemand | None = None,
    drill: bool = True,
    mapper: Mapper = serial_map,
) -> DecisionRecord:
    """Size the fleet for `requirement`, with measurements where given, and record why.
    With a fitted engine model (and `drill`), the failure table's answer is drilled in
    simulation (fleet_drills.py) and the smallest fleet whose drill holds is recommended."""
    notes: list[str] = []
    if observed is not None:
        requirement, demand_note = with_observed_demand(requirement, observed)
        notes.append(demand_note)
    if fit is not None:
        requirement, note = with_measured_capacity(requirement, fit)
        notes.append(note)
    if hit_ratio is not None:
        requirement, hit_note = with_measured_hit_ratio(requirement, hit_ratio)
        if hit_note is not None:
            notes.append(hit_note)
    sizer = partial(size_fleet, layout=layout)
    try:
        fleet = sizer(requirement)
    except ValueError as exc:
        raise RequirementError(f"{requirement.source}: {exc}") from exc
    risk = assess_risk(requirement, fleet, sizer=sizer, fit=fit, hit_ratio=hit_ratio, layout=layout)
    autoscaled = None if observed is None else autoscaled_fleet(requirement, observed, sizer=sizer)
    drills = None
    if drill and isinstance(fit, PoolCapacity) and fit.engine_model is not None:
        drills = drill_candidates(
            fleet.table,
            requirement=requirement,
            model=fit.engine_model,
            demand_rps=drill_demand_rps(fleet, requirement),
            seed=fit.attainment.spec.seed,
            mapper=mapper,
        )
        if drills is not None:
            notes.append(drills.summary())
    return DecisionRecord(
        requirement=requirement,
        created_at=now,
        fleet=fleet,
        risk=risk,
        capacity_fit=fit,
        hit_ratio=hit_ratio,
        layout=layout,
        notes=tuple(notes),
        pools=pools,
        observed_demand=observed,
        autoscaled=autoscaled,
        drills=drills,
    )


def drill_demand_rps(fleet: FleetSize, requirement: Requirement) -> float:
    """The requests per second a drill drives, headroom included."""
    spec = fleet.table.spec
    if spec.unit is RateUnit.REQ_PER_MIN:
        return spec.demand_rate / 60.0
    return fleet.demand.req_per_min.value * (1.0 + requirement.headroom_ratio.value) / 60.0


def autoscaled_fleet(
    requirement: Requirement,
    observed: ObservedDemand,
    *,
    sizer: Callable[[Requirement], FleetSize],
) -> AutoscaledFleet | None:
    """The fleet each observed hour needs, the peak demand scaled by that hour's mean arrivals
    over the peak minute's, under the same failure promise, averaged over the hours; None for
    token demand (no request shape to scale) or when some hour cannot be met."""
    demand = requirement.demand
    if not isinstance(demand, RateDemand) or demand.peak_req_per_min is None:
        return None
    peak = demand.peak_req_per_min
    if observed.peak_req_per_min <= 0 or not observed.daily_shape:
        return None
    replicas = []
    for hour, mean_req_per_min in observed.daily_shape:
        share = mean_req_per_min / observed.peak_req_per_min
        hourly = derived(peak.value * share, "req/min", f"{peak.text()} x {fmt(share)} at {hour}h")
        fleet = sizer(replace(requirement, demand=replace(demand, peak_req_per_min=hourly)))
        if fleet.table.minimum is None:
            return None
        replicas.append(fleet.table.minimum.replicas)
    return AutoscaledFleet(mean_replicas=sum(replicas) / len(replicas), hours=len(replicas))


def with_observed_demand(
    requirement: Requirement, observed: ObservedDemand
) -> tuple[Requirement, str]:
    """The requirement sized on the observed peak minute where it says "observed"; a stated
    demand is kept, with what was observed beside it."""
    demand = requirement.demand
    peak = f"{fmt(observed.peak_req_per_min)} req/min (observed demand below)"
    if isinstance(demand, RateDemand) and demand.peak_req_per_min is None:
        measured_demand = replace(demand, peak_req_per_min=observed.peak_figure())
        note = f"demand.peak_req_per_min is the observed peak minute, {peak}"
        return replace(requirement, demand=measured_demand), note
    stated = (
        demand.peak_req_per_min.text()
        if isinstance(demand, RateDemand) and demand.peak_req_per_min is not None
        else "concurrent users"
    )
    return requirement, f"demand stated as {stated} is kept; the observed peak minute was {peak}"
