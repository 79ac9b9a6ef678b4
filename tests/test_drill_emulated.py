"""Drills of fitted engines against the fleets they were fitted from.

Each fleet runs below its knee (tests/engine_model_cases.py), its engine is fitted from what it
served and its knee searched; the recommender's drills (capacity/fleet_drills.py) then find the
smallest fleet whose drill holds at a demand of 80% of what one replica fewer than the fleet
carries at the SLO. The same drill run on the fleet's true engine, workload (conversations,
tenants, prefix cache) and router is the direct emulation the verdicts are checked against, for
the recommended size and for one host fewer.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache

import pytest

from servewatch.capacity.drill import ConfiguredWorkload, DrillFleet, run_drill
from servewatch.capacity.fleet_drills import (
    DrilledRow,
    FleetDrills,
    drill_candidates,
    drill_spec,
    topology,
)
from servewatch.capacity.fleet_size import size_fleet
from servewatch.capacity.knee_search import ModelKnee
from servewatch.capacity.parallel import serial_map
from servewatch.capacity.placement import Layout, layout_from_inventory
from servewatch.capacity.requirement import Requirement, parse_requirement
from tests.engine_model_cases import Case, Outcome, run_case, seeded_cases

pytestmark = pytest.mark.slow

CASES = {case.name: case for case in seeded_cases(7, seed=16)}


def requirement(outcome: Outcome, *, stated_capacity_ratio: float = 1.0) -> Requirement:
    """The case's requirement, its stated replica capacity the refit's (times the ratio)."""
    config, capacity = outcome.case.config, outcome.capacity
    slo = config.slo
    demand_per_min = outcome.truth_rps * (config.topology.replicas - 1) * 0.8 * 60
    text = f"""
name = "drill-{outcome.case.name}"
failure_unit = "host"
[slo]
ttft_limit_s = {slo.ttft_s}
tpot_limit_s = {slo.tpot_s}
target_ratio = {slo.target_ratio}
[demand]
req_per_min = {demand_per_min}
[replica]
capacity_req_per_min = {capacity.knee_load * 60 * stated_capacity_ratio}
[placement]
replicas_per_host = 1
zones = {list(config.topology.zones)!r}
router = "{config.router.policy.value}"
[recovery]
interval_s = 180
replacement_startup_s = 90
"""
    return parse_requirement(tomllib.loads(text), where=f"case {outcome.case.name}")


@cache
def drilled(name: str) -> tuple[Case, Requirement, Layout, FleetDrills]:
    outcome = outcome_of(name)
    model = run_case_model(name)
    req = requirement(outcome)
    placements = outcome.case.config.placements()
    layout = layout_from_inventory((p.replica, p.host, p.zone) for p in placements)
    table = size_fleet(req, layout=layout).table
    drills = drill_candidates(
        table,
        requirement=req,
        model=model,
        demand_rps=table.spec.demand_rate / 60,
        seed=outcome.case.seed,
    )
    assert drills is not None
    return outcome.case, req, layout, drills


def direct_holds(name: str, hosts: int) -> bool:
    case, req, layout, drills = drilled(name)
    config = case.config
    footprint = layout.resized(hosts=hosts, zones=req.placement.zones, replicas_per_host=1)
    fleet = DrillFleet(
        engine=config.engine,
        topology=topology(footprint, replicas_per_host=1, gpus=1),
        router=config.router,
        workload=ConfiguredWorkload(config.workload),
    )
    demand_rps = drills.drilled[0].drill.spec.demand_rps
    return run_drill(fleet, drill_spec(req, demand_rps=demand_rps, seed=case.seed + 1)).holds


SLOW_LARGE = "01-slow-single-turn-least_loaded-1x1x1"
UNEVEN = "06-large-single-turn-least_loaded-3x1"
MULTI_TURN_AFFINITY = "04-large-multi-turn-prefix_affinity-2x2x2"


@pytest.mark.parametrize("name", [SLOW_LARGE, UNEVEN, MULTI_TURN_AFFINITY])
def test_the_recommended_fleet_holds_in_direct_emulation(name: str) -> None:
    _, _, _, drills = drilled(name)
    assert drills.recommended is not None, drills.summary()
    assert drills.recommended.drill.holds
    assert direct_holds(name, drills.recommended.row.hosts), drills.summary()


@pytest.mark.parametrize("name", [SLOW_LARGE, UNEVEN, MULTI_TURN_AFFINITY])
def test_one_host_fewer_fails_in_direct_emulation_as_in_its_drill(name: str) -> None:
    _, _, _, drills = drilled(name)
    assert drills.smaller is not None, drills.summary()
    assert not drills.smaller.drill.holds
    assert not direct_holds(name, drills.smaller.row.hosts), drills.summary()


def test_a_failure_during_a_dependency_outage_is_an_accepted_risk_unless_contracted() -> None:
    case, req, layout, _ = drilled(SLOW_LARGE)
    model = run_case_model(SLOW_LARGE)
    table = size_fleet(req, layout=layout).table
    deps = replace(req.recovery, startup_dependencies=("artifact registry",))
    risky = drill_candidates(
        table,
        requirement=replace(req, recovery=deps),
        model=model,
        demand_rps=table.spec.demand_rate / 60,
        seed=case.seed,
    )
    assert risky is not None
    assert risky.combined is not None
    assert risky.combined.drill.spec.replacement_blocked
    assert not any(d.drill.spec.replacement_blocked for d in risky.drilled)
    assert "accepted risk, not paid for" in risky.summary()
    contracted = drill_candidates(
        table,
        requirement=replace(req, recovery=replace(deps, combined_in_contract=True)),
        model=model,
        demand_rps=table.spec.demand_rate / 60,
        seed=case.seed,
    )
    assert contracted is not None
    assert contracted.combined is None
    assert all(d.drill.spec.replacement_blocked for d in contracted.drilled)
    assert "inside the contract: the failure while artifact registry is out" in (
        contracted.summary()
    )


@cache
def outcome_of(name: str) -> Outcome:
    return run_case(CASES[name])


def run_case_model(name: str) -> ModelKnee:
    model = outcome_of(name).capacity.engine_model
    assert model is not None, f"{name}: no engine model"
    return model


def test_workers_to_spare_drill_ahead_and_the_record_is_the_same() -> None:
    # A mapper other than serial_map has workers to spare: the search drills the size it may
    # ask for next alongside, and shows only what it asked for. A capacity stated too high
    # puts the table's minimum below what holds, so the search grows.
    case = CASES[UNEVEN]
    req = requirement(outcome_of(UNEVEN), stated_capacity_ratio=1.6)
    layout = layout_from_inventory((p.replica, p.host, p.zone) for p in case.config.placements())
    table = size_fleet(req, layout=layout).table
    spread: list[list[int]] = []

    def mapper(fn: Callable[[int], DrilledRow], items: Sequence[int], /) -> list[DrilledRow]:
        spread.append(list(items))
        return [fn(item) for item in items]

    runs = [
        drill_candidates(
            table,
            requirement=req,
            model=run_case_model(UNEVEN),
            demand_rps=table.spec.demand_rate / 60,
            seed=case.seed,
            mapper=chosen,  # type: ignore[arg-type]
        )
        for chosen in (serial_map, mapper)
    ]
    assert runs[0] == runs[1]
    assert runs[0] is not None
    assert runs[0].recommended is not None
    assert len(spread) >= 2  # the first pair, then a step with its next size
    assert all(len(items) == 2 for items in spread)
    asked = [row.row.hosts for row in runs[0].drilled]
    assert sorted({h for items in spread for h in items}) != asked  # one drilled ahead, unshown
