"""Window sums, burn rates and budgets from minute counts, held against a brute-force oracle
(property tests) and against hand-worked cases (tables)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servewatch.slo.budget import budget_status, burn_rates_at
from servewatch.slo.burn_rate import window_sums_at, window_sums_every_minute
from servewatch.slo.spec import AvailabilitySli, GoodputSli, SloSpec, TokenGoodputSli
from servewatch.slo.windows import BurnWindow, Severity, default_burn_windows

T0 = datetime(2026, 11, 18, 0, 0)
WEEK_S = 7 * 86400
MINUTES_SCHEMA = {
    "minute_ts": pl.Datetime("us"),
    "slo": pl.String(),
    "replica": pl.String(),
    "good": pl.Int64(),
    "total": pl.Int64(),
}
SMALL_WINDOWS = (
    BurnWindow(Severity.PAGE, long_window_s=15 * 60, short_window_s=2 * 60, budget_ratio=0.02),
    BurnWindow(Severity.TICKET, long_window_s=60 * 60, short_window_s=5 * 60, budget_ratio=0.1),
)
SPECS = (
    SloSpec("a", AvailabilitySli(), 0.99, WEEK_S, SMALL_WINDOWS),
    SloSpec("b", AvailabilitySli(), 0.9, WEEK_S, SMALL_WINDOWS[:1], scope=(("replica", "r0"),)),
)

row_st = st.tuples(
    st.integers(min_value=0, max_value=180),  # minute offset
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["r0", "r1", None]),
    st.integers(min_value=0, max_value=50),  # bad
    st.integers(min_value=0, max_value=50),  # good
)


def minutes_frame(rows: list[tuple[int, str, str | None, int, int]]) -> pl.LazyFrame:
    return pl.LazyFrame(
        {
            "minute_ts": [T0 + timedelta(minutes=r[0]) for r in rows],
            "slo": [r[1] for r in rows],
            "replica": [r[2] for r in rows],
            "good": [r[4] for r in rows],
            "total": [r[3] + r[4] for r in rows],
        },
        schema=MINUTES_SCHEMA,
    )


def oracle(
    rows: list[tuple[int, str, str | None, int, int]], *, at_minute: int
) -> dict[tuple[str, int], tuple[int, int]]:
    """Sums by looping over every row for every (spec, window): obviously right, slow."""
    sums = {}
    for spec in SPECS:
        scope = dict(spec.scope)
        for length_s in spec.window_lengths_s():
            good = total = 0
            for minute, slo, replica, bad, good_n in rows:
                if slo != spec.name or ("replica" in scope and replica != scope["replica"]):
                    continue
                if at_minute - length_s // 60 <= minute < at_minute:
                    good += good_n
                    total += good_n + bad
            sums[(spec.name, length_s)] = (good, total)
    return sums


def as_dict(frame: pl.DataFrame) -> dict[tuple[str, int], tuple[int, int]]:
    return {(r["slo"], r["window_s"]): (r["good"], r["total"]) for r in frame.iter_rows(named=True)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(row_st, max_size=60),
    at_minute=st.integers(min_value=0, max_value=250),
    at_second=st.integers(min_value=0, max_value=59),
)
def test_window_sums_at_equal_the_oracle(
    rows: list[tuple[int, str, str | None, int, int]], at_minute: int, at_second: int
) -> None:
    at = T0 + timedelta(minutes=at_minute, seconds=at_second)  # inside a minute: floored
    frame = window_sums_at(minutes_frame(rows), specs=SPECS, at=at).collect()
    assert set(frame["at"]) == {T0 + timedelta(minutes=at_minute)}
    assert as_dict(frame) == oracle(rows, at_minute=at_minute)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(row_st, max_size=60),
    start=st.integers(min_value=0, max_value=200),
    length=st.integers(min_value=0, max_value=30),
)
def test_window_sums_every_minute_equal_the_oracle_at_each_minute(
    rows: list[tuple[int, str, str | None, int, int]], start: int, length: int
) -> None:
    frame = window_sums_every_minute(
        minutes_frame(rows),
        specs=SPECS,
        start=T0 + timedelta(minutes=start),
        end=T0 + timedelta(minutes=start + length),
    ).collect()
    for offset in range(start, start + length + 1):
        at_rows = frame.filter(pl.col("at") == T0 + timedelta(minutes=offset))
        assert as_dict(at_rows) == oracle(rows, at_minute=offset), offset
    assert frame.height == (length + 1) * sum(len(s.window_lengths_s()) for s in SPECS)


def test_scope_column_missing_is_named() -> None:
    frame = minutes_frame([(1, "b", "r0", 1, 1)]).drop("replica")
    with pytest.raises(
        ValueError,
        match=r"SLO b selects replica='r0', but the minute counts have no replica column",
    ):
        window_sums_at(frame, specs=SPECS, at=T0).collect()
    with pytest.raises(ValueError, match=r"minute counts lack column\(s\) good"):
        window_sums_at(frame.drop("good"), specs=SPECS[:1], at=T0).collect()


def test_window_ratio_is_traffic_weighted_not_a_mean_of_minute_ratios() -> None:
    # Minute 0: 1 of 1 request failed. Minute 1: 0 of 999 failed. Mean of ratios: 50 %.
    frame = minutes_frame([(0, "a", None, 1, 0), (1, "a", None, 0, 999)])
    rates = burn_rates_at(frame, specs=SPECS[:1], at=T0 + timedelta(minutes=2)).collect()
    five = rates.filter(pl.col("window_s") == 300).row(0, named=True)
    assert five["error_ratio"] == 1 / 1000
    assert five["burn_rate"] == pytest.approx(0.1)


def spec_30d(objective: float = 0.999) -> SloSpec:
    return SloSpec("a", AvailabilitySli(), objective, 30 * 86400, default_burn_windows())


def steady(minutes: int, *, bad: int, total: int) -> list[dict[str, Any]]:
    return [
        {"minute_ts": T0 + timedelta(minutes=m), "slo": "a", "good": total - bad, "total": total}
        for m in range(minutes)
    ]


BUDGET_CASES = [
    # (rows, expected: consumed, remaining, current burn, time to exhaustion)
    # no events: no data, not a full budget
    ("no traffic", [], None, None, None, None),
    ("an hour of traffic, all at burn 1", steady(60, bad=1, total=1000), 1.0, 0.0, 1.0, 0.0),
    (
        "burn 2 for an hour in 2 days of clean traffic",
        [
            *steady(60, bad=2, total=1000),
            {
                "minute_ts": T0 - timedelta(days=2),
                "slo": "a",
                "good": 2_880_000 - 60_000,
                "total": 2_880_000 - 60_000,
            },
        ],
        120 / (0.001 * 2_880_000),
        1 - 120 / (0.001 * 2_880_000),
        2.0,
        (1 - 120 / (0.001 * 2_880_000)) * 30 * 86400 / 2.0,
    ),
    ("overspent", steady(60, bad=50, total=1000), 50.0, -49.0, 50.0, 0.0),
]


@pytest.mark.parametrize(
    ("name", "rows", "consumed", "remaining", "burn", "exhaustion_s"),
    BUDGET_CASES,
    ids=[c[0] for c in BUDGET_CASES],
)
def test_budget_status_by_table(
    name: str,
    rows: list[dict[str, Any]],
    consumed: float | None,
    remaining: float | None,
    burn: float | None,
    exhaustion_s: float | None,
) -> None:
    frame = pl.LazyFrame(rows, schema={k: v for k, v in MINUTES_SCHEMA.items() if k != "replica"})
    (status,) = (
        budget_status(frame, specs=[spec_30d()], at=T0 + timedelta(minutes=60))
        .collect()
        .rows(named=True)
    )
    assert status["budget_consumed_ratio"] == (
        None if consumed is None else pytest.approx(consumed)
    )
    assert status["budget_remaining_ratio"] == (
        None if remaining is None else pytest.approx(remaining)
    )
    assert status["current_burn_rate"] == (None if burn is None else pytest.approx(burn))
    assert status["time_to_exhaustion_s"] == (
        None if exhaustion_s is None else pytest.approx(exhaustion_s, abs=1e-6)
    )
    assert status["allowed_bad"] == pytest.approx(0.001 * status["total"])


def test_budget_counts_only_the_rolling_period() -> None:
    rows = [
        {"minute_ts": T0 - timedelta(days=31), "slo": "a", "good": 0, "total": 1000},
        {"minute_ts": T0 - timedelta(days=29), "slo": "a", "good": 999, "total": 1000},
    ]
    frame = pl.LazyFrame(rows, schema={k: v for k, v in MINUTES_SCHEMA.items() if k != "replica"})
    (status,) = budget_status(frame, specs=[spec_30d()], at=T0).collect().rows(named=True)
    assert (status["good"], status["total"], status["bad"]) == (999, 1000, 1)
    assert status["current_burn_rate"] is None  # nothing in the last hour


def test_token_goodput_slos_sum_output_tokens_and_the_others_requests() -> None:
    specs = (
        SloSpec("requests", GoodputSli(ttft_s=0.5, tpot_s=0.05), 0.9, WEEK_S, SMALL_WINDOWS[:1]),
        SloSpec("tokens", TokenGoodputSli(ttft_s=0.5, tpot_s=0.05), 0.9, WEEK_S, SMALL_WINDOWS[:1]),
    )
    at = T0 + timedelta(minutes=10)
    minutes = pl.LazyFrame(
        {
            "minute_ts": [T0 + timedelta(minutes=m) for m in (8, 9, 8, 9)],
            "slo": ["requests", "requests", "tokens", "tokens"],
            "good": [3, 4, 3, 4],
            "total": [5, 5, 5, 5],
            "good_output_tokens": [300, 40, 300, 40],
            "output_tokens": [500, 400, 500, 400],
        }
    )
    sums = as_dict(window_sums_at(minutes, specs=specs, at=at).collect())
    short = SMALL_WINDOWS[0].short_window_s
    assert sums[("requests", short)] == (7, 10)
    assert sums[("tokens", short)] == (340, 900)
    with pytest.raises(ValueError, match="tokens count output tokens, but the minute counts"):
        window_sums_at(minutes.drop("output_tokens"), specs=specs, at=at).collect()
