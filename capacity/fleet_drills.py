"""Fleet drills: the failure table's answer proved in simulation before it is recommended.

The failure table's minimum is arithmetic on one number, the capacity per replica. A drill
(drill.py) runs the candidate fleet itself, with the fitted engine, at the demand, through the
named failure. Starting from the table's minimum, a candidate that fails is grown host by host
until one holds (up to `MAX_EXTRA_HOSTS` more); one that holds is shrunk while the next smaller
still holds. The answer is the smallest fleet whose drill holds, and the drill of one host
fewer, which fails, is kept beside it as the evidence that it is the minimum.

With a traffic step in the requirement, the recommended fleet is also drilled through it
(traffic_step.py): the warm pool that holds the SLO until the autoscaler's replicas serve.

The drilled fleet is the candidate's hosts per zone with the requirement's replicas per host
(a layout with uneven hosts is drilled as even ones of that size).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from servewatch.capacity.drill import DrillFleet, DrillResult, DrillSpec, run_drill
from servewatch.capacity.failure_table import FailureRow, FailureTable, failure_row
from servewatch.capacity.knee_search import ModelKnee, engine_params
from servewatch.capacity.parallel import Mapper, serial_map
from servewatch.capacity.placement import FailureUnit, Footprint
from servewatch.capacity.requirement import Requirement
from servewatch.capacity.traffic_step import TrafficStepSpec, WarmPool, warm_pool
from servewatch.emulator.clients import RetryPolicy
from servewatch.emulator.engine_params import EngineParams
from servewatch.emulator.fleet_config import RouterSpec, TopologySpec

MAX_EXTRA_HOSTS = 4
# Judged before the failure and once replacements serve: three minutes each show a steady
# state (a busy fleet's thousands of requests a minute, a small one's hundreds) at a third of
# the cost of five, and a recommendation drills several fleets.
DRILL_STEADY_S = 180.0
DRILL_AFTER_S = 180.0
# When the requirement states no replacement start-up time: the emulator's cold start.
DEFAULT_STARTUP_S = EngineParams().cold_start_s


@dataclass(frozen=True)
class DrilledRow:
    row: FailureRow
    drill: DrillResult


@dataclass(frozen=True)
class FleetDrills:
    """Every candidate drilled, in host order, and what they prove."""

    drilled: tuple[DrilledRow, ...]
    recommended: DrilledRow | None  # the smallest that holds
    smaller: DrilledRow | None  # one host fewer than the recommended, which fails
    reason: str | None  # why nothing is recommended, when nothing holds
    startup_stated: bool
    warm_pool: WarmPool | None = None  # the requirement's traffic step on the recommended fleet
    # The named failure during the startup dependencies' outage, on the recommended fleet, when
    # the contract leaves it out (an accepted risk; inside the contract every drill is it).
    combined: DrilledRow | None = None
    dependencies: tuple[str, ...] = ()
    combined_in_contract: bool = False

    def contract_text(self) -> str | None:
        """Which combined failures are inside the contract and which are accepted risks."""
        if not self.dependencies:
            return None
        deps = ", ".join(self.dependencies)
        if self.combined_in_contract:
            return (
                f"inside the contract: the failure while {deps} is out (no replacement starts); "
                "every drill above is that combination"
            )
        verdict = "" if self.combined is None else f": {self.combined.drill.verdict()}"
        return (
            f"inside the contract: the failure alone; accepted risk, not paid for: the failure "
            f"while {deps} is out (no replacement starts){verdict}"
        )

    def markdown_lines(self) -> list[str]:
        """The recommended fleet's drill and one host fewer's, each a verdict and its phases."""
        lines: list[str] = []
        for title, drilled in (("Recommended", self.recommended), ("One host fewer", self.smaller)):
            if drilled is not None:
                lines += ["", *drilled.drill.markdown_lines(title)]
        return lines

    def for_hosts(self, hosts: int) -> DrilledRow | None:
        return next((d for d in self.drilled if d.row.hosts == hosts), None)

    def summary(self) -> str:
        if self.recommended is None:
            return f"no candidate holds its drill: {self.reason}"
        text = f"drilled: {self.recommended.drill.verdict()}"
        if self.smaller is not None:
            text += f"; one host fewer: {self.smaller.drill.verdict()}"
        if self.warm_pool is not None:
            text += f"; traffic step: {self.warm_pool.summary()}"
        contract = self.contract_text()
        if contract is not None:
            text += f"; {contract}"
        return text


def topology(footprint: Footprint, *, replicas_per_host: int, gpus: int) -> TopologySpec:
    zones = [(zone, hosts) for zone, hosts in footprint.hosts_by_zone if hosts > 0]
    return TopologySpec(
        zones=tuple(zone for zone, _ in zones),
        hosts_per_zone=tuple(hosts for _, hosts in zones),
        replicas_per_host=replicas_per_host,
        gpus_per_replica=gpus,
    )


def drill_spec(
    requirement: Requirement, *, demand_rps: float, seed: int, combined: bool | None = None
) -> DrillSpec:
    """The drill a requirement asks for at `demand_rps` (headroom included). `combined`: the
    failure during a startup dependency's outage (default: when the contract includes it)."""
    recovery = requirement.recovery
    slo = requirement.slo
    startup = recovery.replacement_startup_s
    return DrillSpec(
        demand_rps=demand_rps,
        failure_unit=requirement.failure_unit,
        ttft_limit_s=slo.ttft_limit_s,
        tpot_limit_s=slo.tpot_limit_s,
        target_ratio=slo.target_ratio,
        recovery_interval_s=recovery.interval_s.value,
        replacement_startup_s=DEFAULT_STARTUP_S if startup is None else startup.value,
        retries=RetryPolicy(
            max_retries=requirement.clients.max_retries,
            backoff_s=requirement.clients.backoff_s,
        ),
        replacement_blocked=bool(recovery.startup_dependencies)
        and (recovery.combined_in_contract if combined is None else combined),
        backlog_requests=round(recovery.backlog_requests.value),
        steady_s=DRILL_STEADY_S,
        after_s=DRILL_AFTER_S,
        seed=seed,
    )


def model_fleet(table: FailureTable, *, hosts: int, model: ModelKnee) -> DrillFleet:
    """The table's candidate of `hosts` hosts (grown or shrunk from today's layout) running
    the fitted engine `model` on the pool's request shapes and router."""
    return DrillFleet(
        engine=engine_params(model.step, limits=model.limits, mix=model.mix),
        topology=topology(
            _footprint(table, hosts),
            replicas_per_host=table.spec.replicas_per_host,
            gpus=table.spec.gpus_per_replica,
        ),
        router=RouterSpec(policy=model.router),
        workload=model.mix,
        ttft_offset_s=model.check.ttft_offset_s,
    )


def _footprint(table: FailureTable, hosts: int) -> Footprint:
    return table.spec.initial.resized(
        hosts=hosts, zones=table.spec.zones, replicas_per_host=table.spec.replicas_per_host
    )


def drill_row(table: FailureTable, *, hosts: int, model: ModelKnee, spec: DrillSpec) -> DrilledRow:
    """The table's candidate of `hosts` hosts drilled with the fitted engine `model`."""
    healthy = table.healthy_minimum.replicas if table.healthy_minimum is not None else 0
    return DrilledRow(
        failure_row(table.spec, _footprint(table, hosts), healthy_replicas=healthy),
        run_drill(model_fleet(table, hosts=hosts, model=model), spec),
    )


def _drill_at(hosts: int, *, table: FailureTable, model: ModelKnee, spec: DrillSpec) -> DrilledRow:
    return drill_row(table, hosts=hosts, model=model, spec=spec)


def drill_candidates(
    table: FailureTable,
    *,
    requirement: Requirement,
    model: ModelKnee,
    demand_rps: float,
    seed: int,
    mapper: Mapper = serial_map,
) -> FleetDrills | None:
    """Drill from the table's minimum up or down to the smallest fleet that holds; None when
    the table has no minimum or the requirement no TTFT or TPOT limit to judge by."""
    if table.minimum is None or not requirement.slo.attainment:
        return None
    spec = drill_spec(requirement, demand_rps=demand_rps, seed=seed)
    drill_at = functools.partial(_drill_at, table=table, model=model, spec=spec)
    hosts = table.minimum.hosts
    # The minimum and one host fewer are drilled in any case (at once, when a mapper spreads).
    first = [h for h in (hosts - 1, hosts) if h >= 1]
    done: dict[int, DrilledRow] = dict(zip(first, mapper(drill_at, first), strict=True))
    asked = set(first)  # what the search asked for: the record shows these, however spread
    spare_workers = mapper is not serial_map
    largest = table.minimum.hosts + MAX_EXTRA_HOSTS

    def drilled(hosts: int, *, ahead: int | None = None) -> DrilledRow:
        asked.add(hosts)
        if hosts not in done:
            # With workers to spare, the size the search may ask for next is drilled alongside.
            wanted = [hosts]
            if spare_workers and ahead is not None and ahead not in done and 1 <= ahead <= largest:
                wanted.append(ahead)
            done.update(zip(wanted, mapper(drill_at, wanted), strict=True))
        return done[hosts]

    while not drilled(hosts, ahead=hosts + 1).drill.holds and hosts < largest:
        hosts += 1
    recommended: DrilledRow | None = drilled(hosts)
    if recommended is not None and recommended.drill.holds:
        while hosts > 1 and drilled(hosts - 1, ahead=hosts - 2).drill.holds:
            hosts -= 1
        recommended = drilled(hosts)
    reason = None
    if recommended is None or not recommended.drill.holds:
        recommended = None
        reason = (
            f"no fleet of {table.minimum.hosts} to {hosts} hosts holds its drill at "
            f"{demand_rps * 60:.4g} req/min"
            + ("" if requirement.failure_unit is FailureUnit.NONE else " through the failure")
        )
    smaller = None
    if recommended is not None and recommended.row.hosts > 1:
        smaller = drilled(recommended.row.hosts - 1)
    pool = None
    step = requirement.traffic_step
    if recommended is not None and step is not None:
        pool = warm_pool(
            model_fleet(table, hosts=recommended.row.hosts, model=model),
            TrafficStepSpec(
                demand_rps=demand_rps,
                ratio=step.ratio,
                over_s=step.over_s,
                lag_s=step.autoscaler_lag_s,
                cold_start_s=spec.replacement_startup_s,
                replica_rps=model.knee_rps,
                ttft_limit_s=spec.ttft_limit_s,
                tpot_limit_s=spec.tpot_limit_s,
                target_ratio=spec.target_ratio,
                seed=seed,
            ),
        )
    recovery = requirement.recovery
    combined = None
    if recommended is not None and recovery.startup_dependencies and not spec.replacement_blocked:
        blocked = drill_spec(requirement, demand_rps=demand_rps, seed=seed, combined=True)
        combined = drill_row(table, hosts=recommended.row.hosts, model=model, spec=blocked)
    return FleetDrills(
        drilled=tuple(done[h] for h in sorted(asked)),
        recommended=recommended,
        smaller=smaller,
        reason=reason,
        startup_stated=recovery.replacement_startup_s is not None,
        warm_pool=pool,
        combined=combined,
        dependencies=recovery.startup_dependencies,
        combined_in_contract=recovery.combined_in_contract,
    )
