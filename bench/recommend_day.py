"""recommend on a day of 45 replicas, fit and knee search included, against the emulator alone.

Input: rollup_day's store (24 h at 170 req/s over 45 replicas in 3 pools: 14,688,000 requests;
`--quick`: 2 h). Its latencies are drawn, not served by an engine, so the fitted engines and
their knees mean nothing here; what is measured is what the work costs.

- `recommend_from_store` as a whole, requirement with both SLO limits and observed demand: the
  read, the minute rollups, every pool's attainment fit, engine fit and knee search, the sizing
  and the record. Target: within 60 s. Printed against the engine fit and search of one pool
  alone, so the share the model takes shows.
- one pool's knee search (`search_knee`, every refit searched) against the emulator simulating
  the same virtual time (what the search's probes covered, `probed_virtual_s`) in one run of
  the same fleet at the knee: what bisecting costs on top of simulating. Target: at most 2x
  (ratio >= 0.5).
"""

from __future__ import annotations

import time
import tomllib
from datetime import UTC, datetime

import polars as pl

from bench.report import Comparison
from bench.rollup_day import day_store
from servewatch.capacity.knee_search import KneeSearchSpec, engine_params, replays, search_knee
from servewatch.capacity.parallel import process_map
from servewatch.capacity.requirement import parse_requirement
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig, RouterSpec, SloSpec, TopologySpec
from servewatch.emulator.ground_truth import PROBE_START_S
from servewatch.emulator.records import FinishedRequests
from servewatch.emulator.workload import WorkloadSpec
from servewatch.recommend_service import recommend_from_store
from servewatch.store import Store, roll_up_request_minutes

PER_S = 170.0
NOW = datetime(2027, 1, 1, tzinfo=UTC)
REQUIREMENT = """
name = "bench"
failure_unit = "host"
[slo]
ttft_limit_s = 1.0
tpot_limit_s = 0.1
target_ratio = 0.9
[demand]
req_per_min = "observed"
[replica]
capacity_req_per_min = 200
[placement]
replicas_per_host = 1
zones = ["zone-a", "zone-b", "zone-c"]
"""


def run(*, quick: bool = False) -> list[Comparison]:
    hours = 2 if quick else 24
    path = day_store(hours=hours, per_s=PER_S)
    requirement = parse_requirement(tomllib.loads(REQUIREMENT), where="bench requirement")
    with Store.open(path) as store:
        # Untimed, as `servewatch recommend` runs it: the writers keep the rollup current, so
        # in steady state this finds nothing new (the first run on a fresh store rolls up all).
        roll_up_request_minutes(store)
        started = time.perf_counter()
        with process_map() as mapper:  # as `servewatch recommend` runs it
            record, _ = recommend_from_store(store, requirement=requirement, now=NOW, mapper=mapper)
        recommend_s = time.perf_counter() - started
        pool = next(p for p in record.pools if p.engine_model is not None)
        model = pool.engine_model
        assert model is not None
        requests = (
            store.read_requests()
            .filter(pl.col("pool") == pool.pool)
            .sort("replica", "arrival_ts", "end_ts", "request_id")
            .collect()
        )
    spec = KneeSearchSpec(
        ttft_limit_s=1.0,
        tpot_limit_s=0.1,
        target_ratio=0.9,
        replicas=model.replicas,
        router=model.router,
        seed=1,
    )
    started = time.perf_counter()
    searched = search_knee(
        model.engine,
        requests,
        load_rps=model.check.load_rps,
        observed_attainment_ratio=pool.attainment.attainment_ratio,
        spec=spec,
    )
    search_s = time.perf_counter() - started

    # The emulator alone: the same fleet, engine and mix at the knee, for the probes' time.
    replay = replays(model.engine, requests, hit_ratio=None, seed=1)[0]
    engine = engine_params(replay.step, limits=spec.limits, mix=replay.mix)
    total_rps = searched.knee_rps * spec.replicas
    until_s = PROBE_START_S + searched.probed_virtual_s
    fleet = FleetConfig(
        topology=TopologySpec(zones=("zone-a",), hosts_per_zone=spec.replicas, replicas_per_host=1),
        engine=engine,
        router=RouterSpec(policy=spec.router),
        workload=WorkloadSpec(),
        slo=SloSpec(ttft_s=1.0, tpot_s=0.1, target_ratio=0.9),
    )
    started = time.perf_counter()
    sim = FleetSimulation(
        fleet,
        observer=FinishedRequests(),
        seed=1,
        start_s=PROBE_START_S,
        source=replay.mix.source(total_rps, seed=1, start_s=PROBE_START_S, until_s=until_s),
    )
    sim.run_until(until_s)
    simulate_s = time.perf_counter() - started

    label = f"{hours} h, {requests.height:,} requests in pool {pool.pool}"
    return [
        Comparison(
            benchmark=f"recommend_day: recommend on {hours} h of 45 replicas (target <= 60 s)",
            unit="ms",
            ours_label="recommend_from_store, all pools",
            ours=recommend_s * 1e3,
            peer_label=f"one pool's knee search alone ({label})",
            peer=search_s * 1e3,
            higher_is_better=False,
        ),
        Comparison(
            benchmark=(
                f"recommend_day: knee search against the emulator for the same "
                f"{searched.probed_virtual_s:,.0f} virtual s (target ratio >= 0.5)"
            ),
            unit="ms",
            ours_label=f"search_knee, {len(searched.resampled_knees_rps) + 1} searches",
            ours=search_s * 1e3,
            peer_label=f"FleetSimulation of {spec.replicas} replicas at the knee",
            peer=simulate_s * 1e3,
            higher_is_better=False,
        ),
    ]
