"""Test helpers for the fleet-health detectors: a small emulated fleet recorded with an injected
failure, replayed into a store, and read back as `HealthInputs`.

Every fleet shares one base (six replicas on three hosts, prefix-affinity routing, multi-turn
chat) so a clean recording and a faulty one differ only by what was injected.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from servewatch.collectors.fixture.replay import replay_fixture
from servewatch.emulator.engine import EngineParams
from servewatch.emulator.failures import FailureSpec
from servewatch.emulator.fixture_writer import record_fleet
from servewatch.emulator.fleet_config import FleetConfig, RouterPolicy, RouterSpec, TopologySpec
from servewatch.emulator.workload import (
    ArrivalKind,
    ArrivalSpec,
    ConversationSpec,
    Distribution,
    RateStep,
    TenantSpec,
    WorkloadSpec,
)
from servewatch.health.finding import HealthInputs
from servewatch.health_service import health_inputs
from servewatch.store import Store

START_S = 1_795_046_400.0  # 2026-11-19 00:00 UTC
START = datetime.fromtimestamp(START_S, UTC).replace(tzinfo=None)
RATE_RPS = 4.0
SCRAPE_INTERVAL_S = 15.0


BASE_TOPOLOGY = TopologySpec(hosts_per_zone=1, replicas_per_host=2)


def fleet_config(
    *,
    failures: tuple[FailureSpec, ...] = (),
    steps: tuple[RateStep, ...] = (),
    topology: TopologySpec = BASE_TOPOLOGY,
    router: RouterPolicy = RouterPolicy.PREFIX_AFFINITY,
    rate_rps: float = RATE_RPS,
) -> FleetConfig:
    """The shared base fleet, with `failures` injected, the arrival rate stepped, the
    replicas placed on `topology` behind `router`, at a base rate of `rate_rps`."""
    arrival = (
        ArrivalSpec(kind=ArrivalKind.STEPS, rate_rps=rate_rps, steps=steps)
        if steps
        else ArrivalSpec(kind=ArrivalKind.POISSON, rate_rps=rate_rps)
    )
    # Long answers keep a few requests running on each replica at a modest request rate (the
    # emulator's cost grows with requests, not tokens), so a squeezed KV pool fills.
    workload = WorkloadSpec(
        arrival=arrival,
        output_tokens=Distribution.lognormal(400.0, 0.6, min_value=1, max_value=2000),
        max_tokens=2000,
        conversation=ConversationSpec(turns_mean=4.0),
        tenants=(
            TenantSpec("chat", weight=3.0, system_prompt_tokens=600),
            TenantSpec("batch-api", weight=1.0, system_prompt_tokens=0),
        ),
        max_context_tokens=3500,
    )
    # A larger model than the default (prefill about 1,700 tokens/s per replica) with a
    # small batch limit, so a step to a few times the base rate fills every batch and queues.
    engine = replace(
        EngineParams(),
        step_base_s=0.02,
        step_per_seq_s=0.0002,
        step_per_prefill_token_s=0.0006,
        max_num_seqs=32,
        max_model_len=4096,
    )
    return FleetConfig(
        topology=topology,
        engine=engine,
        router=RouterSpec(policy=router),
        workload=workload,
        failures=failures,
    )


def record(config: FleetConfig, folder: Path, *, minutes: float, seed: int = 7) -> Path:
    """Record `minutes` of the fleet into `folder` (a new fixture folder)."""
    record_fleet(
        config,
        folder,
        start_s=START_S,
        end_s=START_S + minutes * 60,
        scrape_interval_s=SCRAPE_INTERVAL_S,
        seed=seed,
    )
    return folder


def recorded_inputs(
    config: FleetConfig, folder: Path, *, minutes: float, seed: int = 7
) -> HealthInputs:
    """Record, replay into an in-memory store and read the whole recording back."""
    record(config, folder, minutes=minutes, seed=seed)
    with Store.open(":memory:") as store:
        replay_fixture(folder, store=store)
        end = START + timedelta(minutes=minutes)
        return health_inputs(store.read_window(from_ts=START, to_ts=end), start=START, end=end)
