"""Observed demand: arrivals per minute from traced requests, against a brute-force count."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servewatch.capacity.demand import RateDemand
from servewatch.capacity.observed_demand import HIGH_QUANTILE, minute_arrivals, observed_demand
from servewatch.capacity.recommendation import recommend, with_observed_demand
from servewatch.capacity.requirement import RequirementError, parse_requirement

T0 = datetime(2026, 11, 18, 10, 0, 0)
NOW = datetime(2026, 11, 18, 12, 0, tzinfo=UTC)


def requests(arrival_offsets_s: list[float], *, seed: int = 1) -> pl.LazyFrame:
    rng = random.Random(seed)
    return pl.LazyFrame(
        {
            "arrival_ts": [T0 + timedelta(seconds=s) for s in arrival_offsets_s],
            "completion_tokens": [rng.randrange(1, 400) for _ in arrival_offsets_s],
            "prompt_tokens": [rng.randrange(1, 4000) for _ in arrival_offsets_s],
            "pool": [rng.choice(["chat", "batch", None]) for _ in arrival_offsets_s],
            "tenant": [rng.choice(["a", "b"]) for _ in arrival_offsets_s],
        },
        schema_overrides={"arrival_ts": pl.Datetime("us")},
    )


def brute_minutes(offsets_s: list[float]) -> list[int]:
    """Arrivals of each whole minute strictly between the first and the last minute."""
    minute_of = [timedelta(seconds=s) // timedelta(minutes=1) for s in offsets_s]
    counts = Counter(minute_of)
    return [counts[m] for m in range(min(minute_of) + 1, max(minute_of))]


@settings(max_examples=60, deadline=None)
@given(
    offsets=st.lists(st.floats(min_value=0, max_value=3 * 3600), min_size=1, max_size=400),
)
def test_arrivals_per_minute_match_a_brute_force_count(offsets: list[float]) -> None:
    expected = brute_minutes(offsets)
    minutes = minute_arrivals(requests(offsets)).collect()
    assert minutes.get_column("arrivals").to_list() == expected
    demand = observed_demand(requests(offsets))
    if not expected:
        assert demand is None
        return
    assert demand is not None
    assert demand.minutes == len(expected)
    assert demand.peak_req_per_min == max(expected)
    assert demand.mean_req_per_min == pytest.approx(sum(expected) / len(expected))
    ranked = sorted(expected)
    # 'higher' interpolation: the order statistic at or above the quantile's position.
    position = HIGH_QUANTILE * (len(ranked) - 1)
    assert demand.high_req_per_min == ranked[int(-(-position // 1))]


def test_quiet_minutes_count_as_zero_and_groups_share_the_minutes() -> None:
    # Minute 1 holds 3 chat arrivals, minute 2 none, minute 3 one batch arrival; minutes 0 and
    # 4 are the data's edges.
    offsets = [5.0, 61.0, 62.0, 63.0, 185.0, 250.0]
    frame = requests(offsets).with_columns(
        pool=pl.Series(["chat", "chat", "chat", "chat", "batch", "chat"])
    )
    demand = observed_demand(frame)
    assert demand is not None
    assert (demand.minutes, demand.peak_req_per_min) == (3, 3.0)
    assert demand.mean_req_per_min == pytest.approx(4 / 3)
    assert demand.window_start == T0 + timedelta(minutes=1)
    assert demand.window_end == T0 + timedelta(minutes=4)
    pools = {g.group: g for g in demand.groups if g.by == "pool"}
    assert (pools["chat"].peak_req_per_min, pools["chat"].mean_req_per_min) == (3.0, 1.0)
    assert (pools["batch"].peak_req_per_min, pools["batch"].mean_req_per_min) == (1.0, 1 / 3)
    assert demand.daily_shape == ((10, pytest.approx(4 / 3)),)


RATE = {
    "failure_unit": "host",
    "demand": {"req_per_min": "observed", "growth_ratio": 1.5},
    "replica": {"capacity_req_per_min": 40},
    "placement": {"replicas_per_host": 2, "zones": ["a", "b"]},
}


def test_an_observed_requirement_is_sized_on_the_peak_minute_times_growth() -> None:
    requirement = parse_requirement(RATE, where="r.toml")
    assert isinstance(requirement.demand, RateDemand)
    assert requirement.demand.peak_req_per_min is None
    # 80 arrivals in each of minutes 1-3: a steady 80 req/min peak, x 1.5 growth = 120.
    offsets = [0.0] + [60 + i * 0.75 for i in range(240)] + [245.0]
    demand = observed_demand(requests(offsets))
    assert demand is not None
    record = recommend(requirement, now=NOW, observed=demand)
    document = record.to_json()
    assert document["failure_table"]["demand"] == pytest.approx(120)
    peak = next(i for i in document["inputs"] if i["path"] == "demand.peak_req_per_min")
    assert (peak["kind"], peak["value"]) == ("measured", 80)
    assert document["observed_demand"]["peak_req_per_min"] == 80
    assert document["recommendation"]["hosts"] == 3  # seed 000's exercise at 120 req/min
    assert "demand.peak_req_per_min is the observed peak minute, 80 req/min" in record.notes[0]
    assert "- observed demand: peak minute 80 req/min" in record.to_markdown()


def test_a_stated_demand_is_kept_with_the_observed_one_beside_it() -> None:
    stated = {**RATE, "demand": {"req_per_min": 120}}
    requirement = parse_requirement(stated, where="r.toml")
    demand = observed_demand(requests([0.0, 70.0, 130.0, 190.0, 250.0]))
    assert demand is not None
    kept, note = with_observed_demand(requirement, demand)
    assert kept == requirement
    assert note.startswith("demand stated as 120 req/min is kept; the observed peak minute was 1")


def test_observed_demand_without_a_store_is_a_clear_error() -> None:
    requirement = parse_requirement(RATE, where="r.toml")
    with pytest.raises(RequirementError, match=r'demand\.req_per_min is "observed", but no traced'):
        recommend(requirement, now=NOW)


def test_the_autoscaled_cost_follows_the_observed_daily_shape() -> None:
    # 80 req/min through the 10:00 hour, 20 req/min through the 11:00 hour; one replica may be
    # lost: 80 needs 2 + 1 replicas, 20 needs 1 + 1, so the fleet averages 2.5 replicas.
    offsets = [i * 0.75 for i in range(4800)] + [3600 + i * 3.0 for i in range(1200)]
    demand = observed_demand(requests(offsets))
    assert demand is not None
    assert [hour for hour, _ in demand.daily_shape] == [10, 11]
    data = {
        **RATE,
        "failure_unit": "replica",
        "demand": {"req_per_min": "observed"},
        "placement": {"replicas_per_host": 1, "zones": ["a", "b"]},
        "cost": {"usd_per_gpu_hour": 2.0},
    }
    record = recommend(parse_requirement(data, where="r.toml"), now=NOW, observed=demand)
    cost = record.to_json()["recommendation"]["cost"]
    assert record.to_json()["recommendation"]["replicas"] == 3
    assert cost["usd_per_month"]["value"] == pytest.approx(3 * 2.0 * 730)
    assert cost["autoscaled_usd_per_month"]["value"] == pytest.approx(2.5 * 2.0 * 730)
    assert cost["autoscaled_usd_per_month"]["source"].startswith(
        "derived: 2.5 replicas on average over 2 observed hours"
    )
    assert "- autoscaled to the observed day: $3,650" in record.to_markdown()
    # Output tokens at the demand come from the observed tokens per request.
    per_request = demand.output_tokens_per_request
    assert per_request is not None
    assert cost["usd_per_million_output_tokens"]["value"] == pytest.approx(
        3 * 2.0 / (80 / 60 * per_request * 3600 / 1e6)
    )
