"""Demand model and sizing chain: seed 003's 10,000-user 70B chain exactly, and properties."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servewatch.capacity.cost import usd_per_month
from servewatch.capacity.demand import (
    RateDemand,
    TokenDemand,
    affinity_loss_prefill,
    estimate_demand,
    prefill_tokens_per_s,
)
from servewatch.capacity.failure_table import RateUnit
from servewatch.capacity.figure import SourceKind, assumed
from servewatch.capacity.fleet_size import size_fleet
from servewatch.capacity.recommendation import recommend
from servewatch.capacity.requirement import Requirement, parse_requirement
from servewatch.capacity.sizing import Binding, RateCapacity, TokenCapacity, size_chain

NOW = datetime(2026, 11, 18, 12, 0, tzinfo=UTC)


def seed_chat_data() -> dict[str, Any]:
    """Seed 003's workload and its stated assumptions, as a requirement file would hold them."""
    return {
        "name": "chat-70b",
        "failure_unit": "none",
        "headroom_ratio": 0.2,
        "demand": {
            "concurrent_users": 10_000,
            "answer_tokens": 300,
            "tpot_s": 0.05,
            "think_and_read_s": 45,
            "prompt_tokens": 1500,
            # Seed: of the 1,500 prompt tokens about 1,000 are a cached prefix on multi-turn.
            "cache_hit_ratio": {"value": 1000 / 1500, "low": 0.65, "high": 0.85},
        },
        "replica": {
            "gpus": 8,
            "decode_tokens_per_s": {"value": 1900, "low": 1700, "high": 2200},
            "prefill_share_ratio": 0.3,
            "prefill_compute": {"gpu_tflops": 700, "mfu_ratio": 0.4, "model_params": 70e9},
        },
        "cost": {"usd_per_gpu_hour": 2.5},
    }


def seed_chat() -> Requirement:
    return parse_requirement(seed_chat_data(), where="seed 003")


def step_values(requirement: Requirement) -> dict[str, float]:
    fleet = size_fleet(requirement)
    return {step.label: step.figure.value for step in fleet.chain.steps}


def test_seed_chat_chain_reproduces_every_step() -> None:
    steps = step_values(seed_chat())
    # step 1: token demand
    assert steps["answer time"] == pytest.approx(15.0)  # 300 x 50 ms
    assert steps["share of users mid-generation"] == pytest.approx(0.25)  # 15 / (15 + 45)
    assert steps["per-user token rate"] == pytest.approx(20.0)
    assert steps["decode demand"] == pytest.approx(50_000)  # 10,000 x 0.25 x 20
    assert steps["request rate"] == pytest.approx(10_000 / 60)  # one request per 60 s
    assert steps["prefill demand"] == pytest.approx(83_333.33, rel=1e-6)  # "~83,000"
    # step 2: 8 x 700 TFLOPS x 40% / (2 x 70e9) = 16,000 tok/s of prefill per replica
    assert steps["prefill rate"] == pytest.approx(16_000)
    # step 3: 50,000 / 1,900 = 26.3 ("~26"); / 0.7 = 37.6 ("~37"); prefill 17.4 ("~17")
    assert steps["decode replicas if decode had the GPUs to itself"] == pytest.approx(
        26.3158, abs=1e-4
    )
    assert steps["decode replicas with prefill's share set aside"] == pytest.approx(
        37.5940, abs=1e-4
    )
    assert steps["prefill check: replicas' worth of prefill at the budgeted share"] == (
        pytest.approx(17.3611, abs=1e-4)
    )
    # Seed: plus 20% headroom gives about 45 replicas.
    assert steps["replicas with headroom"] == pytest.approx(45.1128, abs=1e-4)


def test_seed_chat_is_about_37_before_and_45_after_headroom_and_whole_replicas_round_up() -> None:
    fleet = size_fleet(seed_chat())
    assert 37 <= fleet.chain.replicas_before_headroom.value < 38
    assert 45 <= fleet.chain.replicas_with_headroom.value < 46
    assert fleet.chain.binding is Binding.DECODE
    # A fleet is whole replicas: 45.1 replicas' worth needs 46 (the seed rounds to 45).
    assert fleet.replicas == 46
    assert fleet.table.spec.unit is RateUnit.DECODE_TOKENS_PER_S
    assert fleet.table.spec.replica_rate == pytest.approx(1330)  # 1,900 x 0.7


def test_seed_chat_cost_sanity() -> None:
    # "360 H100s at $2.50/h = $900/h"; a month of 730 h is about $650k.
    per_hour = usd_per_month(
        replicas=45, gpus_per_replica=8, usd_per_gpu_hour=2.5, hours_per_month=1
    )
    assert per_hour == 900
    assert usd_per_month(
        replicas=45, gpus_per_replica=8, usd_per_gpu_hour=2.5, hours_per_month=730
    ) == pytest.approx(657_000)


def test_seed_chat_host_loss_adds_one_eight_gpu_host() -> None:
    data = seed_chat_data() | {"failure_unit": "host"}
    data["placement"] = {"replicas_per_host": 1, "zones": ["a", "b", "c"]}
    fleet = size_fleet(parse_requirement(data, where="t"))
    assert fleet.replicas == 47
    assert fleet.table.minimum is not None
    assert fleet.table.minimum.failed_capacity >= 60_000


def test_hit_ratio_from_65_to_85_percent_cuts_prefill_by_more_than_half() -> None:
    def prefill(hit: float) -> float:
        return prefill_tokens_per_s(req_per_s=10_000 / 60, prompt_tokens=1500, cache_hit_ratio=hit)

    assert prefill(0.85) < 0.5 * prefill(0.65)


def test_losing_affinity_adds_the_cached_prefix_back_as_prefill() -> None:
    demand = seed_chat().demand
    assert isinstance(demand, TokenDemand)
    extra = affinity_loss_prefill(demand, affinity_loss_hit_ratio=0.0)
    # 166.7 req/s x the 1,000 cached tokens
    assert extra.value == pytest.approx(10_000 / 60 * 1000)
    assert extra.kind is SourceKind.DERIVED


def test_prefill_binds_when_the_cache_is_cold() -> None:
    requirement = seed_chat()
    demand = requirement.demand
    assert isinstance(demand, TokenDemand)
    cold = replace(requirement, demand=replace(demand, cache_hit_ratio=assumed(0.0, "ratio", "t")))
    fleet = size_fleet(cold)
    # 250,000 tok/s of prefill / (16,000 x 0.3) = 52.1 replicas' worth, above decode's 37.6
    assert fleet.chain.binding is Binding.PREFILL
    assert fleet.chain.replicas_before_headroom.value == pytest.approx(250_000 / 4800)
    assert fleet.table.spec.unit is RateUnit.PREFILL_TOKENS_PER_S


def test_every_chain_step_names_its_source() -> None:
    record = recommend(seed_chat(), now=NOW)
    for step in record.fleet.chain.steps:
        assert step.figure.kind is SourceKind.DERIVED
        assert step.figure.basis
    inputs = record.to_json()["inputs"]
    assert {item["path"] for item in inputs} >= {
        "demand.concurrent_users",
        "demand.cache_hit_ratio",
        "replica.decode_tokens_per_s",
        "replica.prefill_compute.mfu_ratio",
        "headroom_ratio",
        "cost.hours_per_month",
    }
    assert all(item["source"].startswith(("assumed: ", "measured: ")) for item in inputs)


@pytest.mark.parametrize(
    ("demand", "capacity", "headroom", "replicas"),
    [
        (120, 40, 0.0, 3.0),
        (90, 30, 0.0, 3.0),
        (100, 40, 0.2, 3.0),
        (1000, 30, 0.5, 50.0),
    ],
)
def test_rate_chain(demand: float, capacity: float, headroom: float, replicas: float) -> None:
    chain = size_chain(
        estimate_demand(RateDemand(assumed(demand, "req/min", "t"), assumed(1.0, "ratio", "t"))),
        RateCapacity(gpus=1, capacity_req_per_min=assumed(capacity, "req/min", "t")),
        headroom_ratio=assumed(headroom, "ratio", "t"),
    )
    assert chain.replicas_with_headroom.value == pytest.approx(replicas)
    assert chain.demand_rate.value == pytest.approx(demand * (1 + headroom))


def test_token_capacity_needs_token_demand() -> None:
    capacity = TokenCapacity(
        gpus=8,
        decode_tokens_per_s=assumed(1900, "tokens/s", "t"),
        prefill_share_ratio=assumed(0.3, "ratio", "t"),
        prefill_tokens_per_s=assumed(16_000, "tokens/s", "t"),
    )
    demand = estimate_demand(RateDemand(assumed(120, "req/min", "t"), assumed(1.0, "ratio", "t")))
    with pytest.raises(ValueError, match="needs demand in tokens"):
        size_chain(demand, capacity, headroom_ratio=assumed(0, "ratio", "t"))


@given(
    users=st.floats(min_value=10, max_value=1e6),
    goodput=st.floats(min_value=100, max_value=10_000),
    more=st.floats(min_value=1.0, max_value=3.0),
    hit=st.floats(min_value=0.0, max_value=1.0),
)
def test_chain_grows_with_users_and_shrinks_with_goodput(
    users: float, goodput: float, more: float, hit: float
) -> None:
    def replicas(users: float, goodput: float) -> float:
        data = seed_chat_data()
        data["demand"] |= {"concurrent_users": users, "cache_hit_ratio": hit}
        data["replica"] |= {"decode_tokens_per_s": goodput}
        return size_fleet(parse_requirement(data, where="t")).chain.replicas_with_headroom.value

    base = replicas(users, goodput)
    assert replicas(users * more, goodput) >= base * (1 - 1e-12)
    assert replicas(users, goodput * more) <= base * (1 + 1e-12)
