"""`servewatch size`, `recommend` and `drill`: fleet sizing and failure drills."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import polars as pl
import typer
from rich.markdown import Markdown

from servewatch.answers import NoRecommendationError, recommendation_answer
from servewatch.capacity.decision_record import drill_section_json
from servewatch.capacity.drill import DrillSpec
from servewatch.capacity.parallel import process_map
from servewatch.capacity.placement import FailureUnit
from servewatch.capacity.requirement import RequirementError, load_requirement
from servewatch.capacity.worksheet import size as size_worksheet
from servewatch.capacity.worksheet import size_from_file
from servewatch.cli.app import (
    EXIT_BAD_INPUT,
    CliState,
    FromOption,
    JsonOption,
    ToOption,
    app,
    fail,
    instant,
    open_store,
    read_answer,
    write_file,
)
from servewatch.collectors.service_api import RECOMMENDATION_PATH
from servewatch.drill_service import (
    DrillSetupError,
    StepSettings,
    StoreDrills,
    config_drill,
    config_warm_pool,
    store_drill,
)
from servewatch.emulator.clients import RetryPolicy
from servewatch.emulator.fleet_config import FleetConfigError, load_fleet_config
from servewatch.emulator.workload import SpecError as EmulatorSpecError
from servewatch.pipeline.instants import parse_duration
from servewatch.pipeline.tables import RECOMMENDATIONS_SCHEMA
from servewatch.recommend_service import recommend_from_store
from servewatch.render import (
    err_console,
    labelled,
    out_console,
    print_json,
)
from servewatch.store import (
    PartitionError,
    Store,
    roll_up_request_minutes,
    utc_now,
)


@app.command()
def size(
    demand_req_per_min: Annotated[
        float | None, typer.Option(help="Peak demand the fleet must carry, requests/min.")
    ] = None,
    capacity_req_per_min: Annotated[
        float | None, typer.Option(help="One replica's capacity at the SLO, requests/min.")
    ] = None,
    failure_unit: Annotated[
        str, typer.Option(help="What the fleet must survive losing: replica, host or zone.")
    ] = "host",
    replicas_per_host: Annotated[int, typer.Option(help="Replicas placed on each host.")] = 1,
    zones: Annotated[int, typer.Option(help="Zones the hosts are spread over.")] = 1,
    headroom: Annotated[float, typer.Option(help="Headroom on top of demand, e.g. 0.2.")] = 0.0,
    gpus_per_replica: Annotated[int, typer.Option(help="GPUs one replica uses.")] = 1,
    usd_per_gpu_hour: Annotated[float | None, typer.Option(help="Price of a GPU-hour.")] = None,
    hours_per_month: Annotated[float | None, typer.Option(help="Hours billed a month.")] = None,
    recovery_interval_s: Annotated[
        float | None, typer.Option(help="Time after a failure when no replacement counts.")
    ] = None,
    backlog_requests: Annotated[
        float | None, typer.Option(help="Requests queued when the failure hits.")
    ] = None,
    replacement_startup_s: Annotated[
        float | None, typer.Option(help="Cold start of a replacement replica, seconds.")
    ] = None,
    startup_dependency: Annotated[
        list[str] | None,
        typer.Option(help="A service a replacement needs to start (repeatable)."),
    ] = None,
    hosts: Annotated[
        list[int] | None, typer.Option(help="Candidate host counts to tabulate (repeatable).")
    ] = None,
    requirement: Annotated[
        Path | None,
        typer.Option(help="A requirement TOML file instead of the options (docs/capacity.md)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Fleet size from stated assumptions: the sizing chain, failure table, cost and risk.

    Arithmetic only, no data: the same decision record `recommend` writes from measurements.
    Reproduces the seeds' worked examples, e.g. `--demand-req-per-min 120
    --capacity-req-per-min 40 --replicas-per-host 2 --failure-unit host`.
    """
    now = datetime.now(UTC)
    try:
        if requirement is not None:
            record = size_from_file(requirement, now=now)
        else:
            if demand_req_per_min is None or capacity_req_per_min is None:
                raise fail(
                    "give --demand-req-per-min and --capacity-req-per-min, or --requirement FILE",
                    code=EXIT_BAD_INPUT,
                )
            record = size_worksheet(
                now=now,
                demand_req_per_min=demand_req_per_min,
                capacity_req_per_min=capacity_req_per_min,
                failure_unit=failure_unit,
                replicas_per_host=replicas_per_host,
                zones=zones,
                headroom_ratio=headroom,
                gpus_per_replica=gpus_per_replica,
                usd_per_gpu_hour=usd_per_gpu_hour,
                hours_per_month=hours_per_month,
                recovery_interval_s=recovery_interval_s,
                backlog_requests=backlog_requests,
                replacement_startup_s=replacement_startup_s,
                startup_dependencies=startup_dependency or (),
                hosts=hosts or (),
            )
    except RequirementError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    if as_json:
        print_json(record.to_json())
    else:
        out_console.print(Markdown(record.to_markdown()))


@app.command()
def recommend(
    ctx: typer.Context,
    requirement: Annotated[
        Path | None,
        typer.Option(
            help="Requirement TOML: SLO (TTFT/TPOT limits and target ratio, or a latency "
            "limit), demand, failure unit, costs. Required unless --last."
        ),
    ] = None,
    from_: FromOption = None,
    to: ToOption = None,
    out: Annotated[
        Path | None, typer.Option(help="Also write the decision record as Markdown here.")
    ] = None,
    last: Annotated[
        bool,
        typer.Option(
            "--last",
            help="Print the last stored recommendation instead of making one (read-only; "
            "answered by `servewatch run` while it holds the store).",
        ),
    ] = False,
    partitions: Annotated[
        Path | None,
        typer.Option(
            "--partitions",
            help="Read the traced requests from these compacted partitions (`servewatch "
            "compact`) instead of the store's requests table; the store holds their minute "
            "rollups (`servewatch rollup --partitions`), which set the window.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The fleet size for the requirement, from what the fleet did: per-replica capacity refit
    from the store per pool (SLO attainment against load, with its bootstrap interval; marked
    extrapolated when the knee lies beyond the load seen), the failure table for where replicas
    actually sit, the cost of the reserve, and the riskiest assumption with a plan to measure
    it."""
    state = ctx.ensure_object(CliState)
    if last:
        _print_last_recommendation(state, as_json=as_json)
        return
    if requirement is None:
        raise fail("--requirement FILE is required (or --last)", code=EXIT_BAD_INPUT)
    try:
        spec = load_requirement(requirement)
    except RequirementError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    from_ts, to_ts = instant(from_, "--from"), instant(to, "--to")
    with open_store(state) as store:
        roll_up_request_minutes(store)
        try:
            with process_map() as mapper:
                record, measured = recommend_from_store(
                    store,
                    requirement=spec,
                    from_ts=from_ts,
                    to_ts=to_ts,
                    mapper=mapper,
                    partitions=partitions,
                )
        except (RequirementError, PartitionError) as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
        document = record.to_json()
        store.write_recommendation(
            pl.DataFrame(
                [(utc_now(), spec.name, record.verdict(), json.dumps(document))],
                schema=RECOMMENDATIONS_SCHEMA,
                orient="row",
            )
        )
    for note in measured.notes:
        err_console.print(labelled("note:", note))
    markdown = record.to_markdown()
    if out is not None:
        write_file(out, markdown, what="the decision record")
    if as_json:
        print_json(document)
    else:
        out_console.print(Markdown(markdown))


def _print_last_recommendation(state: CliState, *, as_json: bool) -> None:
    def read(store: Store) -> dict[str, Any]:
        try:
            return recommendation_answer(store)
        except NoRecommendationError as exc:
            raise fail(str(exc)) from exc

    document = read_answer(state, read, path=RECOMMENDATION_PATH)
    if as_json:
        print_json(document)
        return
    out_console.print(
        f"{document.get('name')} ({document.get('created_at')}): {document.get('verdict')}",
        highlight=False,
    )


@app.command()
def drill(
    ctx: typer.Context,
    requirement: Annotated[
        Path | None,
        typer.Option(
            help="Requirement TOML: drill what `recommend` sizes from the store, with the "
            "engine fitted from its traced requests."
        ),
    ] = None,
    fleet: Annotated[
        Path | None,
        typer.Option(
            help="Fleet TOML (docs/fleet.example.toml) instead: drill that emulated fleet "
            "(needs --req-per-min or uses its workload's rate)."
        ),
    ] = None,
    hosts: Annotated[
        int | None,
        typer.Option(help="With --requirement: also drill this many hosts.", min=1),
    ] = None,
    req_per_min: Annotated[
        float | None, typer.Option(help="With --fleet: the demand, requests per minute.")
    ] = None,
    failure: Annotated[
        FailureUnit, typer.Option(help="With --fleet: the unit lost (the worst one).")
    ] = FailureUnit.HOST,
    recovery_s: Annotated[
        float, typer.Option(help="With --fleet: seconds with no replacement counted.")
    ] = 180.0,
    startup_s: Annotated[
        float | None,
        typer.Option(help="With --fleet: replacement start-up, s (default: the cold start)."),
    ] = None,
    retries: Annotated[
        int, typer.Option(help="With --fleet: client retries per request.", min=0)
    ] = 0,
    backoff_s: Annotated[float, typer.Option(help="With --fleet: first retry backoff, s.")] = 1.0,
    admission_req_per_min: Annotated[
        float | None,
        typer.Option(help="With --fleet: the gateway sheds above this rate (retry-after 1 s)."),
    ] = None,
    backlog: Annotated[
        int, typer.Option(help="With --fleet: requests queued at the failure.", min=0)
    ] = 0,
    startup_blocked: Annotated[
        bool,
        typer.Option(help="With --fleet: a startup dependency is out, no replacement starts."),
    ] = False,
    traffic_step: Annotated[
        str | None,
        typer.Option(
            help="With --fleet: also drill a traffic step, demand times this (2x), and size "
            "the warm pool that keeps the SLO until autoscaled replicas serve."
        ),
    ] = None,
    over: Annotated[str, typer.Option(help="With --traffic-step: the ramp's length.")] = "5m",
    autoscaler_lag_s: Annotated[
        float, typer.Option(help="With --traffic-step: until the autoscaler starts replicas.")
    ] = 60.0,
    replica_req_per_min: Annotated[
        float | None,
        typer.Option(
            help="With --traffic-step: what the autoscaler counts a replica for (default: "
            "the fleet's capacity at its SLO, searched)."
        ),
    ] = None,
    steady_s: Annotated[
        float, typer.Option(help="With --fleet: seconds of steady state before the failure.")
    ] = 300.0,
    after_s: Annotated[
        float, typer.Option(help="With --fleet: seconds judged once replacements serve.")
    ] = 300.0,
    seed: Annotated[int, typer.Option(help="Seed of the simulation.")] = 1,
    from_: FromOption = None,
    to: ToOption = None,
    as_json: JsonOption = False,
) -> None:
    """Drill a fleet through its named failure in simulation: steady state, the worst replica,
    host or zone lost with no replacement for the recovery interval, replacements cold-starting,
    recovered; clients retrying, the gateway shedding. Per phase: SLO attainment, p95 TTFT and
    TPOT, ready replicas, routing skew, retries, queue depth and age, useful completions
    against demand; the verdict says whether the fleet holds and where it first fails."""
    state = ctx.ensure_object(CliState)
    if (requirement is None) == (fleet is None):
        raise fail("give one of --requirement (with the store) or --fleet", code=EXIT_BAD_INPUT)
    if fleet is not None:
        try:
            config = load_fleet_config(fleet)
        except (FleetConfigError, OSError) as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
        demand_rps = config.workload.arrival.rate_rps if req_per_min is None else req_per_min / 60
        try:
            spec = DrillSpec(
                demand_rps=demand_rps,
                failure_unit=failure,
                ttft_limit_s=config.slo.ttft_s,
                tpot_limit_s=config.slo.tpot_s,
                target_ratio=config.slo.target_ratio,
                recovery_interval_s=recovery_s,
                replacement_startup_s=config.engine.cold_start_s
                if startup_s is None
                else startup_s,
                steady_s=steady_s,
                after_s=after_s,
                retries=RetryPolicy(max_retries=retries, backoff_s=backoff_s),
                admission_rps=None if admission_req_per_min is None else admission_req_per_min / 60,
                replacement_blocked=startup_blocked,
                backlog_requests=backlog,
                seed=seed,
            )
        except (ValueError, EmulatorSpecError) as exc:
            raise fail(f"drill: {exc}", code=EXIT_BAD_INPUT) from exc
        step = (
            None
            if traffic_step is None
            else _step_settings(traffic_step, over, autoscaler_lag_s, replica_req_per_min)
        )
        with err_console.status(f"drilling {config.topology.hosts} hosts, {failure.value} lost"):
            result = config_drill(config, spec)
            pool = None if step is None else config_warm_pool(config, spec, step)
        if as_json:
            print_json(
                {
                    "drill": result.to_json(),
                    "traffic_step": None if pool is None else pool.to_json(),
                }
            )
        else:
            lines = result.markdown_lines("Drill")
            if pool is not None:
                lines += ["", f"Traffic step: {pool.summary()}."]
            out_console.print(Markdown("\n".join(lines)))
        return
    assert requirement is not None
    try:
        spec_requirement = load_requirement(requirement)
    except RequirementError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    from_ts, to_ts = instant(from_, "--from"), instant(to, "--to")
    with (
        open_store(state, read_only=True) as store,
        err_console.status("fitting the engine and drilling"),
    ):
        try:
            found = store_drill(
                store, requirement=spec_requirement, hosts=hosts, from_ts=from_ts, to_ts=to_ts
            )
        except (RequirementError, DrillSetupError) as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    for note in found.notes:
        err_console.print(labelled("note:", note))
    _print_store_drills(found, as_json=as_json)


def _step_settings(
    ratio_text: str, over: str, lag_s: float, replica_req_per_min: float | None
) -> StepSettings:
    try:
        ratio = float(ratio_text.strip().removesuffix("x"))
    except ValueError as exc:
        raise fail(
            f"--traffic-step {ratio_text!r}: give the demand's multiple, such as 2x",
            code=EXIT_BAD_INPUT,
        ) from exc
    if not ratio >= 1.0 or not lag_s >= 0:
        raise fail(
            f"--traffic-step must be at least 1x (got {ratio_text!r}) and --autoscaler-lag-s "
            f">= 0 (got {lag_s:g})",
            code=EXIT_BAD_INPUT,
        )
    try:
        over_s = parse_duration(over).total_seconds()
    except ValueError as exc:
        raise fail(f"--over: {exc}", code=EXIT_BAD_INPUT) from exc
    return StepSettings(
        ratio=ratio,
        over_s=over_s,
        lag_s=lag_s,
        replica_rps=None if replica_req_per_min is None else replica_req_per_min / 60,
    )


def _print_store_drills(found: StoreDrills, *, as_json: bool) -> None:
    drills = found.drills
    if as_json:
        print_json(
            {
                "verdict": found.verdict,
                "drills": drill_section_json(drills),
                "stated": None if found.stated is None else found.stated.drill.to_json(),
            }
        )
        return
    lines = [found.verdict]
    if drills is not None:
        lines += drills.markdown_lines()
    if found.stated is not None:
        lines += ["", *found.stated.drill.markdown_lines(f"{found.stated.row.hosts} hosts")]
    out_console.print(Markdown("\n".join(lines)))
