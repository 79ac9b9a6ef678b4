"""Attainment knee, latency models and per-pool capacity on small hand-made inputs."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta

import polars as pl
import pytest

from servewatch.capacity.attainment_fit import (
    AttainmentSpec,
    LoadPoint,
    isotonic_knee,
    isotonic_steps,
)
from servewatch.capacity.latency_model import least_squares, resampled_least_squares
from servewatch.capacity.pool_capacity import CapacityMethod, pool_capacities, pool_capacity_figure

SPEC = AttainmentSpec(ttft_limit_s=1.0, tpot_limit_s=0.1, target_ratio=0.9, seed=3, resamples=50)
T0 = datetime(2027, 1, 1)


def test_isotonic_steps_pool_violators_and_weigh_by_requests() -> None:
    points = [LoadPoint(1.0, 90, 100), LoadPoint(2.0, 99, 100), LoadPoint(3.0, 10, 100)]
    assert isotonic_steps(points) == [(1.5, 0.945), (3.0, 0.1)]


def test_the_knee_is_where_the_fitted_attainment_crosses_the_target() -> None:
    points = [LoadPoint(1.0, 100, 100), LoadPoint(2.0, 95, 100), LoadPoint(3.0, 85, 100)]
    # 0.95 at 2 req/s, 0.85 at 3: the target 0.9 lies halfway.
    assert isotonic_knee(points, target_ratio=0.9) == pytest.approx(2.5)
    assert math.isinf(isotonic_knee(points[:2], target_ratio=0.9))
    assert isotonic_knee([LoadPoint(1.0, 10, 100)], target_ratio=0.9) == 0.0


def test_least_squares_recovers_a_plane() -> None:
    rows = [(x, z, 0.5 + 2.0 * x - 0.25 * z) for x in range(4) for z in range(3)]
    assert least_squares(rows) == pytest.approx((0.5, 2.0, -0.25))
    assert least_squares([(1.0, 2.0), (1.0, 3.0)]) is None  # no spread in x


@pytest.mark.parametrize("regressors", [1, 2])
def test_resampled_least_squares_fits_the_draws_least_squares_would(regressors: int) -> None:
    rng = random.Random(4)
    rows = [
        (*(rng.uniform(0, 10) for _ in range(regressors)), rng.uniform(0, 3)) for _ in range(200)
    ]
    rows.append((*[5.0] * regressors, 1.0))
    draws, again = random.Random(9), random.Random(9)
    resampled = resampled_least_squares(rows, draw=draws, resamples=20)
    for fitted in resampled:
        expected = least_squares(again.choices(rows, k=len(rows)))
        assert fitted == pytest.approx(expected, rel=1e-9)
    # No spread in x: every resample is singular.
    assert resampled_least_squares([(1.0, 2.0)] * 5, draw=draws, resamples=3) == [None] * 3


def requests(pool: str, replica: str, *, capacity_rps: float) -> list[dict[str, object]]:
    """A minute per load from 1 to 6 req/s; requests good while the load is below capacity."""
    rows: list[dict[str, object]] = []
    for minute in range(1, 40):
        rate = 1.0 + 5.0 * minute / 40
        arrivals = round(rate * 60)
        start = T0 + timedelta(minutes=minute)
        for i in range(arrivals):
            slow = rate > capacity_rps and i % 2 == 0
            rows.append(
                {
                    "replica": replica,
                    "pool": pool,
                    "arrival_ts": start + timedelta(seconds=i * 60 / arrivals),
                    "end_ts": start + timedelta(seconds=i * 60 / arrivals + 2),
                    "ok": True,
                    "ttft_s": 2.0 if slow else 0.2,
                    "decode_s": 1.0,
                    "e2e_s": 2.0,
                    "completion_tokens": 21,
                    "prompt_tokens": 500,
                }
            )
    return rows


def test_each_pool_gets_its_own_capacity_and_replica_fits() -> None:
    rows = [
        *requests("h100", "a-0", capacity_rps=4.0),
        *requests("h100", "a-1", capacity_rps=4.0),
        *requests("l4", "b-0", capacity_rps=2.0),
    ]
    frame = pl.LazyFrame(rows)
    pools, notes = pool_capacities(frame, spec=SPEC, data="hand-made")
    assert notes == ()
    by_name = {p.pool: p for p in pools}
    assert set(by_name) == {"h100", "l4"}
    assert by_name["h100"].knee_load == pytest.approx(4.0, rel=0.05)
    assert by_name["l4"].knee_load == pytest.approx(2.0, rel=0.05)
    assert by_name["h100"].method is CapacityMethod.ATTAINMENT
    assert by_name["h100"].replicas == 2
    assert [f.group for f in by_name["h100"].replica_fits] == ["replica a-0", "replica a-1"]
    figure = pool_capacity_figure(by_name["l4"], rate_form=False)
    # 20 decode tokens after the first of 21, per request: tokens/s = req/s x 21.
    assert figure.value == pytest.approx(by_name["l4"].knee_load * 21)
    assert figure.unit == "tokens/s"


def test_a_pool_never_seen_near_its_knee_is_extrapolated() -> None:
    rows = requests("h100", "a-0", capacity_rps=50.0)
    (pool,), _ = pool_capacities(pl.LazyFrame(rows), spec=SPEC, data="hand-made")
    assert pool.extrapolated
    assert pool.knee_low_load == pytest.approx(pool.load_max)
    # TTFT never rose with load, so no model bounds it either: the data bounds no capacity.
    assert pool.method is CapacityMethod.UNBOUNDED
    with pytest.raises(ValueError, match="bounds no capacity"):
        pool_capacity_figure(pool, rate_form=True)
