"""Ground truth: capacity at SLO found by search, checked 15% either side of the answer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from servewatch.emulator.engine import EngineParams
from servewatch.emulator.fleet_config import (
    FleetConfig,
    RouterPolicy,
    RouterSpec,
    SloSpec,
    TopologySpec,
)
from servewatch.emulator.ground_truth import (
    SETTLE_LIFETIMES,
    attainment_at,
    capacity_at_slo,
    capacity_for_config,
    fleet_capacity_for_config,
    meets_slo,
    request_lifetime_s,
)
from servewatch.emulator.records import FinishedReason, FinishedRequest
from servewatch.emulator.trace_replay import TraceFormat
from servewatch.emulator.workload import (
    ArrivalSpec,
    ConversationSpec,
    Distribution,
    ReplaySpec,
    WorkloadSpec,
)

SLO = SloSpec(ttft_s=0.5, tpot_s=0.05, target_ratio=0.9)


def record(ttft_s: float, decode_s: float, tokens: int, reason: FinishedReason) -> FinishedRequest:
    return FinishedRequest(
        "r", "id", None, None, 0.0, 0.0, ttft_s, decode_s, 10, 0, tokens, 100, reason
    )


@pytest.mark.parametrize(
    ("ttft_s", "decode_s", "tokens", "reason", "good"),
    [
        (0.5, 0.5, 11, FinishedReason.STOP, True),  # both limits exactly: inclusive
        (0.5000001, 0.5, 11, FinishedReason.STOP, False),
        (0.1, 0.5000001, 11, FinishedReason.LENGTH, False),
        (0.1, 0.0, 1, FinishedReason.STOP, True),  # one token: no TPOT
        (0.1, 0.1, 11, FinishedReason.ERROR, False),
        (0.1, 0.1, 11, FinishedReason.ABORT, False),
    ],
)
def test_a_request_is_good_when_it_meets_both_limits(
    ttft_s: float, decode_s: float, tokens: int, reason: FinishedReason, good: bool
) -> None:
    assert meets_slo(record(ttft_s, decode_s, tokens, reason), SLO) is good


# A slow engine, so capacity is a few requests per second and probes stay small.
ENGINE = EngineParams(
    step_base_s=0.015,
    step_per_seq_s=0.0015,
    step_per_prefill_token_s=0.0002,
    max_num_batched_tokens=1024,
    max_num_seqs=32,
    num_gpu_blocks=4000,
    max_model_len=8192,
)
SINGLE_TURNS = WorkloadSpec(
    arrival=ArrivalSpec(rate_rps=1.0),
    user_tokens=Distribution.lognormal(300.0, 0.6, min_value=10, max_value=2000),
    output_tokens=Distribution.lognormal(80.0, 0.6, min_value=1, max_value=600),
    max_tokens=400,
)


def test_capacity_holds_15_percent_below_and_fails_15_percent_above() -> None:
    result = capacity_at_slo(ENGINE, SINGLE_TURNS, slo=SLO, seed=5, requests=2500)
    capacity = result.capacity_rps
    assert capacity > 0
    assert result.attainment_ratio >= SLO.target_ratio
    rates = [p.rate_rps for p in result.probes]
    assert capacity in rates  # the answer is a rate that was simulated
    assert min(r for r in rates if r > capacity) <= capacity * 1.02  # bracket tolerance
    for seed in (5, 6, 7):  # the search's own requests, and other draws of the same mix
        below = attainment_at(
            ENGINE, SINGLE_TURNS, rate_rps=0.85 * capacity, slo=SLO, seed=seed, requests=2500
        )
        above = attainment_at(
            ENGINE, SINGLE_TURNS, rate_rps=1.15 * capacity, slo=SLO, seed=seed, requests=2500
        )
        assert below.attainment_ratio >= SLO.target_ratio, (seed, below)
        assert above.attainment_ratio < SLO.target_ratio, (seed, above)


def test_conversational_mix_capacity_is_measured_after_follow_ups_build_up() -> None:
    workload = FleetConfig.default().workload
    result = capacity_at_slo(ENGINE, workload, slo=SLO, seed=2, requests=1500)
    capacity = result.capacity_rps
    for factor, meets in ((0.85, True), (1.15, False)):
        probe = attainment_at(
            ENGINE, workload, rate_rps=factor * capacity, slo=SLO, seed=3, requests=1500
        )
        assert (probe.attainment_ratio >= SLO.target_ratio) is meets, (factor, probe)


def test_probe_judges_only_the_window_and_counts_stragglers_as_bad() -> None:
    # Far beyond capacity: most judged requests never finish in time, all count as bad. The
    # window is the requests asked for, or the settling time when they arrive sooner.
    overload = attainment_at(ENGINE, SINGLE_TURNS, rate_rps=200.0, slo=SLO, seed=1, requests=400)
    window_s = max(400 / 200.0, SETTLE_LIFETIMES * request_lifetime_s(ENGINE, SINGLE_TURNS, SLO))
    assert overload.judged_requests == pytest.approx(200.0 * window_s, rel=0.15)
    assert overload.attainment_ratio < 0.2
    light = attainment_at(ENGINE, SINGLE_TURNS, rate_rps=0.5, slo=SLO, seed=1, requests=200)
    assert light.attainment_ratio > 0.95


def test_capacity_search_reports_zero_when_even_a_trickle_misses() -> None:
    impossible = SloSpec(ttft_s=0.001, tpot_s=0.001)
    result = capacity_at_slo(ENGINE, SINGLE_TURNS, slo=impossible, seed=1, requests=50)
    assert result.capacity_rps == 0.0
    assert all(p.attainment_ratio < impossible.target_ratio for p in result.probes)


def test_conversation_spec_changes_the_mix_not_the_rate() -> None:
    single = attainment_at(ENGINE, SINGLE_TURNS, rate_rps=2.0, slo=SLO, seed=4, requests=300)
    chats = WorkloadSpec(
        arrival=SINGLE_TURNS.arrival,
        user_tokens=SINGLE_TURNS.user_tokens,
        output_tokens=SINGLE_TURNS.output_tokens,
        max_tokens=SINGLE_TURNS.max_tokens,
        conversation=ConversationSpec(turns_mean=3.0, think_time_s=Distribution.fixed(5.0)),
    )
    chatty = attainment_at(ENGINE, chats, rate_rps=2.0, slo=SLO, seed=4, requests=300)
    # Same request rate: about as many requests judged either way.
    assert chatty.judged_requests == pytest.approx(single.judged_requests, rel=0.2)


def test_capacity_for_config_measures_the_configured_engine_mix_and_slo(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,10\n", encoding="utf-8")
    config = replace(
        FleetConfig.default(),
        engine=ENGINE,
        workload=replace(SINGLE_TURNS, replay=ReplaySpec(trace, TraceFormat.AZURE_CSV)),
        slo=SloSpec(ttft_s=1.0, tpot_s=0.1, target_ratio=0.8),
    )
    got = capacity_for_config(config, seed=3, requests=200)
    want = capacity_at_slo(ENGINE, SINGLE_TURNS, slo=config.slo, seed=3, requests=200)
    assert got == want
    assert got.slo == config.slo
    assert got.capacity_rps > 0


def test_a_fleet_of_one_replica_has_the_replicas_own_capacity() -> None:
    alone = FleetConfig(
        topology=TopologySpec(zones=("zone-a",), hosts_per_zone=1, replicas_per_host=1),
        engine=ENGINE,
        router=RouterSpec(policy=RouterPolicy.ROUND_ROBIN),
        workload=SINGLE_TURNS,
        slo=SLO,
    )
    assert fleet_capacity_for_config(alone, seed=3, requests=400) == capacity_for_config(
        alone, seed=3, requests=400
    )


def test_a_fleet_behind_a_router_carries_at_least_a_lone_replicas_rate_each() -> None:
    # Six replicas fed one Poisson stream: least-loaded routing evens out bursts, and round
    # robin hands each replica every sixth arrival, a steadier stream than a lone Poisson one;
    # so each replica carries at least what it carries alone, and the fleet-level truth is
    # the number a fleet's refit must be judged against.
    fleet = FleetConfig(
        topology=TopologySpec(zones=("zone-a", "zone-b"), hosts_per_zone=1, replicas_per_host=3),
        engine=ENGINE,
        workload=SINGLE_TURNS,
        slo=SLO,
    )
    alone = capacity_for_config(fleet, seed=5, requests=1500).capacity_rps
    for policy in (RouterPolicy.LEAST_LOADED, RouterPolicy.ROUND_ROBIN):
        routed = replace(fleet, router=RouterSpec(policy=policy))
        each = fleet_capacity_for_config(routed, seed=5, requests=1500)
        assert each.capacity_rps >= alone * 0.98, policy
        assert each.attainment_ratio >= SLO.target_ratio


def test_a_busy_probe_lasts_long_enough_to_show_the_steady_state() -> None:
    # 3000 requests at 60 req/s arrive in 50 s, a couple of answers' worth: the probe warms up
    # and judges for at least two lifetimes of a request meeting the SLO instead.
    lifetime_s = request_lifetime_s(ENGINE, SINGLE_TURNS, SLO)
    probe = attainment_at(ENGINE, SINGLE_TURNS, rate_rps=60.0, slo=SLO, seed=2, requests=300)
    assert probe.judged_requests >= 0.85 * 60.0 * SETTLE_LIFETIMES * lifetime_s
