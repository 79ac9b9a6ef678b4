"""The four replica and pool detectors on emulated fleets: each injected failure is found and
attributed to the right replica (or pool), starting near the injection, and the same fleet
without failures yields no findings. Fixtures are recorded once per session."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.workload import RateStep
from servewatch.health.affinity_loss import AffinityLossDetector
from servewatch.health.finding import Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.health.kv_pressure import KvPressureDetector
from servewatch.health.slow_replica import SlowReplicaDetector
from servewatch.health.traffic_step import TrafficStepDetector
from tests.health_fleet import START, fleet_config, recorded_inputs

MINUTES = 40
DETECTORS = (
    SlowReplicaDetector(),
    KvPressureDetector(),
    AffinityLossDetector(),
    TrafficStepDetector(),
)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def clean_fleet(tmp_path_factory: pytest.TempPathFactory) -> HealthInputs:
    folder = tmp_path_factory.mktemp("health") / "clean"
    return recorded_inputs(fleet_config(), folder, minutes=MINUTES)


@pytest.fixture(scope="session")
def faulty_fleet(tmp_path_factory: pytest.TempPathFactory) -> HealthInputs:
    """A KV squeeze on vllm-4 (10-25 min), a slow vllm-1 (15-35 min) and a crash of vllm-2 at
    28 min (back after 30 s and a cold start), on different replicas and times."""
    failures = (
        FailureSpec(
            FailureKind.KV_SQUEEZE, at_s=10 * 60, target="vllm-4", duration_s=15 * 60, factor=100
        ),
        FailureSpec(
            FailureKind.SLOW_REPLICA, at_s=15 * 60, target="vllm-1", duration_s=20 * 60, factor=3
        ),
        FailureSpec(FailureKind.REPLICA_CRASH, at_s=28 * 60, target="vllm-2", duration_s=30.0),
    )
    folder = tmp_path_factory.mktemp("health") / "faults"
    return recorded_inputs(fleet_config(failures=failures), folder, minutes=MINUTES)


@pytest.fixture(scope="session")
def stepped_fleet(tmp_path_factory: pytest.TempPathFactory) -> HealthInputs:
    """Arrivals step to four times the base rate at 15 min and back at 21 min."""
    steps = (RateStep(at_s=15 * 60, rate_rps=16.0), RateStep(at_s=21 * 60, rate_rps=4.0))
    folder = tmp_path_factory.mktemp("health") / "step"
    return recorded_inputs(fleet_config(steps=steps), folder, minutes=MINUTES)


def _findings(inputs: HealthInputs) -> list[Finding]:
    return [finding for detector in DETECTORS for finding in detector.detect(inputs)]


def _only(findings: list[Finding], kind: FindingKind) -> Finding:
    chosen = [finding for finding in findings if finding.kind is kind]
    assert len(chosen) == 1, chosen
    return chosen[0]


def test_clean_fleet_yields_no_findings(clean_fleet: HealthInputs) -> None:
    assert _findings(clean_fleet) == []


def test_each_replica_fault_is_found_on_its_replica(faulty_fleet: HealthInputs) -> None:
    findings = _findings(faulty_fleet)
    assert sorted(f.kind.value for f in findings) == [
        "affinity_loss",
        "kv_pressure",
        "slow_replica",
    ]
    slow = _only(findings, FindingKind.SLOW_REPLICA)
    assert (slow.scope_unit, slow.scope) == (ScopeUnit.REPLICA, "vllm-1")
    assert abs(slow.start - (START + timedelta(minutes=15))) <= timedelta(minutes=3)
    assert slow.end is not None
    assert abs(slow.end - (START + timedelta(minutes=35))) <= timedelta(minutes=2)
    assert slow.confidence > 0.9
    ratio = next(e for e in slow.evidence if e.name == "slowdown_ratio")
    assert 2.7 <= ratio.value <= 3.3, slow.summary
    assert "eject vllm-1" in slow.suggestion

    kv = _only(findings, FindingKind.KV_PRESSURE)
    assert (kv.scope_unit, kv.scope) == (ScopeUnit.REPLICA, "vllm-4")
    assert abs(kv.start - (START + timedelta(minutes=10))) <= timedelta(minutes=2)
    assert kv.end is not None
    assert abs(kv.end - (START + timedelta(minutes=25))) <= timedelta(minutes=2)
    evidence = {e.name: e for e in kv.evidence}
    assert evidence["preemptions"].value >= 10
    assert evidence["episodes"].value >= 1
    assert evidence["longest_episode_s"].value >= 5 * 60

    lost = _only(findings, FindingKind.AFFINITY_LOSS)
    assert (lost.scope_unit, lost.scope) == (ScopeUnit.REPLICA, "vllm-2")
    # Down at 28 min, serving again after 30 s and a 90 s cold start.
    assert START + timedelta(minutes=28) <= lost.start <= START + timedelta(minutes=31)
    evidence = {e.name: e for e in lost.evidence}
    assert evidence["hit_ratio_drop"].value >= 0.15
    assert evidence["extra_prefill_tokens_per_s"].value > 0
    assert lost.confidence > 0.9


def test_traffic_step_is_found_for_the_pool(stepped_fleet: HealthInputs) -> None:
    findings = _findings(stepped_fleet)
    assert [f.kind for f in findings] == [FindingKind.TRAFFIC_STEP]
    step = findings[0]
    assert (step.scope_unit, step.scope) == (ScopeUnit.POOL, "default")
    assert abs(step.start - (START + timedelta(minutes=15))) <= timedelta(minutes=2)
    assert step.end is not None  # cleared once the rate fell back
    assert step.end <= START + timedelta(minutes=26)
    evidence = {e.name: e for e in step.evidence}
    assert evidence["arrivals_per_s"].value >= 2 * (evidence["arrivals_per_s"].baseline or 0)
    assert evidence["waiting_requests"].value >= 12
    assert step.confidence > 0.5


def test_a_window_cut_inside_an_episode_leaves_it_ongoing(faulty_fleet: HealthInputs) -> None:
    cut = START + timedelta(minutes=20)
    inputs = HealthInputs(
        start=faulty_fleet.start,
        end=cut,
        points=faulty_fleet.points.filter(pl.col("ts") < cut),
        dimensions=faulty_fleet.dimensions,
        requests=faulty_fleet.requests,
        targets=faulty_fleet.targets,
        scrapes=faulty_fleet.scrapes,
    )
    kv = _only(KvPressureDetector().detect(inputs), FindingKind.KV_PRESSURE)
    assert kv.scope == "vllm-4"
    assert kv.end is None
