"""Capacity fit on synthetic fleets with a known knee: found when observed, flagged when not."""

from __future__ import annotations

import math
import random

import polars as pl
import pytest

from servewatch.capacity.capacity_fit import (
    CapacityFit,
    FitSpec,
    LoadUnit,
    bootstrap_resamples,
    capacity_figure,
    fit_capacity,
    least_squares,
    with_knee,
)
from servewatch.capacity.figure import SourceKind


def synthetic_windows(
    *,
    knee_load: float,
    load_low: float,
    load_high: float,
    limit_s: float,
    base_s: float = 0.02,
    noise_s: float = 0.003,
    replicas: int = 3,
    windows: int = 120,
    seed: int = 1,
    load_column: str = "load",
) -> pl.LazyFrame:
    """Per-replica windows whose p95 latency rises linearly to `limit_s` at `knee_load`."""
    rng = random.Random(seed)
    slope = (limit_s - base_s) / knee_load
    rows = []
    for replica in range(replicas):
        for _ in range(windows):
            load = rng.uniform(load_low, load_high)
            rows.append(
                {
                    "replica": f"vllm-{replica}",
                    load_column: load,
                    "latency_p95_s": base_s + slope * load + rng.gauss(0.0, noise_s),
                }
            )
    return pl.LazyFrame(rows)


def fit(frame: pl.LazyFrame, *, unit: LoadUnit = LoadUnit.REQ_PER_S, seed: int = 7) -> object:
    return fit_capacity(
        frame, spec=FitSpec(latency_limit_s=0.05, load_unit=unit, seed=seed), data="synthetic"
    )


@pytest.mark.parametrize(
    ("knee", "low", "high", "noise"),
    [
        (60.0, 1.0, 80.0, 0.003),  # knee inside the data
        (12.0, 0.5, 15.0, 0.004),  # small replica
        (100.0, 20.0, 110.0, 0.006),  # noisy, knee near the top of the data
    ],
)
def test_observed_knee_is_found_within_15_percent(
    knee: float, low: float, high: float, noise: float
) -> None:
    result = fit_capacity(
        synthetic_windows(
            knee_load=knee, load_low=low, load_high=high, limit_s=0.05, noise_s=noise
        ),
        spec=FitSpec(latency_limit_s=0.05, load_unit=LoadUnit.REQ_PER_S, seed=11),
        data="synthetic",
    )
    assert result.knee_load == pytest.approx(knee, rel=0.15)
    assert not result.extrapolated
    assert result.knee_low_load <= result.knee_load <= result.knee_high_load
    assert result.knee_low_load <= knee * 1.15
    assert result.replicas == 3
    assert "lies within the observed load" in result.summary()


@pytest.mark.parametrize("fraction", [0.2, 0.35, 0.49])
def test_knee_beyond_half_the_observed_load_is_extrapolated(fraction: float) -> None:
    knee = 80.0
    result = fit_capacity(
        synthetic_windows(knee_load=knee, load_low=0.5, load_high=knee * fraction, limit_s=0.05),
        spec=FitSpec(latency_limit_s=0.05, load_unit=LoadUnit.REQ_PER_S, seed=3),
        data="synthetic",
    )
    assert result.extrapolated
    assert result.extrapolation_ratio > 1.9
    assert f"is extrapolated: {result.extrapolation_ratio:.1f}x" in result.summary()
    figure = capacity_figure(result)
    # The only load the data shows meeting the SLO is the highest observed one.
    assert figure.low == pytest.approx(min(result.knee_low_load, result.load_max) * 60)
    assert "extrapolated" in figure.source


def test_bootstrap_is_reproducible_with_the_injected_seed() -> None:
    frame = synthetic_windows(knee_load=50, load_low=1, load_high=60, limit_s=0.05)
    spec = FitSpec(latency_limit_s=0.05, load_unit=LoadUnit.REQ_PER_S, seed=5)
    first = fit_capacity(frame, spec=spec, data="a")
    again = fit_capacity(frame, spec=spec, data="a")
    other = fit_capacity(
        frame, spec=FitSpec(latency_limit_s=0.05, load_unit=LoadUnit.REQ_PER_S, seed=6), data="a"
    )
    assert (first.knee_low_load, first.knee_high_load) == (
        again.knee_low_load,
        again.knee_high_load,
    )
    assert (first.knee_low_load, first.knee_high_load) != (
        other.knee_low_load,
        other.knee_high_load,
    )
    assert first.knee_load == other.knee_load


def test_running_batch_knee_becomes_decode_tokens_per_s() -> None:
    result = fit_capacity(
        synthetic_windows(knee_load=95, load_low=5, load_high=120, limit_s=0.05, noise_s=0.001),
        spec=FitSpec(latency_limit_s=0.05, load_unit=LoadUnit.RUNNING_BATCH, seed=2),
        data="synthetic",
    )
    figure = capacity_figure(result)
    # 95 running requests each getting a token every 50 ms: 1,900 tokens/s
    assert figure.value == pytest.approx(1900, rel=0.05)
    assert figure.unit == "tokens/s"
    assert figure.kind is SourceKind.MEASURED


@pytest.mark.parametrize(
    ("intercept", "slope", "knee"),
    [
        (0.02, 0.001, 30.0),
        (0.06, 0.001, 0.0),  # over the limit at zero load: no capacity
        (0.02, 0.0, math.inf),  # flat: never reaches the limit
        (0.06, -0.001, 0.0),
    ],
)
def test_knee_of_a_line(intercept: float, slope: float, knee: float) -> None:
    lines = pl.LazyFrame({"intercept_s": [intercept], "slope_s_per_load": [slope]})
    assert lines.pipe(with_knee, latency_limit_s=0.05).collect()["knee_load"][0] == pytest.approx(
        knee
    )


def test_least_squares_recovers_an_exact_line() -> None:
    points = pl.LazyFrame(
        {"replica": ["a", "a", "b", "b"], "load": [0.0, 1.0, 2.0, 3.0], "latency_s": [1, 3, 5, 7]}
    )
    row = points.pipe(least_squares).collect().row(0, named=True)
    assert (row["intercept_s"], row["slope_s_per_load"]) == pytest.approx((1.0, 2.0))
    assert (row["points"], row["replicas"], row["load_max"]) == (4, 2, 3.0)


def test_bootstrap_resamples_have_the_original_size() -> None:
    points = pl.LazyFrame({"replica": ["a"] * 5, "load": [1.0, 2, 3, 4, 5], "latency_s": [1.0] * 5})
    drawn = points.pipe(bootstrap_resamples, resamples=20, seed=1).collect()
    assert drawn.height == 100
    assert drawn.group_by("resample").len()["len"].to_list() == [5] * 20
    assert set(drawn["load"]) <= {1.0, 2.0, 3.0, 4.0, 5.0}


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (
            pl.LazyFrame({"replica": ["a", "a"], "load": [1.0, 2.0], "latency_p95_s": [0.1, 0.2]}),
            "2 usable windows",
        ),
        (
            pl.LazyFrame(
                {"replica": ["a"] * 4, "load": [3.0] * 4, "latency_p95_s": [0.01, 0.02, 0.03, 0.04]}
            ),
            "every window has load 3",
        ),
    ],
)
def test_unfittable_data_says_why(frame: pl.LazyFrame, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit(frame)


def test_null_and_non_finite_windows_are_skipped() -> None:
    frame = synthetic_windows(knee_load=60, load_low=1, load_high=80, limit_s=0.05).collect()
    dirty = pl.concat(
        [
            frame,
            pl.DataFrame(
                {"replica": ["x", "x"], "load": [None, float("nan")], "latency_p95_s": [1.0, 1.0]}
            ),
        ]
    ).lazy()
    result = fit_capacity(
        dirty,
        spec=FitSpec(latency_limit_s=0.05, load_unit=LoadUnit.REQ_PER_S, seed=1),
        data="synthetic",
    )
    assert result.points == frame.height


def test_flat_latency_bounds_no_capacity() -> None:
    frame = pl.LazyFrame(
        {"replica": ["a"] * 4, "load": [1.0, 2.0, 3.0, 4.0], "latency_p95_s": [0.02] * 4}
    )
    result = fit_capacity(
        frame,
        spec=FitSpec(latency_limit_s=0.05, load_unit=LoadUnit.REQ_PER_S, seed=1),
        data="flat",
    )
    assert math.isinf(result.knee_load)
    assert "no knee can be located" in result.summary()
    with pytest.raises(ValueError, match="bounds no capacity"):
        capacity_figure(result)


def test_a_fit_above_the_limit_at_every_load_bounds_no_capacity() -> None:
    fit = CapacityFit(
        latency_limit_s=0.5,
        load_unit=LoadUnit.REQ_PER_S,
        intercept_s=0.8,
        slope_s_per_load=0.1,
        knee_load=-3.0,
        knee_low_load=-4.0,
        knee_high_load=-2.0,
        confidence_ratio=0.9,
        points=30,
        replicas=3,
        load_min=0.1,
        load_max=1.0,
        data="synthetic",
    )
    with pytest.raises(ValueError, match=r"exceeds the 0\.5 s limit at every load"):
        capacity_figure(fit)
