"""Recommendation: a requirement and what the fleet showed, turned into a decision record.

Measurements replace stated assumptions where they exist, and the record says so: a capacity fit
replaces the stated per-replica capacity (its interval becomes the range; an extrapolated knee's
range reaches down to the highest observed load), and the observed cache hit ratio replaces the
stated one (p10-p90 becomes the range; when it is unstable the range reaches down to the ratio
with router affinity lost, since that is what a restart or a rollout does to it). Then the fleet
is sized, the risk assessed with the same sizing, and the record assembled.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial

from capacity.cache_hit_rate import HitRatioSpread
from capacity.capacity_fit import CapacityFit, LoadUnit, capacity_figure
from capacity.decision_record import DecisionRecord
from capacity.demand import TokenDemand
from capacity.figure import fmt
from capacity.fleet_size import size_fleet
from capacity.placement import NO_LAYOUT, Layout
from capacity.requirement import Requirement, RequirementError, figures, replace_figure
from capacity.risk import assess_risk, capacity_path
from capacity.sizing import RateCapacity


def with_measured_capacity(requirement: Requirement, fit: CapacityFit) -> tuple[Requirement, str]:
    """The requirement with its per-replica capacity replaced by the fit, and a note saying so."""
    rate_form = isinstance(requirement.replica, RateCapacity)
    wanted = LoadUnit.REQ_PER_S if rate_form else LoadUnit.RUNNING_BATCH
    if fit.load_unit is not wanted:
        raise RequirementError(
            f"{requirement.source}: {capacity_path(requirement)}: a capacity fit over load "
            f"in {fit.load_unit.value} cannot replace it; fit over load in {wanted.value}"
        )
    path = capacity_path(requirement)
    stated = figures(requirement)[path]
    try:
        measured = capacity_figure(fit)
    except ValueError as exc:
        return requirement, f"{path}: kept the stated {stated.text()}: {exc}"
    note = f"{path}: measured {measured.text()} replaces the stated {stated.text()}"
    return replace_figure(requirement, path, measured), note


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
    fit: CapacityFit | None = None,
    hit_ratio: HitRatioSpread | None = None,
    layout: Layout = NO_LAYOUT,
) -> DecisionRecord:
    """Size the fleet for `requirement`, with measurements where given, and record why."""
    notes: list[str] = []
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
    return DecisionRecord(
        requirement=requirement,
        created_at=now,
        fleet=fleet,
        risk=risk,
        capacity_fit=fit,
        hit_ratio=hit_ratio,
        layout=layout,
        notes=tuple(notes),
    )
