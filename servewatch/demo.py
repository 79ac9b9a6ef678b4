"""The demo: an emulated day of a fleet, recorded, replayed and analysed, then a live phase.

1. Record: an emulated 12-replica fleet (3 hosts of 4 replicas; zone-a has two hosts, zone-b
   one) through a day of diurnal traffic with an injected loss of host-1 (zone-a) and a TPOT
   regression on vllm-9 (host-2, zone-b, so it never coincides with the host loss), written as
   a fixture folder (pages every 2 minutes, OTLP spans), with the emulator's ground-truth
   capacity.
2. Replay it into a fresh store, evaluate the SLOs minute by minute (alerts into the store),
   write the offline report and the capacity decision record.
3. Live: the same fleet serves /metrics and sends OTLP on 127.0.0.1 while `servewatch run`'s
   service scrapes and receives, proving the live path.
Everything is emulated and says so; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from servewatch.capacity.parallel import process_map
from servewatch.capacity.requirement import load_requirement
from servewatch.collectors.fixture.replay import replay_fixture
from servewatch.dashboards.export import write_report
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fixture_writer import record_fleet
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig, TopologySpec
from servewatch.emulator.ground_truth import capacity_for_config, fleet_capacity_for_config
from servewatch.emulator.live_server import LiveFleetServer, run_live
from servewatch.emulator.span_output import SpanOutput, otlp_http_span_output
from servewatch.emulator.vllm_metrics import EngineSettings
from servewatch.emulator.workload import ArrivalKind, ArrivalSpec, Distribution
from servewatch.health_service import finding_json, health_findings
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.recommend_service import recommend_from_store
from servewatch.report_service import slo_views, window_report
from servewatch.service import Service
from servewatch.slo.alert_state import changes_to_frame
from servewatch.slo_service import load_specs, replay_from_store, status_at
from servewatch.store import Store
from servewatch.store.rollup_job import roll_up_request_minutes, roll_up_slo_minutes

DAY_START_S = 1_795_046_400.0  # 2026-11-19T00:00:00Z
DEMO_LIMITS = GoodputLimits(ttft_s=0.5, tpot_s=0.05)
SCRAPE_INTERVAL_S = 120.0
LIVE_INTERVAL_S = 2.0
REPLICAS_PER_HOST = 4
LOST_HOST = "host-1"  # zone-a's second host
# On host-2 (zone-b): a replica on the lost host would be down when its regression starts.
REGRESSED_REPLICA = "vllm-9"

DEMO_SLOS = """\
# The demo fleet's SLOs (servewatch spec format, docs/slo.md).
version: servewatch/v1
slos:
  - name: ttft-500ms
    description: First token within 500 ms, from traced requests.
    sli: {kind: latency, metric: ttft, threshold_s: 0.5, source: traces}
    objective_ratio: 0.99
    period: 7d
    min_events: 50
  - name: chat-goodput
    description: TTFT <= 500 ms and TPOT <= 50 ms together (vLLM's goodput criterion).
    sli: {kind: goodput, ttft_s: 0.5, tpot_s: 0.05}
    objective_ratio: 0.99
    period: 7d
    min_events: 50
  - name: availability
    description: Requests vLLM finished without an error, from its own counters.
    sli: {kind: availability, source: metrics}
    objective_ratio: 0.999
    period: 30d
"""


class DemoError(Exception):
    """The demo cannot run as asked (unusable output folder, bad duration)."""


@dataclass(frozen=True)
class DemoResult:
    out: Path
    summary: dict[str, Any]


Progress = Callable[[str], None]


def demo_fleet(*, hours: float, rate_rps: float) -> FleetConfig:
    """The demo fleet: 12 replicas of a large-model profile (slow steps, at most 20 running)
    on 3 hosts of 4 in 2 uneven zones, each replica good for about 0.75 req/s at the SLO, so
    the afternoon peak runs the fleet at about half its capacity and three quarters of it after
    the host loss; the slowed replica pushes TPOT past its limit. One replica in twelve is a
    small share of the fleet's requests (and least-loaded routing sends it fewer), so the
    7-day goodput SLO burns at about 2.5x at most: a 12 h run fires its slowest ticket
    (1008 min at burn 1), a 24 h run's longer day dilutes it below every threshold, as a
    budget that lasts the period should."""
    day_s = hours * 3600
    failures = (
        FailureSpec(FailureKind.HOST_LOSS, at_s=day_s * 0.60, target=LOST_HOST, duration_s=3600),
        FailureSpec(
            FailureKind.SLOW_REPLICA,
            at_s=day_s * 0.80,
            target=REGRESSED_REPLICA,
            duration_s=day_s * 0.10,
            factor=2.0,  # decode steps twice as slow: TPOT past the 50 ms limit
        ),
    )
    config = FleetConfig.default()
    engine = replace(
        config.engine,
        step_base_s=0.025,
        step_per_seq_s=0.0004,
        step_per_prefill_token_s=0.00004,
        max_num_seqs=20,
    )
    return replace(
        config,
        pool="chat",
        engine=engine,
        topology=TopologySpec(
            zones=("zone-a", "zone-b"), hosts_per_zone=(2, 1), replicas_per_host=REPLICAS_PER_HOST
        ),
        workload=replace(
            config.workload,
            arrival=ArrivalSpec(kind=ArrivalKind.DIURNAL, rate_rps=rate_rps, peak_hour_utc=15.0),
            output_tokens=Distribution.lognormal(500.0, 0.9, min_value=1, max_value=4000),
        ),
        failures=failures,
    )


def _requirement(config: FleetConfig, capacity_req_per_min: float) -> str:
    """The demo's requirement (TOML): the fleet's own SLO, router and running-sequence limit
    (which spans cannot show), the stated capacity the emulator's truth for one replica."""
    return f"""\
# The demo's requirement (docs/capacity.md). Try:
#   servewatch --db servewatch.duckdb recommend --requirement requirement.toml
#   servewatch --db servewatch.duckdb drill --requirement requirement.toml
name = "demo-chat"
failure_unit = "host"
headroom_ratio = 0.2

[slo]
ttft_limit_s = {config.slo.ttft_s}
tpot_limit_s = {config.slo.tpot_s}
target_ratio = {config.slo.target_ratio}

[demand]
# The recorded day's peak minute, measured by the recommender, grown by half.
req_per_min = "observed"
growth_ratio = 1.5

[replica]
capacity_req_per_min = {round(capacity_req_per_min, 1)}
max_num_seqs = {config.engine.max_num_seqs}

[placement]
replicas_per_host = {REPLICAS_PER_HOST}
zones = ["zone-a", "zone-b"]
router = "{config.router.policy.value}"

[recovery]
interval_s = 180
replacement_startup_s = 90

[traffic_step]
# Seed 003's "traffic doubles in five minutes": the warm pool that holds until the
# autoscaler's replicas serve (a minute to notice, the start-up above to serve).
ratio = 2.0
over_s = 300
autoscaler_lag_s = 60

[cost]
usd_per_gpu_hour = 2.5
"""


def run_demo(
    *,
    out: Path,
    hours: float = 24.0,
    rate_rps: float = 3.0,
    live_seconds: float = 30.0,
    progress: Progress = lambda _: None,
) -> DemoResult:
    if not 0 < hours <= 24 * 7:
        raise DemoError(f"--hours must be above 0 and at most a week, got {hours}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoError(f"cannot create output folder {out}: {exc}") from exc
    config = demo_fleet(hours=hours, rate_rps=rate_rps)
    fixture = out / "fixture"
    db = out / "servewatch.duckdb"
    for stale in (db, db.with_suffix(".duckdb.wal")):
        stale.unlink(missing_ok=True)

    progress("measuring the emulated replica's ground-truth capacity at the SLO")
    truth = capacity_for_config(config, seed=7, requests=1500)
    fleet_truth = fleet_capacity_for_config(config, seed=7, requests=1500)
    progress(f"recording {hours:g} h of 12 emulated replicas to {fixture}")
    manifest = record_fleet(
        config,
        fixture,
        start_s=DAY_START_S,
        end_s=DAY_START_S + hours * 3600,
        scrape_interval_s=SCRAPE_INTERVAL_S,
        seed=1,
        ground_truth={
            "capacity_rps_per_replica": truth.capacity_rps,
            "fleet_capacity_rps_per_replica": fleet_truth.capacity_rps,
            "router": config.router.policy.value,
            "slo": "TTFT 0.5 s, TPOT 0.05 s, 90%",
        },
        description=(
            f"servewatch demo: loss of {LOST_HOST} and a TPOT regression on {REGRESSED_REPLICA}"
        ),
        generator={"seed": 1, "hours": hours, "rate_rps": rate_rps},
    )
    slo_file = out / "slos.yaml"
    slo_file.write_text(DEMO_SLOS, encoding="utf-8")
    specs, _ = load_specs([slo_file])
    start = datetime.fromtimestamp(DAY_START_S, tz=UTC).replace(tzinfo=None)
    end = start + timedelta(hours=hours)

    with Store.open(db) as store:
        progress("replaying the recording into the store")
        replayed = replay_fixture(fixture, store=store)
        roll_up_request_minutes(store)
        roll_up_slo_minutes(store, criteria=[c for s in specs if (c := s.event_criterion())])
        progress("evaluating SLOs minute by minute")
        changes = replay_from_store(store, specs=specs, start=start, end=end)
        store.write_alert_changes(changes_to_frame(changes))
        statuses = status_at(store, specs=specs, at=end)
        progress("looking for fleet-health findings")
        window = store.read_window()
        findings = health_findings(window, specs=specs)
        progress("sizing the fleet")
        requirement_file = out / "requirement.toml"
        requirement_file.write_text(_requirement(config, truth.capacity_rps * 60), encoding="utf-8")
        requirement = load_requirement(requirement_file)
        with process_map() as mapper:
            record, _ = recommend_from_store(store, requirement=requirement, mapper=mapper)
        progress("writing the report")
        slos = slo_views(store, specs=specs, start=start, end=end)
        report = window_report(
            window, limits=DEMO_LIMITS, findings=findings, record=record, slos=slos
        )
        files = write_report(report, out / "report")
    (out / "decision.md").write_text(record.to_markdown(), encoding="utf-8")
    (out / "decision.json").write_text(json.dumps(record.to_json(), indent=2), encoding="utf-8")

    live = (
        _live_phase(config, out=out, seconds=live_seconds, progress=progress)
        if live_seconds > 0
        else None
    )
    summary = {
        "out": str(out),
        "fixture": str(fixture),
        "store": str(db),
        "report": str(files.html),
        "decision_record": str(out / "decision.md"),
        "requirement": str(out / "requirement.toml"),
        "emulated": True,
        "recorded": {
            "hours": hours,
            "requests": manifest["spans"]["count"],
            "pages": manifest["pages"]["count"],
        },
        "replayed": {
            "new_requests": replayed.traces.new_requests,
            "new_points": replayed.metrics.new_points,
            "failed_scrapes": len(replayed.metrics.failed_scrapes),
        },
        "slo_status": [s.to_json() for s in statuses],
        "alerts_fired": sorted(
            {
                f"{c.key.slo} {c.key.severity.value} {c.key.window}"
                for c in changes
                if c.state.value == "firing"
            }
        ),
        "ground_truth_capacity_rps_per_replica": truth.capacity_rps,
        "ground_truth_fleet_capacity_rps_per_replica": fleet_truth.capacity_rps,
        "health_findings": [finding_json(f) for f in findings],
        "recommendation": record.verdict(),
        "riskiest_assumption": record.to_json()["risk"].get("riskiest"),
        "live": live,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    return DemoResult(out=out, summary=summary)


def _live_phase(
    config: FleetConfig, *, out: Path, seconds: float, progress: Progress
) -> dict[str, Any]:
    """The emulated fleet live on 127.0.0.1 while the `run` service scrapes and receives."""
    progress(f"live phase: emulated replicas on 127.0.0.1, `servewatch run` for {seconds:g} s")
    live_config = replace(
        config,
        failures=(),
        workload=replace(config.workload, arrival=ArrivalSpec(rate_rps=4.0)),
    )
    db = out / "live.duckdb"
    for stale in (db, db.with_suffix(".duckdb.wal")):
        stale.unlink(missing_ok=True)
    started = time.time()
    server = LiveFleetServer(
        live_config.placements(),
        started_s=started,
        engine=EngineSettings.from_engine(live_config.engine),
    )
    server.start()
    stop = threading.Event()
    service: Service | None = None
    spans: SpanOutput | None = None
    try:
        targets = "".join(
            f'[[targets]]\nkind = "{t.kind.value}"\nurl = "{t.url}"\n'
            + "".join(f'{k} = "{v}"\n' for k, v in t.labels.items())
            for t in server.targets
        )
        config_path = out / "live-servewatch.toml"
        config_path.write_text(
            f'[store]\npath = "{db.name}"\n[scrape]\ninterval_s = {LIVE_INTERVAL_S}\n'
            f'timeout_s = 1\n[otlp]\nlisten = "127.0.0.1:0"\ngrpc_listen = "127.0.0.1:0"\n'
            f"{targets}",
            encoding="utf-8",
        )
        # Every listener binds port 0 and is asked for its port afterwards: a port probed
        # free and bound later can be taken in between by anything else on the machine.
        service = Service(config_path)
        spans = otlp_http_span_output(
            live_config.placements(),
            endpoint=service.receiver.endpoint,
            conversation_ids=live_config.conversation_ids,
        )
        server.spans = spans
        simulation = FleetSimulation(live_config, observer=server, seed=3, start_s=started)
        driver = threading.Thread(
            target=run_live,
            args=(simulation, server),
            kwargs={"clock": time.time, "wait": stop.wait},
            daemon=True,
        )
        driver.start()
        service.start(health_port=0)
        stop.wait(seconds)
    finally:
        stop.set()
        server.stop()
        if spans is not None:
            spans.shutdown()  # flushes the last spans while the receiver still listens
        if service is not None:
            service.stop()
    with Store.open(db) as store:
        return {
            "store": str(db),
            "config": str(config_path),
            "targets": len(server.targets),
            "scrapes": store.count("scrapes"),
            "points": store.count("points"),
            "requests_received": store.count("requests"),
        }
