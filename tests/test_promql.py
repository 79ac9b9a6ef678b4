"""PromQL-exact histogram_quantile, rate and increase, held against Prometheus 2.42 itself.

Three layers: hand-computed tables; properties (frame forms agree with the scalar forms,
brute-force counter arithmetic, scale invariance); and a real Prometheus 2.42 on 127.0.0.1 as
the oracle for hypothesis-generated histograms and counter series (tests/promql_oracle.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

import polars as pl
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from servewatch.pipeline.promql import (
    histogram_quantile,
    histogram_quantile_frame,
    increase,
    increase_frame,
    rate,
    rate_frame,
    to_milliseconds,
)
from tests.conftest import require_program
from tests.promql_oracle import PrometheusOracle, Series, le_labels

INF, NAN = math.inf, math.nan
Bucket = tuple[float, float]
Sample = tuple[float, float]
# Remote-written samples must stay within an hour of the newest one the head holds.
T0_MS = 1_700_000_000_000


def same(got: float | None, want: float | None, *, rel: float = 1e-9) -> bool:
    """Equal, both NaN, or within `rel` relative; None only matches None."""
    if got is None or want is None:
        return got is want
    if math.isnan(got) or math.isnan(want):
        return math.isnan(got) and math.isnan(want)
    if got == want:
        return True
    if math.isinf(got) or math.isinf(want):
        return False
    return abs(got - want) <= rel * max(abs(got), abs(want))


# -- histogram_quantile: hand-computed ---------------------------------------------------------

SIMPLE: list[Bucket] = [(1.0, 1.0), (2.0, 3.0), (INF, 4.0)]


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # q alone decides, whatever the buckets (even none, even without +Inf)
        (NAN, SIMPLE, NAN),
        (-0.1, SIMPLE, -INF),
        (-INF, [], -INF),
        (1.1, [(1.0, 1.0)], INF),
        (INF, SIMPLE, INF),
        # shape rules
        (0.5, [], NAN),
        (0.5, [(1.0, 1.0), (2.0, 3.0)], NAN),  # highest bound is not +Inf
        (0.5, [(INF, 4.0)], NAN),  # fewer than two buckets
        (0.5, [(INF, 4.0), (INF, 1.0)], NAN),  # two, but one after merging
        (0.5, [(1.0, 0.0), (INF, 0.0)], NAN),  # no observations
        # interpolation, with rank = q times the total of 4
        (0.5, SIMPLE, 1.5),  # rank 2 in (1, 2]: 1 + 1 * (2 - 1) / (3 - 1)
        (0.1, SIMPLE, 0.4),  # first bucket starts at 0: 0 + 1 * 0.4 / 1
        (0.25, SIMPLE, 1.0),
        (0.75, SIMPLE, 2.0),  # rank 3 is reached exactly at le=2
        (0.9, SIMPLE, 2.0),  # rank in the +Inf bucket: the second-highest bound
        (1.0, SIMPLE, 2.0),
        (0.0, SIMPLE, 0.0),  # rank 0 in the first bucket: 0 + 1 * 0 / 1
        (0.5, [(INF, 4.0), (2.0, 3.0), (1.0, 1.0)], 1.5),  # any input order
        # a first bound <= 0 is returned as is; later buckets interpolate from their left
        (0.1, [(-1.0, 2.0), (0.0, 3.0), (INF, 10.0)], -1.0),
        (0.4, [(-2.0, 2.0), (-1.0, 6.0), (INF, 10.0)], -1.5),
        (0.25, [(-1.0, 2.0), (1.0, 6.0), (INF, 10.0)], -0.75),
        # equal bounds are merged by summing: (1, 2), (2, 3), (+Inf, 4)
        (0.5, [(1.0, 1.0), (1.0, 1.0), (2.0, 3.0), (INF, 4.0)], 1.0),
        (0.5, [(0.0, 1.0), (-0.0, 1.0), (2.0, 3.0), (INF, 4.0)], 0.0),
        # counts below the running maximum are raised to it: 3, 3, 4
        (0.5, [(1.0, 3.0), (2.0, 1.0), (INF, 4.0)], 2.0 / 3.0),
        # 0/0 inside the bucket is NaN, not an exception
        (0.0, [(1.0, 0.0), (2.0, 5.0), (INF, 10.0)], NAN),
        # an infinite total makes rank infinite: the search ends in the +Inf bucket
        (0.5, [(1.0, 1.0), (2.0, 2.0), (INF, INF)], 2.0),
        # NaN bounds stay where they are in the input order (Go's sort with `<`)
        (0.1, [(1.0, 5.0), (NAN, 7.0), (INF, 10.0)], 0.2),
        (0.1, [(NAN, 7.0), (1.0, 5.0), (INF, 10.0)], NAN),
        (0.95, [(NAN, 7.0), (1.0, 5.0), (INF, 10.0)], 1.0),
        (0.5, [(1.0, 5.0), (INF, 10.0), (NAN, 7.0)], NAN),  # the last bound is NaN
        # a NaN first count switches the monotonic fix off, and the binary search then
        # passes over le=2 although its count reaches the rank 5
        (0.5, [(1.0, NAN), (2.0, 9.0), (3.0, 1.0), (4.0, 2.0), (INF, 10.0)], 4.0),
        (0.5, [(1.0, NAN), (2.0, 1.0), (3.0, 7.0), (INF, 8.0)], 2.5),
    ],
)
def test_histogram_quantile_table(q: float, buckets: list[Bucket], expected: float) -> None:
    assert same(histogram_quantile(q, buckets), expected, rel=1e-15)


@pytest.mark.parametrize(
    ("q", "buckets", "message"),
    [
        (0.5, [(1.0,)], "histogram bucket 0"),
        (0.5, [(1.0, 1.0), ("x", 1.0)], "histogram bucket 1"),
        (0.5, [(INF, 1.0), None], "histogram bucket 1"),
        (0.5, [(1.0, 2.0, 3.0)], "(upper_bound, cumulative_count)"),
        ("high", SIMPLE, "q must be a number"),
    ],
)
def test_histogram_quantile_rejects_bad_input(q: object, buckets: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        histogram_quantile(q, buckets)  # type: ignore[arg-type]


def test_histogram_quantile_frame_groups_and_nulls() -> None:
    lf = pl.LazyFrame(
        {
            "pool": ["a", "a", "a", None, None, None, "b"],
            "le": [1.0, 2.0, INF, 0.1, 0.2, INF, None],
            "count": [1.0, 3.0, 4.0, 2.0, 2.0, None, 1.0],
        }
    )
    out = histogram_quantile_frame(lf, q=0.5, by=["pool"]).collect()
    assert out["pool"].to_list() == ["a", None]
    assert out["quantile"][0] == 1.5
    assert math.isnan(out["quantile"][1])  # its +Inf row has a null count: ignored
    whole = histogram_quantile_frame(lf, q=0.5, by=[], value_column="p50_s").collect()
    assert whole.columns == ["p50_s"]
    expected = histogram_quantile(0.5, [(1.0, 1.0), (2.0, 3.0), (INF, 4.0), (0.1, 2.0)])
    assert same(whole["p50_s"][0], expected)


def test_histogram_quantile_frame_special_q_and_empty_input() -> None:
    lf = pl.LazyFrame({"g": [1, 1, 2], "le": [1.0, INF, 5.0], "count": [1.0, 2.0, 3.0]})
    out = histogram_quantile_frame(lf, q=-1.0, by=["g"]).collect()
    assert out["quantile"].to_list() == [-INF, -INF]
    empty = lf.filter(pl.col("g") > 5)
    assert histogram_quantile_frame(empty, q=0.5, by=["g"]).collect().height == 0


def test_histogram_quantile_frame_rejects_text_bounds() -> None:
    lf = pl.LazyFrame({"le": ["1", "+Inf"], "count": [1.0, 2.0]})
    with pytest.raises(ValueError, match="column 'le' holds String"):
        histogram_quantile_frame(lf, q=0.5, by=[])


# -- rate and increase: hand-computed ----------------------------------------------------------

RESET: list[Sample] = [(0.0, 0.0), (15.0, 10.0), (30.0, 20.0), (45.0, 5.0), (60.0, 15.0)]


@pytest.mark.parametrize(
    ("samples", "start_s", "end_s", "expected"),
    [
        ([], 0.0, 60.0, None),
        ([(10.0, 1.0)], 0.0, 60.0, None),
        ([(10.0, 1.0), (70.0, 5.0)], 0.0, 60.0, None),  # one sample in the window
        # samples on both (inclusive) edges: no extrapolation, a reset adds what was lost
        (RESET, 0.0, 60.0, 35.0),
        (list(reversed(RESET)), 0.0, 60.0, 35.0),
        # edges within 1.1 average intervals: extrapolate all the way, 30 * 50 / 30
        ([(10.0, 10.0), (20.0, 20.0), (30.0, 30.0), (40.0, 40.0)], 0.0, 50.0, 50.0),
        # ... but not back past the counter's zero point (5 s before the first sample)
        ([(10.0, 5.0), (20.0, 15.0), (30.0, 25.0), (40.0, 35.0)], 0.0, 50.0, 45.0),
        # edges farther than 1.1 intervals: half an interval each side, 10 * 20 / 10
        ([(30.0, 100.0), (40.0, 110.0)], 0.0, 60.0, 20.0),
        # a counter starting at 0 is never extrapolated backwards
        ([(30.0, 0.0), (40.0, 10.0)], 25.0, 45.0, 15.0),
        # equal timestamps: the first sample given wins, as Prometheus drops the duplicate
        ([(0.0, 0.0), (30.0, 10.0), (30.0, 99.0), (60.0, 20.0)], 0.0, 60.0, 20.0),
        # timestamps are milliseconds: 60.0004 is 60.000 and inside the window
        ([(0.0, 0.0), (60.0004, 6.0)], 0.0, 60.0, 6.0),
        # a NaN sample poisons the result, as in Prometheus
        ([(0.0, 0.0), (30.0, NAN), (60.0, 20.0)], 0.0, 60.0, 20.0),
        ([(0.0, NAN), (60.0, 20.0)], 0.0, 60.0, NAN),
    ],
)
def test_increase_table(
    samples: list[Sample], start_s: float, end_s: float, expected: float | None
) -> None:
    got = increase(samples, range_start_s=start_s, range_end_s=end_s)
    assert same(got, expected, rel=1e-15)


def test_rate_divides_by_the_range_where_prometheus_does() -> None:
    samples = [(30.0, 100.0), (40.0, 110.0)]
    assert rate(samples, range_start_s=0.0, range_end_s=60.0) == 10.0 * ((20.0 / 10.0) / 60.0)
    assert rate(RESET, range_start_s=0.0, range_end_s=60.0) == 35.0 * (1.0 / 60.0)
    assert rate(RESET[:1], range_start_s=0.0, range_end_s=60.0) is None


@pytest.mark.parametrize(
    ("samples", "start_s", "end_s", "message"),
    [
        (RESET, 60.0, 60.0, "must be at least 1 ms after"),
        (RESET, 60.0, 0.0, "must be at least 1 ms after"),
        (RESET, NAN, 60.0, "must be finite"),
        ([(0.0, 1.0), (1.0,)], 0.0, 60.0, "counter sample 1"),
        ([(NAN, 1.0)], 0.0, 60.0, "counter sample 0"),
        ([(INF, 1.0)], 0.0, 60.0, "finite timestamp"),
        ([(0.0, "lots")], 0.0, 60.0, "counter sample 0"),
    ],
)
def test_increase_rejects_bad_input(
    samples: list[Sample], start_s: float, end_s: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        increase(samples, range_start_s=start_s, range_end_s=end_s)


@pytest.mark.parametrize(
    ("seconds", "ms"),
    [(0.0, 0), (1.0006, 1001), (1.0004, 1000), (-0.0006, -1), (1.7e9, 1_700_000_000_000)],
)
def test_to_milliseconds_rounds_to_nearest(seconds: float, ms: int) -> None:
    assert to_milliseconds(seconds) == ms


def test_increase_frame_takes_datetimes_and_matches_the_scalar() -> None:
    base = datetime(2026, 11, 18, 10, 0, 0, tzinfo=UTC).replace(tzinfo=None)
    base_s = base.replace(tzinfo=UTC).timestamp()
    lf = pl.LazyFrame(
        {
            "series_id": [7] * len(RESET),
            "ts": [datetime.fromtimestamp(base_s + t, UTC).replace(tzinfo=None) for t, _ in RESET],
            "value": [v for _, v in RESET],
        }
    )
    ends = [base_s + 60.0, base_s + 75.0, base_s + 500.0]
    out = increase_frame(lf, range_s=60.0, window_ends_s=ends).collect()
    assert out.columns == ["series_id", "window_end_s", "increase"]
    assert out["window_end_s"].to_list() == ends[:2]
    shifted = [(base_s + t, v) for t, v in RESET]
    for end_s, got in zip(ends, out["increase"], strict=False):
        assert got == increase(shifted, range_start_s=end_s - 60.0, range_end_s=end_s)
    rates = rate_frame(lf, range_s=60.0, window_ends_s=ends).collect()
    assert rates["rate"][0] == rate(shifted, range_start_s=ends[0] - 60, range_end_s=ends[0])


def test_increase_frame_rejects_bad_arguments() -> None:
    lf = pl.LazyFrame({"series_id": [1], "ts": ["noon"], "value": [1.0]})
    with pytest.raises(ValueError, match="column 'ts' holds String"):
        increase_frame(lf, range_s=60.0, window_ends_s=[0.0])
    with pytest.raises(ValueError, match=r"range_s must be at least 0\.001"):
        increase_frame(lf, range_s=0.0, window_ends_s=[0.0])


# -- strategies --------------------------------------------------------------------------------

NICE_BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 0.0, -0.0, -1.0]
finite_bounds = st.one_of(
    st.sampled_from(NICE_BOUNDS),
    st.integers(-5, 20).map(float),
    st.floats(allow_nan=False, allow_infinity=False),
)
any_bounds = st.one_of(
    finite_bounds, finite_bounds, st.sampled_from([INF, INF, -INF, NAN]), st.floats()
)
any_counts = st.one_of(
    st.integers(0, 100).map(float),
    st.sampled_from([0.0, -0.0, NAN, INF, -INF, 1e300]),
    st.floats(),
)


@st.composite
def well_formed_histograms(draw: st.DrawFn) -> list[Bucket]:
    """Distinct sorted bounds with +Inf and cumulative counts, then perturbed and shuffled."""
    bounds = sorted(set(draw(st.lists(finite_bounds, max_size=15))))
    steps = draw(st.lists(st.integers(0, 50), min_size=len(bounds) + 1, max_size=len(bounds) + 1))
    counts = [float(sum(steps[: i + 1])) for i in range(len(steps))]
    buckets = list(zip([*bounds, INF], counts, strict=True))
    edits = draw(st.lists(st.tuples(st.integers(0, 40), any_bounds, any_counts), max_size=3))
    for position, bound, count in edits:
        if position % 3 == 0:
            buckets.append((bound, count))  # an extra, possibly duplicate or odd, bucket
        else:
            index = position % len(buckets)
            buckets[index] = (buckets[index][0], count)  # a broken count
    return draw(st.permutations(buckets))


def _at_most_eight_nans(buckets: list[Bucket]) -> bool:
    # Go reads "nan" in any letter case and nothing else as NaN: eight distinct spellings.
    return sum(math.isnan(bound) for bound, _ in buckets) <= 8


histograms = st.one_of(
    well_formed_histograms(),
    st.lists(st.tuples(any_bounds, any_counts), max_size=6),
    st.lists(st.tuples(any_bounds, any_counts), min_size=13, max_size=40),
).filter(_at_most_eight_nans)
quantiles = st.one_of(
    st.floats(0.0, 1.0),
    st.sampled_from([0.0, 1.0, 0.5, 0.9, 0.99, NAN, -0.5, 1.5, INF, -INF, -0.0]),
    st.floats(),
)


# -- properties --------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(histograms, min_size=1, max_size=6), q=quantiles)
def test_histogram_quantile_frame_agrees_with_the_scalar(
    cases: list[list[Bucket]], q: float
) -> None:
    rows = [(g, bound, count) for g, case in enumerate(cases) for bound, count in case]
    lf = pl.LazyFrame(
        {
            "g": [g for g, _, _ in rows],
            "le": [bound for _, bound, _ in rows],
            "count": [count for _, _, count in rows],
        },
        schema={"g": pl.Int64, "le": pl.Float64, "count": pl.Float64},
    )
    out = histogram_quantile_frame(lf, q=q, by=["g"]).collect()
    assert out["g"].to_list() == [g for g, case in enumerate(cases) if case]
    for g, got in out.iter_rows():
        want = histogram_quantile(q, cases[g])
        assert same(got, want), (cases[g], q, got, want)


def _scales_exactly(count: float) -> bool:
    return not math.isfinite(count) or count == 0 or 1e-280 <= abs(count) <= 1e280


@given(
    buckets=well_formed_histograms(),
    q=st.one_of(st.just(0.0), st.floats(1e-10, 1.0)),
    power=st.integers(-20, 20),
)
def test_scaling_all_counts_leaves_the_quantile_unchanged(
    buckets: list[Bucket], q: float, power: int
) -> None:
    # A power of two scales exactly, so the answer must not move at all; far from overflow
    # and from subnormal ranks, that is (q = 5e-324 times 0.5 is 0, not a smaller rank).
    assume(all(_scales_exactly(count) for _, count in buckets))
    scaled = [(bound, count * 2.0**power) for bound, count in buckets]
    assert same(histogram_quantile(q, scaled), histogram_quantile(q, buckets), rel=0.0)


@st.composite
def counter_series(draw: st.DrawFn, *, max_samples: int = 25) -> list[tuple[int, float]]:
    """(ts_ms, value) of a counter: irregular intervals, increments, resets, rare oddities."""
    ts_ms = draw(st.integers(0, 60_000))
    value = draw(st.sampled_from([0.0, 0.0, 3.0, 1000.0]))
    samples = []
    for _ in range(draw(st.integers(0, max_samples))):
        samples.append((ts_ms, value))
        ts_ms += draw(st.sampled_from([1, 999, 5_000, 15_000, 15_000, 15_001, 30_000, 61_000]))
        step = draw(
            st.one_of(
                st.sampled_from([0.0, 1.0, 2.5, 100.0]),
                st.floats(0.0, 1e6),
                st.just(-1.0),  # marks a reset below
            )
        )
        value = draw(st.floats(0.0, 50.0)) if step < 0 else value + step
        if draw(st.integers(0, 60)) == 0:
            value = draw(st.sampled_from([NAN, -5.0, INF]))
    return samples


def brute_force_increase(values: Sequence[float]) -> float:
    """What a counter counted across samples: each rise, and after a reset the new value."""
    total = 0.0
    for previous, current in itertools.pairwise(values):
        total += current - previous if current >= previous else current
    return total


@given(series=counter_series())
def test_increase_without_extrapolation_is_the_counted_total(
    series: list[tuple[int, float]],
) -> None:
    if len(series) < 2 or any(not math.isfinite(v) or v < 0 for _, v in series):
        return
    samples = [(ts_ms / 1000, v) for ts_ms, v in series]
    # Window edges on the first and last sample: Prometheus does not extrapolate.
    got = increase(samples, range_start_s=samples[0][0], range_end_s=samples[-1][0])
    assert got is not None
    want = brute_force_increase([v for _, v in series])
    assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    all_series=st.lists(counter_series(), min_size=1, max_size=4),
    duplicates=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30), st.floats()), max_size=3),
    range_ms=st.sampled_from([1_000, 30_000, 60_000, 90_500, 300_000]),
    ends_ms=st.lists(st.integers(0, 900_000), min_size=1, max_size=12),
)
def test_rate_frames_agree_with_the_scalars(
    all_series: list[list[tuple[int, float]]],
    duplicates: list[tuple[int, int, float]],
    range_ms: int,
    ends_ms: list[int],
) -> None:
    rows = [(sid, ts_ms, v) for sid, series in enumerate(all_series) for ts_ms, v in series]
    for sid, position, value in duplicates:
        series = all_series[sid % len(all_series)]
        if series:  # a second sample on an existing timestamp: the first one must win
            rows.append((sid % len(all_series), series[position % len(series)][0], value))
    lf = pl.LazyFrame(
        {
            "series_id": [sid for sid, _, _ in rows],
            "ts": [ts_ms / 1000 for _, ts_ms, _ in rows],
            "value": [v for _, _, v in rows],
        },
        schema={"series_id": pl.Int64, "ts": pl.Float64, "value": pl.Float64},
    )
    ends_s = [end / 1000 for end in ends_ms]
    range_s = range_ms / 1000
    for frame_form, scalar_form, column in (
        (increase_frame, increase, "increase"),
        (rate_frame, rate, "rate"),
    ):
        out = frame_form(lf, range_s=range_s, window_ends_s=ends_s).collect()
        got = {(sid, to_milliseconds(end)): v for sid, end, v in out.iter_rows()}
        assert len(got) == out.height
        for sid in range(len(all_series)):
            samples = [(ts_ms / 1000, v) for s, ts_ms, v in rows if s == sid]
            for end_ms in set(ends_ms):
                want = scalar_form(
                    samples, range_start_s=(end_ms - range_ms) / 1000, range_end_s=end_ms / 1000
                )
                # Bit for bit: the frame form must round exactly as the scalar (and Prometheus).
                assert same(got.get((sid, end_ms)), want, rel=0.0), (column, sid, end_ms)


# -- Prometheus 2.42 as the oracle -------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusOracle]:
    binary = require_program("prometheus")
    oracle = PrometheusOracle.start(binary, tmp_path_factory.mktemp("prometheus"))
    try:
        yield oracle
    finally:
        oracle.stop()


def promql_number(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Inf" if x > 0 else "-Inf"
    return repr(x)


# Found by search: with Go 1.19's pdqsort (and only with it) the NaN bound lands where
# Prometheus puts it; insertion sort alone, or a later Go's xorshift, would answer otherwise.
PDQSORT_SENSITIVE: list[Bucket] = [
    (1.0, 4.0), (3.0, 8.0), (1.0, 3.0), (3.0, 3.0), (INF, 8.0), (2.0, 6.0), (NAN, 2.0),
    (INF, 1.0), (1.0, 0.0), (INF, 1.0), (3.0, 5.0), (1.0, 8.0), (2.0, 1.0), (3.0, 1.0),
]  # fmt: skip


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(histograms, min_size=1, max_size=5), q=quantiles)
@example(cases=[PDQSORT_SENSITIVE], q=0.5)
@example(
    cases=[[(1.0, 5.0), (NAN, 7.0), (INF, 10.0)], [(-0.0, 1.0), (0.0, 2.0), (INF, 3.0)]], q=0.1
)
def test_histogram_quantile_matches_prometheus(
    prometheus: PrometheusOracle, cases: list[list[Bucket]], q: float
) -> None:
    run = prometheus.new_run()
    series: list[Series] = []
    in_series_order: list[list[Bucket]] = []
    for number, case in enumerate(cases):
        labelled = list(zip(le_labels([bound for bound, _ in case]), case, strict=True))
        # Prometheus hands histogram_quantile the buckets in label order of their series.
        in_series_order.append([bucket for _, bucket in sorted(labelled, key=lambda x: x[0])])
        series.extend(
            Series(
                {"__name__": "h_bucket", "run": run, "case": str(number), "le": le},
                [(T0_MS, count)],
            )
            for le, (_, count) in labelled
        )
    prometheus.write(series)
    expr = f'histogram_quantile({promql_number(q)}, h_bucket{{run="{run}"}})'
    got = {labels["case"]: value for labels, value in prometheus.query(expr, at_ms=T0_MS)}
    assert set(got) == {str(number) for number, case in enumerate(cases) if case}
    for number, buckets in enumerate(in_series_order):
        if buckets:
            want = histogram_quantile(q, buckets)
            assert same(got[str(number)], want), (buckets, q, got[str(number)], want)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    all_series=st.lists(counter_series(max_samples=40), min_size=1, max_size=4),
    range_ms=st.sampled_from([1_000, 30_000, 60_000, 90_500, 300_000]),
    step_ms=st.sampled_from([1_000, 7_300, 15_000, 60_000]),
)
def test_rate_and_increase_match_prometheus(
    prometheus: PrometheusOracle,
    all_series: list[list[tuple[int, float]]],
    range_ms: int,
    step_ms: int,
) -> None:
    run = prometheus.new_run()
    prometheus.write(
        [
            Series(
                {"__name__": "c_total", "run": run, "s": str(sid)},
                [(T0_MS + ts_ms, v) for ts_ms, v in series],
            )
            for sid, series in enumerate(all_series)
            if series
        ]
    )
    end_ms = max((ts_ms for series in all_series for ts_ms, _ in series), default=0) + 60_000
    for name, scalar_form in (("increase", increase), ("rate", rate)):
        results = prometheus.query_range(
            f'{name}(c_total{{run="{run}"}}[{range_ms}ms])',
            start_ms=T0_MS,
            end_ms=T0_MS + end_ms,
            step_ms=step_ms,
        )
        got = {labels["s"]: values for labels, values in results}
        for sid, series in enumerate(all_series):
            samples = [((T0_MS + ts_ms) / 1000, v) for ts_ms, v in series]
            for at_ms in range(T0_MS, T0_MS + end_ms + 1, step_ms):
                want = scalar_form(
                    samples, range_start_s=(at_ms - range_ms) / 1000, range_end_s=at_ms / 1000
                )
                theirs = got.get(str(sid), {}).get(at_ms)
                assert same(theirs, want), (name, series, range_ms, at_ms, theirs, want)
