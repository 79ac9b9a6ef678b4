"""The failure drill: clients that retry, the gateway's admission limit, the phases and the
verdict, and seed 000's backlog worksheet played out in simulation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from servewatch.capacity.drill import DrillFleet, DrillPhase, DrillResult, DrillSpec, run_drill
from servewatch.capacity.failure_table import FailureTableSpec, RateUnit, build_failure_table
from servewatch.capacity.placement import FailureUnit
from servewatch.capacity.traffic_step import (
    TrafficStepSpec,
    autoscaled_replicas,
    step_drill,
    warm_pool,
)
from servewatch.emulator.clients import AttemptOutcome, RetryingClients, RetryPolicy
from servewatch.emulator.engine_params import EngineParams
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import (
    AdmissionSpec,
    FleetConfig,
    RouterPolicy,
    RouterSpec,
    TopologySpec,
)
from servewatch.emulator.records import FinishedRequests
from servewatch.emulator.sampled_workload import SampledMix
from servewatch.emulator.workload import RequestSpec, SpecError

# A replica that serves 8 requests a second when full and no more: 4 sequences at a time, each
# 50 tokens of 10 ms steps (prefill is free), so capacity is exact and easy to state.
FIXED_ENGINE = EngineParams(
    step_base_s=0.01,
    step_per_seq_s=0.0,
    step_per_prefill_token_s=0.0,
    max_num_seqs=4,
    max_num_batched_tokens=4096,
)
FIXED_MIX = SampledMix(((16, 50),))
REPLICA_RPS = 4 / (50 * 0.01)


def spec(**overrides: object) -> DrillSpec:
    base = DrillSpec(
        demand_rps=8.0,
        failure_unit=FailureUnit.HOST,
        ttft_limit_s=2.0,
        tpot_limit_s=0.1,
        target_ratio=0.9,
        recovery_interval_s=180.0,
        replacement_startup_s=60.0,
        steady_s=120.0,
        after_s=120.0,
        seed=7,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def fixed_fleet(hosts: int) -> DrillFleet:
    """`hosts` hosts of 2 replicas over two zones."""
    return DrillFleet(
        engine=FIXED_ENGINE,
        topology=TopologySpec(
            zones=("zone-a", "zone-b"),
            hosts_per_zone=(math.ceil(hosts / 2), hosts // 2),
            replicas_per_host=2,
        ),
        router=RouterSpec(policy=RouterPolicy.LEAST_LOADED),
        workload=FIXED_MIX,
    )


# -- clients ---------------------------------------------------------------------------------


class OneShot:
    """A source of one request; records what the client finally told it."""

    def __init__(self) -> None:
        self.sent = False
        self.final: list[tuple[str, bool, bool]] = []

    def next_arrival(self) -> RequestSpec | None:
        if self.sent:
            return None
        self.sent = True
        return RequestSpec("r-1", 10.0, 16, 8, 8, None, None, ())

    def follow_up(
        self,
        finished: RequestSpec,
        *,
        completion_tokens: int,
        end_s: float,
        ok: bool,
        refused: bool = False,
    ) -> RequestSpec | None:
        self.final.append((finished.request_id, ok, refused))
        return None


def test_a_refused_request_is_retried_under_its_own_identity_with_growing_backoff() -> None:
    inner = OneShot()
    clients = RetryingClients(
        inner, RetryPolicy(max_retries=3, backoff_s=1.0, multiplier=2.0, jitter_ratio=0.0), seed=1
    )
    first = clients.next_arrival()
    assert first is not None
    spec_now, end_s, retries = first, 10.0, []
    for _ in range(3):
        again = clients.follow_up(
            spec_now, completion_tokens=0, end_s=end_s, ok=False, refused=True
        )
        assert again is not None
        assert again.request_id == "r-1"
        retries.append(again.arrival_s - end_s)
        spec_now, end_s = again, again.arrival_s
    assert retries == [1.0, 2.0, 4.0]
    # The fourth failure is final: the source hears it once, as refused.
    assert (
        clients.follow_up(spec_now, completion_tokens=0, end_s=end_s, ok=False, refused=True)
        is None
    )
    assert inner.final == [("r-1", False, True)]
    assert [a.attempt for a in clients.attempts] == [0, 1, 2, 3]
    assert {a.outcome for a in clients.attempts} == {AttemptOutcome.REFUSED}
    assert [a.retry_at_s is not None for a in clients.attempts] == [True, True, True, False]


def test_a_shed_request_waits_at_least_the_retry_after() -> None:
    clients = RetryingClients(
        OneShot(), RetryPolicy(max_retries=1, backoff_s=0.1, retry_after_s=5.0), seed=1
    )
    first = clients.next_arrival()
    assert first is not None
    refused = clients.follow_up(first, completion_tokens=0, end_s=10.0, ok=False, refused=True)
    assert refused is not None
    assert refused.arrival_s == pytest.approx(15.0)


def test_a_served_request_is_not_retried_and_reaches_the_source() -> None:
    inner = OneShot()
    clients = RetryingClients(inner, RetryPolicy(max_retries=3), seed=1)
    first = clients.next_arrival()
    assert first is not None
    assert clients.follow_up(first, completion_tokens=8, end_s=11.0, ok=True) is None
    assert inner.final == [("r-1", True, False)]
    assert clients.attempts[0].outcome is AttemptOutcome.SERVED


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_retries", -1), ("backoff_s", -1.0), ("multiplier", 0.5), ("jitter_ratio", 1.0)],
)
def test_retry_policy_names_the_bad_field(field: str, value: float) -> None:
    with pytest.raises(SpecError, match=field):
        RetryPolicy(**{field: value})  # type: ignore[arg-type]


def test_the_gateway_sheds_what_exceeds_its_admission_rate() -> None:
    config = FleetConfig(
        topology=TopologySpec(zones=("zone-a",), hosts_per_zone=1, replicas_per_host=2),
        engine=FIXED_ENGINE,
        admission=AdmissionSpec(rate_rps=5.0, burst=5.0),
    )
    start_s = 1_000.0
    sim = FleetSimulation(
        config,
        observer=FinishedRequests(),
        seed=3,
        start_s=start_s,
        source=FIXED_MIX.source(20.0, seed=3, start_s=start_s, until_s=start_s + 100.0),
    )
    sim.run_until(start_s + 200.0)
    counters = sim.counters
    # About 2,000 arrive in 100 s; the bucket lets through 5 a second and a burst of 5.
    assert 400 <= 2000 - counters.shed_requests <= 600
    assert counters.shed_requests > 1300


# -- the drill ------------------------------------------------------------------------------


def test_a_fleet_whose_survivors_carry_the_demand_holds() -> None:
    # 3 hosts x 2 replicas; losing one leaves 4 replicas, 32 req/s, against 16 arriving.
    result = run_drill(fixed_fleet(3), spec(demand_rps=2 * REPLICA_RPS))
    assert result.holds, result.verdict()
    assert [p.phase for p in result.phases] == list(DrillPhase)
    failed = next(p for p in result.phases if p.phase is DrillPhase.FAILED)
    assert failed.ready_replicas_min == 4
    recovered = next(p for p in result.phases if p.phase is DrillPhase.RECOVERED)
    assert recovered.ready_replicas_min == 6
    assert "holds" in result.verdict()


def test_a_fleet_whose_survivors_cannot_carry_the_demand_fails_in_the_failed_phase() -> None:
    # 2 hosts x 2 replicas serve 32 req/s; losing one leaves 16 against 24 arriving.
    result = run_drill(fixed_fleet(2), spec(demand_rps=24.0))
    assert not result.holds
    assert result.failed_phase is DrillPhase.FAILED
    assert result.failed_minute is not None
    assert result.failed_minute >= 0
    steady = result.phases[0]
    assert steady.phase is DrillPhase.STEADY
    assert steady.holds(0.9)
    assert "fails in phase failed" in result.verdict()


def test_retries_raise_the_effective_arrival_rate_during_the_failure() -> None:
    without = run_drill(fixed_fleet(2), spec(demand_rps=24.0))
    with_retries = run_drill(
        fixed_fleet(2),
        spec(demand_rps=24.0, admission_rps=20.0, retries=RetryPolicy(max_retries=3)),
    )
    failed_without = next(p for p in without.phases if p.phase is DrillPhase.FAILED)
    failed_with = next(p for p in with_retries.phases if p.phase is DrillPhase.FAILED)
    assert failed_with.retries > 0
    assert failed_with.refused > 0
    assert failed_with.effective_arrival_rps > failed_without.effective_arrival_rps


def test_a_blocked_replacement_never_brings_the_replicas_back() -> None:
    result = run_drill(fixed_fleet(3), spec(demand_rps=8.0, replacement_blocked=True))
    assert [p.phase for p in result.phases] == [
        DrillPhase.STEADY,
        DrillPhase.FAILED,
        DrillPhase.REPLACEMENT,
    ]
    assert result.phases[-1].ready_replicas_min == 4


def test_the_same_drill_gives_the_same_result() -> None:
    first = run_drill(fixed_fleet(2), spec(demand_rps=20.0, retries=RetryPolicy(max_retries=2)))
    second = run_drill(fixed_fleet(2), spec(demand_rps=20.0, retries=RetryPolicy(max_retries=2)))
    assert first.to_json() == second.to_json()


@pytest.mark.parametrize(
    ("field", "value"),
    [("demand_rps", 0.0), ("recovery_interval_s", 0.0), ("target_ratio", 1.0)],
)
def test_drill_spec_names_the_bad_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        spec(**{field: value})


# -- seed 000's backlog ---------------------------------------------------------------------


def backlog_drill(hosts: int, *, admission_rps: float | None) -> DrillResult:
    # Failed-state capacity equal to arrivals: 2 hosts x 2 replicas x 8 req/s = 32 req/s once
    # one of 3 hosts is lost, and 32 req/s arrive; 600 old requests land at the failure.
    return run_drill(
        fixed_fleet(hosts),
        spec(
            demand_rps=2 * 2 * REPLICA_RPS,
            backlog_requests=600,
            admission_rps=admission_rps,
            ttft_limit_s=None,
            tpot_limit_s=0.1,
            replacement_blocked=True,
        ),
    )


def test_seed_000_backlog_never_drains_when_failed_capacity_equals_arrivals() -> None:
    result = backlog_drill(3, admission_rps=None)
    assert result.drain_s is None
    assert not result.holds
    assert "never drains" in result.verdict()


def test_seed_000_backlog_drains_with_the_spare_rate_or_the_admission_the_table_proposes() -> None:
    table = build_failure_table(
        FailureTableSpec(
            demand_rate=2 * 2 * REPLICA_RPS * 60,
            replica_rate=REPLICA_RPS * 60,
            unit=RateUnit.REQ_PER_MIN,
            failure_unit=FailureUnit.HOST,
            zones=("zone-a", "zone-b"),
            replicas_per_host=2,
            gpus_per_replica=1,
            usd_per_gpu_hour=None,
            hours_per_month=730.0,
            recovery_interval_s=180.0,
            backlog_work=600.0,
        )
    )
    three = next(row for row in table.rows if row.hosts == 3)
    assert three.drain_s is None  # the worksheet says so too
    # Bounded admission: what the table says keeps the promise with 3 hosts.
    bounded = backlog_drill(3, admission_rps=three.max_admission / 60)
    assert bounded.drain_s is not None, bounded.verdict()
    assert bounded.drain_s <= 180.0, bounded.verdict()
    # The spare rate: the table's minimum host count.
    assert table.minimum is not None
    assert table.minimum.hosts == 4
    spare = backlog_drill(table.minimum.hosts, admission_rps=None)
    assert spare.drain_s is not None, spare.verdict()
    assert spare.drain_s <= 180.0, spare.verdict()


# -- the traffic step ------------------------------------------------------------------------


def step_spec(**overrides: object) -> TrafficStepSpec:
    base = TrafficStepSpec(
        demand_rps=32.0,
        ratio=2.0,
        over_s=300.0,
        lag_s=60.0,
        cold_start_s=120.0,
        replica_rps=REPLICA_RPS * 0.9,
        ttft_limit_s=0.5,
        tpot_limit_s=0.1,
        target_ratio=0.9,
        seed=3,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def five_replicas() -> DrillFleet:
    return replace(
        fixed_fleet(2),
        topology=TopologySpec(zones=("zone-a",), hosts_per_zone=5, replicas_per_host=1),
    )


def test_the_warm_pool_holds_a_2x_step_over_5_minutes_and_one_replica_fewer_does_not() -> None:
    # 5 replicas of 8 req/s carry 32 req/s; the demand doubles over 5 minutes, and the
    # autoscaler's replicas serve 60 s + 120 s (the cold start) after the step starts.
    pool = warm_pool(five_replicas(), step_spec())
    assert pool.warm is not None, pool.summary()
    assert pool.warm >= 1
    assert pool.one_fewer is not None
    assert not pool.one_fewer.holds
    # The same pool and one fewer, drilled again with other arrivals.
    other = step_spec(seed=11)
    assert step_drill(five_replicas(), other, warm=pool.warm).holds
    assert not step_drill(five_replicas(), other, warm=pool.warm - 1).holds
    # Without the pool the gateway sheds the ramp above 5 x 7.2 req/s until minute 3.
    assert pool.shedding.peak_rps == pytest.approx(32 * 1.6 - 36.0)
    assert pool.shedding.seconds == pytest.approx(180 - 37.5, abs=0.5)
    assert "must shed" in pool.summary()


def test_the_autoscaler_starts_what_the_new_demand_needs_beyond_the_warm_pool() -> None:
    spec = step_spec()
    assert autoscaled_replicas(spec, replicas=5, warm=0) == 4  # ceil(64 / 7.2) = 9
    assert autoscaled_replicas(spec, replicas=5, warm=6) == 0
    drilled = step_drill(five_replicas(), spec, warm=1)
    before = [m for m in drilled.minutes if m.minute < 0]
    late = [m for m in drilled.minutes if m.minute >= 4]
    assert {m.ready_replicas for m in before} == {6}
    assert {m.ready_replicas for m in late} == {9}


def test_a_step_that_the_fleet_carries_needs_no_warm_pool() -> None:
    pool = warm_pool(five_replicas(), step_spec(ratio=1.1))
    assert pool.warm == 0
    assert pool.one_fewer is None
    assert pool.shedding.seconds == 0
