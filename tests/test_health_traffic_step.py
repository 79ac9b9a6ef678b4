"""The traffic-step detector on emulated fleets: steps of x1.65, x2.1 and x4 that hurt the SLO
are found from arrivals (with or without a queue), near the step, with their harm; Poisson
noise, a diurnal swing, short bursts and a rise the pool absorbs are not steps; a step whose
harm lasts until new replicas serve is one autoscaler_lag finding. Fixtures are recorded once
per session; a few checks run on synthetic minute frames."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import polars as pl
import pytest

from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet_config import FleetConfig, RouterPolicy, TopologySpec
from servewatch.emulator.workload import ArrivalKind, ArrivalSpec, RateStep
from servewatch.health.finding import Evidence, Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.health.step_harm import HarmRule, SpanHarm
from servewatch.health.traffic_step import TrafficStepDetector
from servewatch.pipeline.request_sli import GoodputLimits
from tests.health_fleet import START, fleet_config, recorded_inputs

pytestmark = pytest.mark.slow

MINUTES = 26
# At 5 requests/s the six replicas run near their limit: a x1.65 step takes attainment from
# about 0.97 to 0.86 against these limits, without a queue worth the name.
RATE_RPS = 5.0
LIMITS = GoodputLimits(ttft_s=2.0, tpot_s=0.04)
STEP_AT_MIN = 12
STEP_MIN = 10
STEP_START = START + timedelta(minutes=STEP_AT_MIN)
STEP_END = STEP_START + timedelta(minutes=STEP_MIN)


def _stepped(factor: float, *, rate_rps: float = RATE_RPS) -> tuple[RateStep, ...]:
    at_s = STEP_AT_MIN * 60.0
    return (
        RateStep(at_s=at_s, rate_rps=rate_rps * factor),
        RateStep(at_s=at_s + STEP_MIN * 60.0, rate_rps=rate_rps),
    )


def _record(
    factory: pytest.TempPathFactory, name: str, config: FleetConfig, *, limits: GoodputLimits
) -> HealthInputs:
    folder = factory.mktemp("step") / name
    return replace(recorded_inputs(config, folder, minutes=MINUTES), limits=limits)


STEPS = {
    "x1.65": (1.65, RouterPolicy.PREFIX_AFFINITY),
    "x2.1": (2.1, RouterPolicy.PREFIX_AFFINITY),
    "x4": (4.0, RouterPolicy.PREFIX_AFFINITY),
    "x1.65-least-loaded": (1.65, RouterPolicy.LEAST_LOADED),
}


@pytest.fixture(scope="session")
def stepped_fleets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HealthInputs]:
    """The base fleet at `RATE_RPS`, its arrivals stepped for 10 minutes from 12 min."""
    return {
        name: _record(
            tmp_path_factory,
            name,
            fleet_config(steps=_stepped(factor), router=router, rate_rps=RATE_RPS),
            limits=LIMITS,
        )
        for name, (factor, router) in STEPS.items()
    }


def _bursts() -> tuple[RateStep, ...]:
    """Triple the rate for 20 or 30 s every 5 minutes: bursts, not a step."""
    steps = []
    for k, at_s in enumerate(range(4 * 60, MINUTES * 60 - 60, 5 * 60)):
        start_s = at_s + 7.0 * k  # not always on a minute's edge
        steps += [
            RateStep(at_s=start_s, rate_rps=3 * RATE_RPS),
            RateStep(at_s=start_s + 20 + 10 * (k % 2), rate_rps=RATE_RPS),
        ]
    return tuple(steps)


def _diurnal() -> FleetConfig:
    """The widest diurnal swing (0 to twice the mean), recorded where it rises fastest."""
    config = fleet_config(rate_rps=RATE_RPS)
    arrival = ArrivalSpec(
        kind=ArrivalKind.DIURNAL, rate_rps=RATE_RPS, peak_to_mean_ratio=2.0, peak_hour_utc=6.0
    )
    return replace(config, workload=replace(config.workload, arrival=arrival))


@pytest.fixture(scope="session")
def calm_fleets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HealthInputs]:
    """Fleets with no step: Poisson noise, a diurnal rate, short bursts; and a x1.65 step at
    a rate the fleet absorbs."""
    configs = {
        "clean": fleet_config(rate_rps=RATE_RPS),
        "diurnal": _diurnal(),
        "bursty": fleet_config(steps=_bursts(), rate_rps=RATE_RPS),
        "absorbed": fleet_config(steps=_stepped(1.65, rate_rps=1.5), rate_rps=1.5),
    }
    return {
        name: _record(tmp_path_factory, name, config, limits=LIMITS)
        for name, config in configs.items()
    }


EXTRA_REPLICAS = ("vllm-2", "vllm-5", "vllm-8")
# The autoscaler restarts them 2 minutes after the step; they serve after a 90 s cold start.
EXTRA_START_S = (STEP_AT_MIN + 2) * 60.0


@pytest.fixture(scope="session")
def autoscaled_fleet(tmp_path_factory: pytest.TempPathFactory) -> HealthInputs:
    """Nine replicas of which three are down from the start (their targets fail every scrape,
    as a scaled-in pool's would), coming up after the step to x1.65 that stays."""
    topology = TopologySpec(hosts_per_zone=1, replicas_per_host=3)
    failures = tuple(
        FailureSpec(FailureKind.REPLICA_CRASH, at_s=0.0, target=name, duration_s=EXTRA_START_S)
        for name in EXTRA_REPLICAS
    )
    config = fleet_config(
        steps=(RateStep(at_s=STEP_AT_MIN * 60.0, rate_rps=1.65 * RATE_RPS),),
        topology=topology,
        failures=failures,
        rate_rps=RATE_RPS,
    )
    return _record(tmp_path_factory, "autoscaled", config, limits=LIMITS)


def _evidence(finding: Finding) -> dict[str, Evidence]:
    return {e.name: e for e in finding.evidence}


def _baseline(evidence: Evidence) -> float:
    assert evidence.baseline is not None, evidence
    return evidence.baseline


@pytest.mark.parametrize("name", list(STEPS))
def test_a_harmful_step_is_found_from_arrivals(
    stepped_fleets: dict[str, HealthInputs], name: str
) -> None:
    factor = STEPS[name][0]
    findings = TrafficStepDetector().detect(stepped_fleets[name])
    assert [f.kind for f in findings] == [FindingKind.TRAFFIC_STEP], findings
    step = findings[0]
    assert (step.scope_unit, step.scope) == (ScopeUnit.POOL, "default")
    assert STEP_START <= step.start <= STEP_START + timedelta(minutes=3)
    evidence = _evidence(step)
    # Follow-up turns come a think time after the answers, so arrivals rise a little less
    # than the rate of new requests.
    assert evidence["mean_arrivals_ratio"].value >= min(1.4, 0.8 * factor)
    assert evidence["peak_arrivals_ratio"].value >= evidence["mean_arrivals_ratio"].value
    assert evidence["arrivals_per_s"].value >= 1.4 * _baseline(evidence["arrivals_per_s"])
    bad = evidence["bad_requests"]
    assert bad.value >= 2 * _baseline(bad)
    assert evidence["excess_bad_requests"].value == pytest.approx(bad.value - _baseline(bad))
    attained = evidence["attainment_ratio"]
    assert attained.value <= _baseline(attained) - 0.05
    assert evidence["ttft_p90_s"].value > _baseline(evidence["ttft_p90_s"])
    assert evidence["requests"].value > _baseline(evidence["requests"])
    assert step.confidence > 0.8
    if factor < 3:  # a x4 step leaves a backlog of follow-up turns past the window's end
        assert step.end is not None
        assert abs(step.end - STEP_END) <= timedelta(minutes=3)


def test_the_x1_65_step_hurts_without_a_queue(stepped_fleets: dict[str, HealthInputs]) -> None:
    """What the queue-only detector missed: the engines took the extra requests into their
    batches, so fewer than 2 waited per replica."""
    step = TrafficStepDetector().detect(stepped_fleets["x1.65"])[0]
    evidence = _evidence(step)
    assert evidence["waiting_requests"].value < 2 * 6
    assert "attainment" in step.summary


def test_without_limits_a_step_is_judged_by_its_ttft(
    stepped_fleets: dict[str, HealthInputs],
) -> None:
    unpriced = replace(stepped_fleets["x4"], limits=GoodputLimits())
    findings = TrafficStepDetector().detect(unpriced)
    assert [f.kind for f in findings] == [FindingKind.TRAFFIC_STEP]
    ttft = _evidence(findings[0])["ttft_p90_s"]
    assert ttft.value >= 10 * _baseline(ttft)


@pytest.mark.parametrize("name", ["clean", "diurnal", "bursty", "absorbed"])
def test_no_step_without_a_sustained_harmful_rise(
    calm_fleets: dict[str, HealthInputs], name: str
) -> None:
    inputs = calm_fleets[name]
    detector = TrafficStepDetector()
    assert detector.detect(inputs) == []
    assert detector.detect(replace(inputs, limits=GoodputLimits())) == []


def test_the_absorbed_rise_is_a_step_without_harm(calm_fleets: dict[str, HealthInputs]) -> None:
    """The rise is there; it is the harm that is missing."""
    detector = TrafficStepDetector()
    inputs = calm_fleets["absorbed"]
    steps = detector.steps(detector.pool_minutes(inputs).collect(), window_start=inputs.start)
    assert len(steps) == 1
    assert STEP_START <= steps[0].start <= STEP_START + timedelta(minutes=3)


def test_bursts_do_not_rise_for_long_enough(calm_fleets: dict[str, HealthInputs]) -> None:
    detector = TrafficStepDetector()
    inputs = calm_fleets["bursty"]
    assert detector.steps(detector.pool_minutes(inputs).collect(), window_start=inputs.start) == []


def test_a_step_until_new_replicas_serve_is_autoscaler_lag(
    autoscaled_fleet: HealthInputs,
) -> None:
    findings = TrafficStepDetector().detect(autoscaled_fleet)
    assert [f.kind for f in findings] == [FindingKind.AUTOSCALER_LAG], findings
    lag = findings[0]
    assert (lag.scope_unit, lag.scope) == (ScopeUnit.POOL, "default")
    assert STEP_START <= lag.start <= STEP_START + timedelta(minutes=3)
    serving_from = START + timedelta(seconds=EXTRA_START_S + 90)
    # Harm ends once the new replicas serve: capacity caught up, not the step's end.
    assert lag.end is not None
    assert serving_from <= lag.end <= serving_from + timedelta(minutes=2)
    evidence = _evidence(lag)
    assert evidence["lag_s"].value == pytest.approx(
        (serving_from - lag.start).total_seconds(), abs=30
    )
    # The emulated replicas' targets were there, failing, from the window's start: that is
    # where their cold start is counted from.
    assert evidence["cold_start_s"].value == pytest.approx(EXTRA_START_S + 90, abs=30)
    assert evidence["replicas_added"].value == len(EXTRA_REPLICAS)
    assert evidence["serving_replicas"].value == 9
    assert _baseline(evidence["serving_replicas"]) == 6
    before = evidence["attainment_before_serving_ratio"]
    assert before.value <= _baseline(before) - 0.05
    after = evidence["attainment_after_serving_ratio"]
    assert after.value > before.value
    assert "mean_arrivals_ratio" in evidence  # the step's own numbers
    assert all(name in lag.summary for name in EXTRA_REPLICAS)
    assert lag.confidence > 0.5


# Synthetic minute frames: the step rules without a recording.


def _minutes(arrivals: list[float]) -> pl.DataFrame:
    detector = TrafficStepDetector()
    frame = pl.DataFrame(
        {
            "pool": ["p"] * len(arrivals),
            "minute_ts": [START + timedelta(minutes=i) for i in range(len(arrivals))],
            "arrivals": arrivals,
        }
    )
    return frame.with_columns(
        baseline_arrivals=pl.col("arrivals")
        .rolling_median(
            window_size=detector.baseline_minutes, min_samples=detector.min_baseline_minutes
        )
        .shift(1)
    )


def test_a_long_step_keeps_its_baseline() -> None:
    """A rolling median catches up with a step after half its window; the frozen one does
    not, so a 20-minute step is one step of 20 minutes."""
    arrivals = [100.0] * 10 + [150.0] * 20 + [100.0] * 5
    steps = TrafficStepDetector().steps(_minutes(arrivals), window_start=START)
    assert len(steps) == 1
    assert steps[0].start == START + timedelta(minutes=10)
    assert steps[0].end == START + timedelta(minutes=30)
    assert steps[0].baseline_per_min == 100.0
    assert steps[0].risen_minutes == 20


def test_two_risen_minutes_or_a_dipping_rise_are_not_steps() -> None:
    detector = TrafficStepDetector()
    burst = [100.0] * 10 + [200.0, 200.0] + [100.0] * 10
    assert detector.steps(_minutes(burst), window_start=START) == []
    # Risen minutes bridged over one-minute gaps, but mean arrivals under the bar.
    dipping = [100.0] * 10 + [131.0, 60.0, 131.0, 60.0, 131.0] + [100.0] * 10
    assert detector.steps(_minutes(dipping), window_start=START) == []
    # A short dip inside a real step is bridged.
    dip = [100.0] * 10 + [160.0, 160.0, 110.0, 160.0, 160.0] + [100.0] * 10
    steps = detector.steps(_minutes(dip), window_start=START)
    assert [(s.start, s.risen_minutes) for s in steps] == [(START + timedelta(minutes=10), 4)]


def _harm(bad: float, *, ttft_p90_s: float = 1.0) -> SpanHarm:
    return SpanHarm(
        requests=1000.0,
        bad_requests=bad,
        baseline_requests=1000.0,
        baseline_bad_requests=20.0,
        ttft_p90_s=ttft_p90_s,
        baseline_ttft_p90_s=1.0,
        by_limits=True,
    )


def test_harm_needs_a_clear_excess_of_bad_requests() -> None:
    rule = HarmRule()
    # 2% bad before: 2.6% and 3% are under 1.5x, 4% is clear, 15% is plain.
    assert rule.clarity(_harm(26.0), objective_ratio=0.99, limits_given=True) == 0.0
    assert rule.clarity(_harm(30.0), objective_ratio=0.99, limits_given=True) == 0.0
    assert 0.0 < rule.clarity(_harm(40.0), objective_ratio=0.99, limits_given=True) < 1.0
    assert rule.clarity(_harm(150.0), objective_ratio=0.99, limits_given=True) == 1.0
    # A looser objective leaves more room: 4% bad is within a 5% budget's margin.
    assert rule.clarity(_harm(40.0), objective_ratio=0.95, limits_given=True) == 0.0


def test_without_limits_harm_is_a_clear_ttft_rise() -> None:
    rule = HarmRule()
    assert rule.clarity(_harm(20.0, ttft_p90_s=1.3), objective_ratio=0.99, limits_given=False) == 0
    assert rule.clarity(_harm(20.0, ttft_p90_s=2.0), objective_ratio=0.99, limits_given=False) == 1
