"""Risk: the riskiest assumption follows the data; structural flags; break-even values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pytest

from servewatch.capacity.cache_hit_rate import (
    HitRatioSpread,
    hit_ratio_by_window,
    observe_hit_ratio,
)
from servewatch.capacity.capacity_fit import CapacityFit, FitSpec, LoadUnit, fit_capacity
from servewatch.capacity.fleet_size import size_fleet
from servewatch.capacity.recommendation import recommend
from servewatch.capacity.requirement import RequirementError, parse_requirement
from servewatch.capacity.risk import FlagKind, break_even, tornado
from tests.test_capacity_fit import synthetic_windows
from tests.test_capacity_sizing import seed_chat_data

NOW = datetime(2026, 11, 18, 12, 0, tzinfo=UTC)
T0 = datetime(2026, 11, 10, tzinfo=UTC)


def chat_over_three_zones() -> dict[str, Any]:
    data = seed_chat_data() | {"failure_unit": "host"}
    data["placement"] = {"replicas_per_host": 1, "zones": ["a", "b", "c"]}
    data["slo"] = {"latency": "p95 TPOT", "latency_limit_s": 0.05}
    return data


def batch_fit(*, batch_high: float) -> CapacityFit:
    """Running batch vs p95 TPOT with the knee at 95 requests (1,900 decode tokens/s)."""
    return fit_capacity(
        synthetic_windows(knee_load=95, load_low=4, load_high=batch_high, limit_s=0.05),
        spec=FitSpec(latency_limit_s=0.05, load_unit=LoadUnit.RUNNING_BATCH, seed=17),
        data="synthetic rollups",
    )


def cache_minutes(hourly_ratios: list[float]) -> pl.LazyFrame:
    """Minute counts for two replicas whose hourly hit ratio follows `hourly_ratios`."""
    rows = []
    for hour, ratio in enumerate(hourly_ratios):
        for minute in range(60):
            for replica in ("vllm-0", "vllm-1"):
                queries = 1000 + 10 * minute
                rows.append(
                    {
                        "replica": replica,
                        "minute_ts": T0 + timedelta(hours=hour, minutes=minute),
                        "prefix_cache_queries_tokens": queries,
                        "prefix_cache_hits_tokens": round(queries * ratio),
                    }
                )
    return pl.LazyFrame(rows)


def hit_spread(hourly_ratios: list[float]) -> HitRatioSpread:
    return observe_hit_ratio(cache_minutes(hourly_ratios), every="1h", data="synthetic week")


STABLE = [0.64, 0.66, 0.67, 0.65, 0.68, 0.66, 0.67, 0.65, 0.66, 0.67]
# Restarts and a rollout drop the ratio for hours at a time.
UNSTABLE = [0.66, 0.2, 0.7, 0.25, 0.68, 0.67, 0.3, 0.69, 0.66, 0.15]


def test_windowed_hit_ratio_sums_counts_before_dividing() -> None:
    windows = cache_minutes([0.5, 0.8]).pipe(hit_ratio_by_window, every="1h").collect()
    assert windows["hit_ratio"].to_list() == pytest.approx([0.5, 0.8], abs=1e-3)
    spread = hit_spread(STABLE)
    assert spread.windows == len(STABLE)
    assert spread.spread_ratio < 0.1
    assert hit_spread(UNSTABLE).spread_ratio > 0.1


def test_unstable_hit_rate_names_the_hit_rate() -> None:
    requirement = parse_requirement(chat_over_three_zones(), where="chat.toml")
    record = recommend(
        requirement, now=NOW, fit=batch_fit(batch_high=120), hit_ratio=hit_spread(UNSTABLE)
    )
    riskiest = record.risk.riskiest
    assert riskiest is not None
    assert riskiest.path == "demand.cache_hit_ratio"
    kinds = {flag.kind for flag in record.risk.flags}
    assert FlagKind.UNSTABLE_CACHE_HIT_RATE in kinds
    assert FlagKind.EXTRAPOLATED_KNEE not in kinds
    (flag,) = [f for f in record.risk.flags if f.kind is FlagKind.UNSTABLE_CACHE_HIT_RATE]
    # 166.7 req/s x 1,500 tokens x the measured median hit ratio comes back as prefill.
    assert "losing router affinity (hit ratio 0) would add" in flag.message
    assert "prefill" in flag.message
    assert riskiest.break_even is not None
    assert 0 < riskiest.break_even < 0.65
    assert "peak-hour ratio falls below" in riskiest.measurement_plan[0]


def test_stable_hit_rate_and_narrow_load_range_names_the_capacity_fit() -> None:
    requirement = parse_requirement(chat_over_three_zones(), where="chat.toml")
    narrow = batch_fit(batch_high=30)
    assert narrow.extrapolated
    record = recommend(requirement, now=NOW, fit=narrow, hit_ratio=hit_spread(STABLE))
    riskiest = record.risk.riskiest
    assert riskiest is not None
    assert riskiest.path == "replica.decode_tokens_per_s"
    assert "extrapolated" in riskiest.reason
    assert {flag.kind for flag in record.risk.flags} == {FlagKind.EXTRAPOLATED_KNEE}
    assert riskiest.measurement_plan[0].startswith("Observed load reached only")
    assert "extrapolated" in record.to_markdown()


def test_wide_load_range_and_stable_hit_rate_still_name_the_fit_but_without_a_flag() -> None:
    requirement = parse_requirement(chat_over_three_zones(), where="chat.toml")
    record = recommend(
        requirement, now=NOW, fit=batch_fit(batch_high=120), hit_ratio=hit_spread(STABLE)
    )
    assert record.risk.riskiest is not None
    assert record.risk.riskiest.path == "replica.decode_tokens_per_s"
    assert record.risk.flags == ()
    top = record.risk.tornado[0]
    # A knee inside the data leaves a narrow interval: a swing of a few replicas, not dozens.
    assert top.swing_replicas <= 4


def test_rate_requirement_with_narrow_load_names_the_capacity_fit() -> None:
    data = {
        "failure_unit": "host",
        "demand": {"req_per_min": {"value": 1200, "low": 1100, "high": 1300}},
        "replica": {"capacity_req_per_min": 2400},
        "placement": {"replicas_per_host": 2, "zones": ["a", "b"]},
    }
    requirement = parse_requirement(data, where="r.toml")
    fit = fit_capacity(
        synthetic_windows(knee_load=40, load_low=1, load_high=12, limit_s=0.5, base_s=0.1),
        spec=FitSpec(latency_limit_s=0.5, load_unit=LoadUnit.REQ_PER_S, seed=4),
        data="synthetic",
    )
    record = recommend(requirement, now=NOW, fit=fit)
    assert record.risk.riskiest is not None
    assert record.risk.riskiest.path == "replica.capacity_req_per_min"
    assert any("replaces the stated 2,400 req/min" in note for note in record.notes)


def test_a_fit_over_the_wrong_load_unit_is_refused() -> None:
    requirement = parse_requirement(chat_over_three_zones(), where="chat.toml")
    fit = fit_capacity(
        synthetic_windows(knee_load=40, load_low=1, load_high=50, limit_s=0.05),
        spec=FitSpec(latency_limit_s=0.05, load_unit=LoadUnit.REQ_PER_S, seed=4),
        data="synthetic",
    )
    with pytest.raises(RequirementError, match=r"replica\.decode_tokens_per_s: a capacity fit"):
        recommend(requirement, now=NOW, fit=fit)


def test_tornado_ranks_by_swing_and_break_even_is_where_the_answer_flips() -> None:
    requirement = parse_requirement(chat_over_three_zones(), where="chat.toml")
    bars = tornado(requirement, sizer=size_fleet)
    assert [bar.path for bar in bars] == ["replica.decode_tokens_per_s", "demand.cache_hit_ratio"]
    top = bars[0]
    # 1,700 tok/s: 50,000 / (1,700 x 0.7) x 1.2 = 50.4 -> 51, + 1 host = 52; 2,200: 38.96 -> 40
    assert (top.replicas_at_low, top.replicas_at_high) == (52, 40)
    assert bars[1].swing_replicas == 0
    replicas = size_fleet(requirement).replicas
    assert replicas == 47
    value = break_even(requirement, top, replicas=replicas, sizer=size_fleet)
    assert value is not None
    # 46 surviving replicas x goodput x 0.7 must carry 60,000 tok/s: goodput >= 1,863.4
    assert value == pytest.approx(60_000 / (46 * 0.7), rel=1e-6)


def test_single_zone_with_zone_loss_record_says_adding_hosts_cannot_meet_it() -> None:
    data = {
        "failure_unit": "zone",
        "demand": {"req_per_min": 120},
        "replica": {"capacity_req_per_min": 40},
        "placement": {"replicas_per_host": 2, "zones": ["zone-a"]},
    }
    record = recommend(parse_requirement(data, where="z.toml"), now=NOW)
    assert not record.feasible
    expected = "adding hosts in zone 'zone-a' cannot meet the requirement"
    assert expected in record.verdict()
    assert expected in record.to_json()["failure_table"]["infeasible_reason"]
    assert expected in record.to_markdown()
    assert record.risk.riskiest is not None
    assert record.risk.riskiest.path == "placement.zones"
    assert [flag.kind for flag in record.risk.flags] == [FlagKind.SINGLE_ZONE]


def test_startup_dependency_flag_and_drill() -> None:
    data = chat_over_three_zones()
    data["recovery"] = {
        "interval_s": 180,
        "replacement_startup_s": 300,
        "startup_dependencies": ["artifact registry"],
    }
    record = recommend(parse_requirement(data, where="c.toml"), now=NOW)
    (flag,) = [f for f in record.risk.flags if f.kind is FlagKind.STARTUP_DEPENDENCY]
    assert "replacements take 300 s to start, longer than the 180 s recovery interval" in (
        flag.message
    )
    assert "cannot start without artifact registry" in flag.message
    assert record.risk.riskiest is not None
    drill = record.risk.riskiest.measurement_plan[-1]
    assert drill.startswith("Remove one host during a matched workload at 10,000 req/min")
    assert "routing skew, retries, queue age and useful completions" in drill
    assert "Repeat with artifact registry unavailable" in drill


def test_no_startup_flag_when_replacements_are_quick_and_independent() -> None:
    data = chat_over_three_zones()
    data["recovery"] = {"interval_s": 180, "replacement_startup_s": 90}
    record = recommend(parse_requirement(data, where="c.toml"), now=NOW)
    assert FlagKind.STARTUP_DEPENDENCY not in {flag.kind for flag in record.risk.flags}
