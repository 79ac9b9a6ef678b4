"""Emulated fleets below their knee, for the engine model's accuracy and coverage tests.

Each case is a fleet (an engine profile, a mix, a router, a placement) run for 30 minutes at a
seeded fraction (15% to 40%) of its own fleet-level capacity at the SLO, which the emulator's
search gives (emulator/ground_truth.py). A replayed-trace case serves a generated trace in the
Azure LLM inference format (the conversation trace's lengths, bursty minute to minute) sped up
to that fraction; its capacity is the fleet's under the trace's request shapes. The fleet's
finished requests become the rows the store would hold (the columns the capacity fit reads),
and its prefix-cache hits per replica-minute the scraped counters; `pool_capacities` then fits
the engine and searches its knee. Direct simulation instead of recording and replaying keeps
twenty cases inside the suite's budget; the record-and-replay path is covered by
tests/test_recommend_emulated.py."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from servewatch.capacity.attainment_fit import AttainmentSpec
from servewatch.capacity.pool_capacity import EngineModelSettings, PoolCapacity, pool_capacities
from servewatch.emulator.engine import EngineParams
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import (
    FleetConfig,
    RouterPolicy,
    RouterSpec,
    SloSpec,
    TopologySpec,
)
from servewatch.emulator.ground_truth import capacity_at_slo, fleet_capacity_for_config
from servewatch.emulator.records import FinishedRequest, FinishedRequests
from servewatch.emulator.sampled_workload import SampledMix
from servewatch.emulator.trace_replay import TraceFormat, read_trace
from servewatch.emulator.workload import (
    ArrivalKind,
    ArrivalSpec,
    ConversationSpec,
    Distribution,
    ReplaySpec,
    TenantSpec,
    WorkloadSpec,
)

START_S = 1_800_000_000.0
DURATION_S = 1800.0
TENANTS = (TenantSpec("chat", 3.0, 300), TenantSpec("api", 1.0, 0))

# Engine profiles, with the SLO each is sized for.
PROFILES: dict[str, tuple[EngineParams, SloSpec]] = {
    # An 8B model on one H100 (the emulator's default engine).
    "8b": (EngineParams(), SloSpec(ttft_s=0.5, tpot_s=0.05, target_ratio=0.9)),
    # A deliberately slow engine: 20 ms a step plus 0.4 ms a sequence, prefill 5k tokens/s.
    "slow": (
        EngineParams(step_base_s=0.02, step_per_seq_s=0.0004, step_per_prefill_token_s=0.0002),
        SloSpec(ttft_s=1.0, tpot_s=0.1, target_ratio=0.9),
    ),
    # A large model: 35 ms a step, prefill about 8k tokens/s.
    "large": (
        EngineParams(step_base_s=0.035, step_per_seq_s=0.0003, step_per_prefill_token_s=0.00012),
        SloSpec(ttft_s=2.0, tpot_s=0.06, target_ratio=0.9),
    ),
}


@dataclass(frozen=True)
class Case:
    name: str
    config: FleetConfig
    load_ratio: float  # of the fleet's capacity
    seed: int
    trace: Path | None = None  # the workload replays this Azure-format trace


# The generated trace: an hour at about 5 req/s, lengths like the Azure conversation trace's
# (prompt median 1,020, output median 129 tokens), each minute's rate drawn lognormal.
TRACE_MINUTES = 60
TRACE_RATE_RPS = 5.0


def write_trace(path: Path, *, seed: int) -> Path:
    """An Azure LLM inference CSV (`TIMESTAMP` in seconds) of TRACE_MINUTES bursty minutes."""
    rng = random.Random(f"{seed}:trace")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for minute in range(TRACE_MINUTES):
        rate_rps = TRACE_RATE_RPS * min(3.0, rng.lognormvariate(-0.125, 0.5))  # mean about 1
        t_s, end_s = 60.0 * minute, 60.0 * (minute + 1)
        while (t_s := t_s + rng.expovariate(rate_rps)) < end_s:
            prompt = min(8000, max(8, round(rng.lognormvariate(math.log(1020), 0.9))))
            output = min(1000, max(1, round(rng.lognormvariate(math.log(129), 0.8))))
            lines.append(f"{t_s:.6f},{prompt},{output}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def trace_rps_per_speedup(config: FleetConfig) -> float:
    """Requests per second per replica of the config's trace replayed at speedup 1."""
    replay = config.workload.replay
    assert replay is not None
    rows = len(list(read_trace(replay.path, replay.format)))
    return rows / (60.0 * TRACE_MINUTES) / config.topology.replicas


def trace_capacity_rps(config: FleetConfig, *, seed: int) -> float:
    """Per replica, the fleet's capacity at the SLO under the trace's request shapes arriving
    steadily (Poisson): the number the sizing chain means, which it applies to the peak
    minute's demand (the trace's bursts are the demand's part, not the replica's)."""
    replay = config.workload.replay
    assert replay is not None
    shapes = tuple(
        (r.prompt_tokens, max(1, r.output_tokens)) for r in read_trace(replay.path, replay.format)
    )
    return capacity_at_slo(
        config.engine, SampledMix(shapes), slo=config.slo, seed=seed, fleet=config
    ).capacity_rps


def _config(
    profile: str, *, turns: float, router: RouterPolicy, hosts: tuple[int, ...]
) -> FleetConfig:
    engine, slo = PROFILES[profile]
    conversation = (
        ConversationSpec(
            turns_mean=turns, think_time_s=Distribution.lognormal(15.0, 0.5, max_value=120.0)
        )
        if turns > 1
        else ConversationSpec()
    )
    zones = tuple(f"zone-{chr(ord('a') + i)}" for i in range(len(hosts)))
    return FleetConfig(
        topology=TopologySpec(zones=zones, hosts_per_zone=hosts, replicas_per_host=1),
        engine=engine,
        router=RouterSpec(policy=router),
        workload=WorkloadSpec(conversation=conversation, tenants=TENANTS),
        slo=slo,
    )


def seeded_cases(count: int, *, seed: int, trace_dir: Path | None = None) -> list[Case]:
    """`count` cases cycling through profiles, mixes, routers and placements (and, with
    `trace_dir` to write it in, a replayed trace); the load ratio and simulation seed of each
    are drawn from `seed`."""
    rng = random.Random(seed)
    shapes: list[tuple[str, float, RouterPolicy, tuple[int, ...]]] = [
        ("8b", 1.0, RouterPolicy.ROUND_ROBIN, (1, 1, 1)),
        ("slow", 1.0, RouterPolicy.LEAST_LOADED, (1, 1, 1)),
        ("large", 1.0, RouterPolicy.ROUND_ROBIN, (1, 1, 1)),
        ("slow", 4.0, RouterPolicy.LEAST_LOADED, (1, 1, 1)),
        ("large", 4.0, RouterPolicy.PREFIX_AFFINITY, (2, 2, 2)),
        ("8b", 3.0, RouterPolicy.PREFIX_AFFINITY, (2, 1, 1)),  # uneven placement
        ("large", 1.0, RouterPolicy.LEAST_LOADED, (3, 1)),  # uneven placement
    ]
    trace = None if trace_dir is None else write_trace(trace_dir / "azure-like.csv", seed=seed)
    if trace is not None:
        shapes.append(("large", 0.0, RouterPolicy.LEAST_LOADED, (1, 1, 1)))  # turns 0: the trace
    cases = []
    for i in range(count):
        profile, turns, router, hosts = shapes[i % len(shapes)]
        config = _config(profile, turns=max(turns, 1.0), router=router, hosts=hosts)
        mix = "multi-turn" if turns > 1 else "single-turn"
        if turns == 0.0 and trace is not None:
            mix = "replayed-trace"
            replay = ReplaySpec(trace, TraceFormat.AZURE_CSV)
            config = replace(config, workload=replace(config.workload, replay=replay))
        cases.append(
            Case(
                name=f"{i:02d}-{profile}-{mix}-{router.value}-{'x'.join(map(str, hosts))}",
                config=config,
                load_ratio=rng.uniform(0.15, 0.4),
                seed=rng.randrange(1_000_000),
                trace=trace if mix == "replayed-trace" else None,
            )
        )
    return cases


def _ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)


def served_frames(finished: list[FinishedRequest]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The requests as the store holds them (the columns the fit reads) and the prefix-cache
    counters per replica-minute."""
    requests = pl.DataFrame(
        {
            "request_id": [r.request_id for r in finished],
            "conversation_id": [r.conversation_id for r in finished],
            "replica": [r.replica for r in finished],
            "pool": ["default"] * len(finished),
            "arrival_ts": [_ts(r.arrival_s) for r in finished],
            "end_ts": [_ts(r.arrival_s + r.e2e_s) for r in finished],
            "ok": [not r.failed for r in finished],
            "prompt_tokens": [r.prompt_tokens for r in finished],
            "completion_tokens": [r.completion_tokens for r in finished],
            "ttft_s": [r.ttft_s for r in finished],
            "queue_s": [r.queue_s for r in finished],
            "prefill_s": [r.prefill_s for r in finished],
            "e2e_s": [r.e2e_s for r in finished],
            "decode_s": [r.decode_s for r in finished],
            "cached": [r.cached_prompt_tokens for r in finished],
        },
        schema_overrides={"arrival_ts": pl.Datetime("us"), "end_ts": pl.Datetime("us")},
    )
    prefix = (
        requests.group_by("replica", minute_ts=pl.col("arrival_ts").dt.truncate("1m"))
        .agg(
            hits_tokens=pl.col("cached").sum().cast(pl.Float64),
            queries_tokens=pl.col("prompt_tokens").sum().cast(pl.Float64),
        )
        .sort("replica", "minute_ts")
    )
    return requests.drop("cached"), prefix


@dataclass(frozen=True)
class Outcome:
    case: Case
    truth_rps: float
    capacity: PoolCapacity

    @property
    def error_ratio(self) -> float:
        return self.capacity.knee_load / self.truth_rps - 1.0

    @property
    def covered(self) -> bool:
        return self.capacity.knee_low_load <= self.truth_rps <= self.capacity.knee_high_load


def run_case(case: Case, *, conversation_ids: bool = True) -> Outcome:
    """Simulate the case's fleet below its knee and fit its capacity from what it served;
    the requests name their conversations (as a gateway would) unless `conversation_ids`
    is False (as vLLM's own spans have it)."""
    config = case.config
    replay = config.workload.replay
    if replay is None:
        truth = fleet_capacity_for_config(config, seed=case.seed).capacity_rps
        rate_rps = case.load_ratio * truth * config.topology.replicas
        workload = replace(
            config.workload, arrival=ArrivalSpec(kind=ArrivalKind.POISSON, rate_rps=rate_rps)
        )
    else:
        truth = trace_capacity_rps(config, seed=case.seed)
        speedup = truth / trace_rps_per_speedup(config)
        workload = replace(
            config.workload, replay=replace(replay, speedup=case.load_ratio * speedup)
        )
    running = replace(config, workload=workload)
    collect = FinishedRequests()
    sim = FleetSimulation(running, observer=collect, seed=case.seed, start_s=START_S)
    sim.run_until(START_S + DURATION_S)
    requests, prefix = served_frames(collect.finished)
    if not conversation_ids:
        requests = requests.drop("conversation_id")
    slo = config.slo
    (capacity,), _ = pool_capacities(
        requests.lazy(),
        spec=AttainmentSpec(
            ttft_limit_s=slo.ttft_s,
            tpot_limit_s=slo.tpot_s,
            target_ratio=slo.target_ratio,
            seed=case.seed,
        ),
        data=f"emulated case {case.name}",
        prefix=prefix.lazy(),
        engine_model=EngineModelSettings(router=config.router.policy),
    )
    return Outcome(case, truth, capacity)
