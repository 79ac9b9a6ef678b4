"""The engine fit from spans: the step-time terms of a known engine, and the windowed sample a
busy pool's day is fitted on."""

from __future__ import annotations

from functools import cache

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from servewatch.capacity.engine_fit import decode_steps, fit_engine, sampled_decode_steps
from servewatch.emulator.engine_params import EngineParams
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig, RouterPolicy, RouterSpec, TopologySpec
from servewatch.emulator.records import FinishedRequests
from servewatch.emulator.sampled_workload import SampledMix
from tests.engine_model_cases import served_frames

ENGINE = EngineParams(step_base_s=0.02, step_per_seq_s=0.0005, step_per_prefill_token_s=0.0001)
START_S = 1_800_000_000.0


@cache
def served() -> pl.DataFrame:
    """Two replicas of a known engine, 20 minutes at about half their capacity."""
    config = FleetConfig(
        topology=TopologySpec(zones=("zone-a",), hosts_per_zone=2, replicas_per_host=1),
        engine=ENGINE,
        router=RouterSpec(policy=RouterPolicy.ROUND_ROBIN),
    )
    mix = SampledMix(((200, 60), (800, 120), (1500, 40), (400, 250)))
    collect = FinishedRequests()
    sim = FleetSimulation(
        config,
        observer=collect,
        seed=4,
        start_s=START_S,
        source=mix.source(6.0, seed=4, start_s=START_S, until_s=START_S + 1200.0),
    )
    sim.run_until(START_S + 1500.0)
    requests, _ = served_frames(collect.finished)
    return requests


def test_the_fit_recovers_a_known_engines_step_time() -> None:
    fit = fit_engine(decode_steps(served().lazy()).collect(), seed=1, resamples=20, source="t")
    step = fit.step
    assert step.base_s == pytest.approx(ENGINE.step_base_s, rel=0.15)
    assert step.per_seq_s == pytest.approx(ENGINE.step_per_seq_s, rel=0.3)
    assert step.per_prefill_token_s == pytest.approx(ENGINE.step_per_prefill_token_s, rel=0.3)


def test_a_windowed_sample_rebuilds_each_requests_load_as_the_whole_day_does() -> None:
    requests = served()
    whole = decode_steps(requests.lazy()).collect()
    sampled, fitted_on = sampled_decode_steps(requests, max_requests=requests.height // 4)
    assert "windows" in fitted_on
    assert 0 < sampled.height < whole.height
    # Every request in a window is seen exactly as the whole day's reconstruction sees it.
    # (up to rounding: its running sums start elsewhere).
    kept = whole.join(sampled.select("replica", "minute_ts").unique(), on=["replica", "minute_ts"])
    assert_frame_equal(sampled, kept.sort(pl.all()), rel_tol=1e-9)


def test_a_small_day_is_fitted_whole() -> None:
    requests = served()
    sampled, fitted_on = sampled_decode_steps(requests)
    assert fitted_on == f"all {requests.height:,} requests"
    assert sampled.equals(decode_steps(requests.lazy()).collect())
