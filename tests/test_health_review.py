"""Fleet health end to end: fixtures recorded for this (a clean fleet, a regressing version on
part of it, a lost host), replayed into stores, and the findings the `health` command, the
report and the ticket alerts make of them.

Every fixture is the shared base fleet of the detector tests (tests/health_fleet.py) recorded
for the same 30 minutes, so the clean one is the faulty ones minus the injected failure.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import httpx
import polars as pl
import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.fixture.replay import replay_fixture
from servewatch.dashboards.export import chart_specs, report_html
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet_config import DEFAULT_MODEL, TopologySpec
from servewatch.health.dependency_review import DependencyReview
from servewatch.health.finding import Finding, FindingKind, ScopeUnit
from servewatch.health.rollout_comparison import RolloutComparison
from servewatch.health_service import (
    evaluate_findings,
    health_findings,
    health_inputs,
)
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.report_service import store_report
from servewatch.service import Service
from servewatch.slo.alert_state import changes_from_frame
from servewatch.slo.alertmanager import AlertmanagerNotifier
from servewatch.store import Store
from tests.health_fleet import BASE_TOPOLOGY, START, fleet_config, record

pytestmark = pytest.mark.slow

MINUTES = 30
END = START + timedelta(minutes=MINUTES)
ROLLOUT_AT_S = 600.0
ROLLED = ("vllm-1", "vllm-4")  # one replica on host-0, one on host-2: never a whole host
LOST_HOST = "host-1"
HOST_LOST_AT_S = 900.0
HOST_LOST_FOR_S = 480.0
V2 = f"{DEFAULT_MODEL}@v2"


def _recorded_store(
    folder: Path, failures: tuple[FailureSpec, ...], topology: TopologySpec = BASE_TOPOLOGY
) -> Path:
    record(fleet_config(failures=failures, topology=topology), folder / "fixture", minutes=MINUTES)
    db = folder / "store.duckdb"
    with Store.open(db) as store:
        replay_fixture(folder / "fixture", store=store)
    return db


@pytest.fixture(scope="session")
def clean_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _recorded_store(tmp_path_factory.mktemp("health-clean"), ())


@pytest.fixture(scope="session")
def rollout_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    failures = tuple(
        FailureSpec(FailureKind.ROLLOUT, at_s=ROLLOUT_AT_S, target=replica, factor=2.0)
        for replica in ROLLED
    )
    return _recorded_store(tmp_path_factory.mktemp("health-rollout"), failures)


@pytest.fixture(scope="session")
def host_loss_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    failures = (
        FailureSpec(
            FailureKind.HOST_LOSS,
            at_s=HOST_LOST_AT_S,
            target=LOST_HOST,
            duration_s=HOST_LOST_FOR_S,
        ),
    )
    return _recorded_store(tmp_path_factory.mktemp("health-host-loss"), failures)


LOST_ZONE = "zone-a"
TWO_HOST_ZONE = TopologySpec(zones=(LOST_ZONE, "zone-b"), hosts_per_zone=(2, 1))


@pytest.fixture(scope="session")
def zone_loss_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    failure = FailureSpec(
        FailureKind.ZONE_LOSS, at_s=HOST_LOST_AT_S, target=LOST_ZONE, duration_s=HOST_LOST_FOR_S
    )
    folder = tmp_path_factory.mktemp("health-zone-loss")
    return _recorded_store(folder, (failure,), TWO_HOST_ZONE)


def _findings(db: Path, **options: object) -> tuple[Finding, ...]:
    with Store.open(db) as store:
        window = store.read_window(
            from_ts=options.pop("from_ts", None),  # type: ignore[arg-type]
            to_ts=options.pop("to_ts", None),  # type: ignore[arg-type]
        )
        return health_findings(window, **options)  # type: ignore[arg-type]


def _of(findings: tuple[Finding, ...], kind: FindingKind) -> list[Finding]:
    return [f for f in findings if f.kind is kind]


def test_a_clean_fleet_of_the_same_size_yields_no_findings(clean_db: Path) -> None:
    findings = _findings(clean_db)
    assert findings == (), [f.summary for f in findings]


def test_a_regressing_version_on_part_of_the_fleet_is_attributed_to_it(rollout_db: Path) -> None:
    findings = _findings(rollout_db)
    rollouts = _of(findings, FindingKind.ROLLOUT_REGRESSION)
    assert [(f.scope_unit, f.scope) for f in rollouts] == [(ScopeUnit.VERSION, V2)]
    (finding,) = rollouts
    rolled_at = START + timedelta(seconds=ROLLOUT_AT_S)
    # It starts once the new processes serve (after their cold start) and is still going.
    assert rolled_at <= finding.start <= rolled_at + timedelta(minutes=3)
    assert finding.end is None
    assert finding.confidence >= 0.95
    evidence = {e.name: e for e in finding.evidence}
    tpot = evidence["tpot_s"]
    assert tpot.baseline is not None
    assert tpot.value > 1.5 * tpot.baseline  # step time x2 in the new version
    assert evidence["tpot_s_diff_ci_low"].value > 0
    assert evidence["replicas"].value == len(ROLLED)
    # Not a host failure: each rolled replica shared its host with one that kept serving.
    assert not [f for f in findings if f.scope_unit is ScopeUnit.HOST]


def test_without_traces_the_histograms_find_the_same_version(rollout_db: Path) -> None:
    with Store.open(rollout_db) as store:
        inputs = health_inputs(store.read_window(from_ts=START, to_ts=END), start=START, end=END)
    untraced = replace(inputs, requests=inputs.requests.clear())
    (finding,) = RolloutComparison().detect(untraced)
    assert (finding.scope_unit, finding.scope) == (ScopeUnit.VERSION, V2)
    assert {e.name: e.value for e in finding.evidence}["tpot_s_diff_ci_low"] > 0


def test_a_lost_host_is_one_host_finding_not_many_replica_faults(host_loss_db: Path) -> None:
    findings = _findings(host_loss_db)
    losses = _of(findings, FindingKind.HOST_LOSS)
    assert [(f.scope_unit, f.scope) for f in losses] == [(ScopeUnit.HOST, LOST_HOST)]
    (finding,) = losses
    lost_at = START + timedelta(seconds=HOST_LOST_AT_S)
    back_at = lost_at + timedelta(seconds=HOST_LOST_FOR_S)
    assert lost_at <= finding.start <= lost_at + timedelta(minutes=1)
    assert finding.end is not None
    assert back_at <= finding.end <= back_at + timedelta(minutes=2)
    assert "vllm-2" in finding.summary
    assert "vllm-3" in finding.summary
    assert {e.name: e.value for e in finding.evidence}["targets"] == 3  # 2 replicas + DCGM


def test_a_lost_zone_is_one_zone_finding_not_one_per_host(zone_loss_db: Path) -> None:
    findings = _findings(zone_loss_db)
    assert _of(findings, FindingKind.HOST_LOSS) == []
    losses = _of(findings, FindingKind.ZONE_LOSS)
    assert [(f.scope_unit, f.scope) for f in losses] == [(ScopeUnit.ZONE, LOST_ZONE)]
    (zone,) = losses
    lost_at = START + timedelta(seconds=HOST_LOST_AT_S)
    assert abs(zone.start - lost_at) <= timedelta(minutes=1)
    assert zone.end is not None
    assert abs(zone.end - (lost_at + timedelta(seconds=HOST_LOST_FOR_S))) <= timedelta(minutes=1)
    evidence = {e.name: e.value for e in zone.evidence}
    assert (evidence["hosts"], evidence["replicas"]) == (2, 4)
    assert "vllm-0, vllm-1, vllm-2, vllm-3" in zone.summary


def test_replicas_without_zone_and_a_single_zone_pool_are_flagged(clean_db: Path) -> None:
    with Store.open(clean_db) as store:
        inputs = health_inputs(store.read_window(from_ts=START, to_ts=END), start=START, end=END)
    unzoned = ("vllm-0", "vllm-1")
    targets = inputs.targets.with_columns(
        zone=pl.when(pl.col("replica").is_in(unzoned)).then(None).otherwise(pl.col("zone"))
    )
    findings = DependencyReview().detect(replace(inputs, targets=targets))
    assert sorted((f.scope_unit, f.scope) for f in findings) == [
        (ScopeUnit.REPLICA, "vllm-0"),
        (ScopeUnit.REPLICA, "vllm-1"),
    ]
    assert all("no zone" in f.summary and f.end is None for f in findings)

    one_zone = inputs.targets.with_columns(zone=pl.lit("zone-a"))
    (zone,) = DependencyReview().detect(replace(inputs, targets=one_zone))
    assert (zone.scope_unit, zone.scope) == (ScopeUnit.ZONE, "zone-a")
    assert {e.name: e.value for e in zone.evidence}["replicas"] == 6
    out_of_scope = replace(inputs, targets=one_zone, zone_loss_in_scope=False)
    assert DependencyReview().detect(out_of_scope) == []


def test_health_json_lists_each_finding_with_its_evidence(
    host_loss_db: Path, runner: CliRunner
) -> None:
    result = runner.invoke(app, ["--db", str(host_loss_db), "health", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["from"] == START.isoformat() + "Z"
    (host,) = [f for f in document["findings"] if f["scope_unit"] == "host"]
    assert set(host) == {
        "kind",
        "scope_unit",
        "scope",
        "start",
        "end",
        "confidence",
        "summary",
        "evidence",
        "suggestion",
        "consequences",
    }
    assert (host["kind"], host["scope"]) == ("host_loss", LOST_HOST)
    assert host["end"] is not None
    assert {"name": "targets", "value": 3.0, "unit": "count", "baseline": None} in host["evidence"]
    # A window that ends during the loss reports it as ongoing.
    during = (START + timedelta(seconds=HOST_LOST_AT_S + 240)).isoformat() + "Z"
    result = runner.invoke(app, ["--db", str(host_loss_db), "health", "--to", during, "--json"])
    assert result.exit_code == 0, result.output
    (host,) = [f for f in json.loads(result.stdout)["findings"] if f["scope_unit"] == "host"]
    assert host["end"] is None

    table = runner.invoke(app, ["--db", str(host_loss_db), "health"])
    assert table.exit_code == 0, table.output
    assert LOST_HOST in table.stdout


def test_health_refuses_a_window_that_ends_before_it_starts(
    clean_db: Path, runner: CliRunner
) -> None:
    result = runner.invoke(
        app,
        ["--db", str(clean_db), "health", "--from", "2026-11-20T00:00Z", "--to", "2026-11-19"],
    )
    assert result.exit_code == 2


def test_the_report_carries_the_findings(rollout_db: Path) -> None:
    with Store.open(rollout_db) as store:
        report = store_report(store, limits=GoodputLimits())
    facts = dict(report.facts)
    assert "rollout_regression" in facts["health findings"]
    slugs = [c.slug for c in report.charts]
    # The detail charts open with the findings, right after the answers (which replica).
    first = slugs.index("health-findings")
    assert slugs[first : first + 2] == ["health-findings", "health-findings-timeline"]
    assert set(slugs[:first]) <= {"replicas", "slo-verdicts", "capacity-answer"}, slugs
    specs = chart_specs(report)
    html = report_html(report, specs)
    assert V2 in html
    assert "tpot_s" in json.dumps(specs["health-findings"])


def test_the_report_says_when_nothing_was_found(clean_db: Path) -> None:
    with Store.open(clean_db) as store:
        report = store_report(store, limits=GoodputLimits())
    assert dict(report.facts)["health findings"].startswith("none")
    assert "Health findings" in dict(report.omitted)


class Recorder:
    def __init__(self) -> None:
        self.bodies: list[list[dict[str, object]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        return httpx.Response(200)


def test_a_finding_raises_a_ticket_alert_and_resolves_it(
    host_loss_db: Path, tmp_path: Path
) -> None:
    db = tmp_path / "alerts.duckdb"
    shutil.copyfile(host_loss_db, db)
    recorder = Recorder()
    client = httpx.Client(transport=httpx.MockTransport(recorder))
    notifier = AlertmanagerNotifier(client, url="http://am:9093")
    during = START + timedelta(seconds=HOST_LOST_AT_S + 300)
    after = START + timedelta(seconds=HOST_LOST_AT_S + HOST_LOST_FOR_S + 1800)
    with Store.open(db) as store:
        fired = evaluate_findings(store, at=during, notifier=notifier)
        again = evaluate_findings(store, at=during + timedelta(minutes=1), notifier=notifier)
        resolved = evaluate_findings(store, at=after, notifier=notifier)
        history = changes_from_frame(store.read_alert_changes().collect())
    name = f"health:host_loss:host:{LOST_HOST}"
    assert [(c.key.slo, c.state.value) for c in fired.changes] == [(name, "firing")]
    assert fired.changes[0].key.severity.value == "ticket"
    assert again.changes == ()  # still firing: no new change, only the re-send
    assert [(c.key.slo, c.state.value) for c in resolved.changes] == [(name, "resolved")]
    assert [c.state.value for c in history] == ["firing", "resolved"]
    (first,) = recorder.bodies[0]
    assert first["labels"] == {
        "alertname": "FleetHealthFinding",
        "slo": name,
        "severity": "ticket",
        "window": "1h",
        "short_window": "1m",
        "kind": "host_loss",
        "scope_unit": "host",
        "scope": LOST_HOST,
    }
    annotations = first["annotations"]
    assert isinstance(annotations, dict)
    assert "host_loss on host host-1" in annotations["summary"]
    assert len(recorder.bodies) == 3  # fired, re-sent while firing, resolved


def test_the_service_evaluation_job_raises_finding_tickets(
    host_loss_db: Path, tmp_path: Path
) -> None:
    db = tmp_path / "service.duckdb"
    shutil.copyfile(host_loss_db, db)
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f'[store]\npath = "{db}"\n[otlp]\nlisten = "127.0.0.1:0"\ngrpc_listen = "127.0.0.1:0"\n',
        encoding="utf-8",
    )
    service = Service(config)
    try:
        # No SLO files: the job still evaluates findings.
        service.evaluate_once(now=START + timedelta(seconds=HOST_LOST_AT_S + 300))
        service.writer.flush()
        assert service.writer.counters.failed_tasks == 0
        changes = changes_from_frame(service.store.read_alert_changes().collect())
    finally:
        service.stop()
    assert [(c.key.slo, c.state.value) for c in changes] == [
        (f"health:host_loss:host:{LOST_HOST}", "firing")
    ]
