"""Workloads: arrival processes, length distributions, conversations and tenants."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servewatch.emulator.workload import (
    ArrivalKind,
    ArrivalSpec,
    ConversationSpec,
    Distribution,
    DistributionKind,
    PrefixSegment,
    RateStep,
    SpecError,
    SyntheticWorkload,
    TenantSpec,
    WorkloadSpec,
    arrival_clock,
    next_arrival_offset,
)

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def arrivals(spec: ArrivalSpec, *, seconds: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    while (t := next_arrival_offset(spec, t, rng, start_s=T0)) < seconds:
        out.append(t)
    return out


def test_poisson_rate_and_exponential_gaps() -> None:
    times = arrivals(ArrivalSpec(rate_rps=5.0), seconds=4000)
    assert len(times) == pytest.approx(20_000, rel=0.03)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Exponential gaps: the share longer than the mean is e^-1.
    assert sum(g > 0.2 for g in gaps) / len(gaps) == pytest.approx(math.exp(-1), abs=0.02)


def test_step_schedule_changes_the_rate_at_each_step() -> None:
    spec = ArrivalSpec(
        kind=ArrivalKind.STEPS,
        rate_rps=2.0,
        steps=(RateStep(1000.0, 10.0), RateStep(1500.0, 0.0), RateStep(2000.0, 2.0)),
    )
    times = arrivals(spec, seconds=3000)

    def count(lo: float, hi: float) -> int:
        return sum(lo <= t < hi for t in times)

    assert count(0, 1000) == pytest.approx(2000, rel=0.08)
    assert count(1000, 1500) == pytest.approx(5000, rel=0.05)
    assert count(1500, 2000) == 0
    assert count(2000, 3000) == pytest.approx(2000, rel=0.08)
    assert spec.rate_at(1200.0, start_s=T0) == 10.0
    assert spec.rate_at(1500.0, start_s=T0) == 0.0


def test_a_final_zero_rate_ends_the_arrivals() -> None:
    spec = ArrivalSpec(kind=ArrivalKind.STEPS, rate_rps=1.0, steps=(RateStep(10.0, 0.0),))
    assert next_arrival_offset(spec, 10.0, random.Random(1), start_s=T0) == math.inf
    assert (
        next_arrival_offset(ArrivalSpec(rate_rps=0.0), 0.0, random.Random(1), start_s=T0)
        == math.inf
    )


def test_diurnal_rate_peaks_at_its_hour_and_keeps_its_mean() -> None:
    spec = ArrivalSpec(
        kind=ArrivalKind.DIURNAL, rate_rps=2.0, peak_to_mean_ratio=1.5, peak_hour_utc=15
    )
    times = arrivals(spec, seconds=86_400)
    assert len(times) == pytest.approx(172_800, rel=0.02)
    # T0 is 08:00 UTC: the peak hour (15:00) is 7 h in, the trough (03:00) 19 h in.
    peak = sum(6.5 * 3600 <= t < 7.5 * 3600 for t in times)
    trough = sum(18.5 * 3600 <= t < 19.5 * 3600 for t in times)
    assert peak == pytest.approx(3 * 3600 * 0.995, rel=0.05)
    assert trough == pytest.approx(1 * 3600 * 0.995, rel=0.08)
    assert spec.rate_at(7 * 3600, start_s=T0) == pytest.approx(3.0)


@pytest.mark.parametrize(
    "spec",
    [
        ArrivalSpec(rate_rps=3.0),
        ArrivalSpec(kind=ArrivalKind.DIURNAL, rate_rps=3.0, peak_to_mean_ratio=1.8),
        ArrivalSpec(kind=ArrivalKind.STEPS, rate_rps=3.0, steps=(RateStep(50.0, 9.0),)),
    ],
)
def test_compiled_arrival_clock_draws_what_the_reference_draws(spec: ArrivalSpec) -> None:
    clock = arrival_clock(spec, random.Random(5), start_s=T0)
    rng = random.Random(5)
    t_fast = t_ref = 0.0
    for _ in range(500):
        t_fast = clock(t_fast)
        t_ref = next_arrival_offset(spec, t_ref, rng, start_s=T0)
        assert t_fast == pytest.approx(t_ref, rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    kind=st.sampled_from(list(DistributionKind)),
    a=st.floats(min_value=0.5, max_value=500),
    b=st.floats(min_value=0.0, max_value=2.0),
    lo=st.floats(min_value=0, max_value=50),
)
def test_compiled_samplers_draw_what_sample_draws(
    kind: DistributionKind, a: float, b: float, lo: float
) -> None:
    dist = Distribution(
        kind,
        value=a,
        low=a,
        high=a * (1 + b),
        median=a,
        sigma=b,
        mean=a,
        min_value=lo,
        max_value=lo + 1000,
    )
    fast, fast_tokens = dist.sampler(random.Random(3)), dist.token_sampler(random.Random(4))
    ref, ref_tokens = random.Random(3), random.Random(4)
    for _ in range(50):
        assert fast() == dist.sample(ref)
        assert fast_tokens() == dist.sample_tokens(ref_tokens)


def test_lognormal_lengths_have_the_median_they_name() -> None:
    dist = Distribution.lognormal(400.0, 0.9, min_value=4, max_value=6000)
    rng = random.Random(2)
    values = sorted(dist.sample_tokens(rng) for _ in range(20_001))
    assert values[10_000] == pytest.approx(400, rel=0.05)
    assert values[0] >= 4
    assert values[-1] <= 6000


def collect(workload: SyntheticWorkload, *, completion: int = 50, gap_s: float = 1.0) -> list:  # type: ignore[type-arg]
    """Every request, follow-up turns answered `gap_s` after they arrive with `completion`."""
    out = []
    while (request := workload.next_arrival()) is not None:
        while request is not None:
            out.append(request)
            request = workload.follow_up(
                request, completion_tokens=completion, end_s=request.arrival_s + gap_s, ok=True
            )
    return out


def test_conversation_turns_grow_the_shared_history() -> None:
    spec = WorkloadSpec(
        arrival=ArrivalSpec(rate_rps=1.0),
        user_tokens=Distribution.fixed(100),
        output_tokens=Distribution.fixed(30),
        conversation=ConversationSpec(turns_mean=3.0, think_time_s=Distribution.fixed(7.0)),
        tenants=(TenantSpec("chat", system_prompt_tokens=50),),
    )
    requests = collect(
        SyntheticWorkload(spec, seed=1, start_s=T0, until_s=T0 + 3000), completion=30
    )
    by_conversation: dict[str, list] = {}  # type: ignore[type-arg]
    for r in requests:
        by_conversation.setdefault(r.conversation_id, []).append(r)
    turns = [len(v) for v in by_conversation.values()]
    assert sum(turns) / len(turns) == pytest.approx(3.0, rel=0.1)  # geometric, mean 3
    assert len(requests) / 3000 == pytest.approx(1.0, rel=0.1)  # the rate counts every turn
    for conversation in by_conversation.values():
        for i, r in enumerate(conversation):
            assert r.prompt_tokens == 50 + 100 + i * (30 + 100)
            assert r.prefix == (
                PrefixSegment("system:chat", 50),
                PrefixSegment(r.conversation_id, r.prompt_tokens),
            )
            assert r.answer_extends_prefix
            assert r.tenant == "chat"
        for before, after in itertools.pairwise(conversation):
            assert after.arrival_s == pytest.approx(before.arrival_s + 1.0 + 7.0)
    assert len({r.request_id for r in requests}) == len(requests)


def test_a_failed_turn_or_a_full_context_ends_the_conversation() -> None:
    spec = WorkloadSpec(
        arrival=ArrivalSpec(rate_rps=1.0),
        user_tokens=Distribution.fixed(400),
        output_tokens=Distribution.fixed(100),
        conversation=ConversationSpec(turns_mean=50.0),
        max_context_tokens=1500,
    )
    workload = SyntheticWorkload(spec, seed=1, start_s=T0)
    first = workload.next_arrival()
    assert first is not None
    assert workload.follow_up(first, completion_tokens=5, end_s=T0 + 1, ok=False) is None
    assert workload.active_conversations == 0
    second = workload.next_arrival()
    assert second is not None
    prompts = []
    request = second
    while request is not None:
        prompts.append(request.prompt_tokens)
        request = workload.follow_up(
            request, completion_tokens=100, end_s=request.arrival_s, ok=True
        )
    assert prompts == [400, 900, 1400]  # the next (1900) would not fit in 1500
    assert workload.active_conversations == 0


def test_tenants_get_conversations_in_proportion_to_their_weight() -> None:
    spec = WorkloadSpec(
        arrival=ArrivalSpec(rate_rps=10.0),
        tenants=(TenantSpec("a", weight=3.0), TenantSpec("b", weight=1.0)),
    )
    requests = collect(SyntheticWorkload(spec, seed=4, start_s=T0, until_s=T0 + 1000))
    share_a = sum(r.tenant == "a" for r in requests) / len(requests)
    assert share_a == pytest.approx(0.75, abs=0.02)


def test_same_seed_same_requests_and_streams_do_not_interfere() -> None:
    spec = WorkloadSpec()
    one = collect(SyntheticWorkload(spec, seed=9, start_s=T0, until_s=T0 + 200))
    two = collect(SyntheticWorkload(spec, seed=9, start_s=T0, until_s=T0 + 200))
    assert one == two
    other = collect(SyntheticWorkload(spec, seed=10, start_s=T0, until_s=T0 + 200))
    assert other != one

    def conversation_starts(requests: list) -> list[float]:  # type: ignore[type-arg]
        seen: set[str] = set()
        starts = []
        for r in requests:
            if r.conversation_id not in seen:
                seen.add(r.conversation_id)
                starts.append(r.arrival_s)
        return starts

    # Other lengths draw differently from the length stream; arrivals do not move.
    fixed = replace(spec, output_tokens=Distribution.fixed(999))
    three = collect(SyntheticWorkload(fixed, seed=9, start_s=T0, until_s=T0 + 200))
    assert conversation_starts(three) == conversation_starts(one)


@pytest.mark.parametrize(
    ("make", "field", "message"),
    [
        (lambda: Distribution(DistributionKind.LOGNORMAL, median=0.0), "median", "> 0"),
        (lambda: Distribution(DistributionKind.UNIFORM, low=5, high=1), "high", ">= low"),
        (
            lambda: Distribution(DistributionKind.FIXED, value=1, min_value=5, max_value=1),
            "max",
            ">= min",
        ),
        (lambda: Distribution(DistributionKind.EXPONENTIAL, mean=-1), "mean", "> 0"),
        (lambda: ArrivalSpec(rate_rps=-1.0), "rate_rps", ">= 0"),
        (lambda: ArrivalSpec(peak_to_mean_ratio=3.0), "peak_to_mean_ratio", "between 1 and 2"),
        (lambda: ArrivalSpec(peak_hour_utc=24.0), "peak_hour_utc", r"\[0, 24\)"),
        (
            lambda: ArrivalSpec(steps=(RateStep(10, 1), RateStep(5, 1))),
            "steps[1].at_s",
            "increasing time order",
        ),
        (lambda: TenantSpec("t", weight=0.0), "weight", "> 0"),
        (lambda: TenantSpec(""), "name", "empty"),
        (lambda: ConversationSpec(turns_mean=0.5), "turns_mean", ">= 1"),
        (lambda: WorkloadSpec(tenants=()), "tenants", "at least one"),
        (lambda: WorkloadSpec(tenants=(TenantSpec("a"), TenantSpec("a"))), "tenants", "unique"),
        (lambda: WorkloadSpec(max_tokens=0), "max_tokens", ">= 1"),
    ],
)
def test_specs_name_the_bad_field(make: object, field: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        make()  # type: ignore[operator]
    assert info.value.field == field
