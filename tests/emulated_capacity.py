"""Emulated fleets with a known capacity at the SLO, for the recommender's accuracy tests.

Each case is 36 minutes or less of three replicas of a deliberately slow engine (capacity about
3.5 req/s per replica at TTFT <= 1 s and TPOT <= 0.1 s for 90% of requests), so a case records
and replays in seconds:

- `knee`: single-turn chat, the per-replica rate stepped every 4 minutes from 1.8 to 4.2 req/s,
  through the knee;
- `low`: the same mix at a steady 1.4 req/s per replica, below half the capacity (a narrow load
  range that never nears the knee);
- `unstable_cache`: multi-turn conversations routed by prefix affinity through the same ramp,
  with every replica restarted once (each restart empties its prefix cache and moves its
  conversations), so the fleet's hit ratio swings from one ten-minute window to the next;
- `low_conversations`: multi-turn conversations behind prefix affinity at a steady rate below
  half the capacity, the gateway naming each request's conversation on its span.

The manifest's ground truth is the emulator's own capacity search (emulator/ground_truth.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servewatch.collectors.fixture.replay import replay_fixture
from servewatch.emulation import record_emulated_fleet
from servewatch.emulator.engine import EngineParams
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet_config import (
    FleetConfig,
    RouterPolicy,
    RouterSpec,
    SloSpec,
    TopologySpec,
)
from servewatch.emulator.workload import (
    ArrivalKind,
    ArrivalSpec,
    ConversationSpec,
    Distribution,
    RateStep,
    TenantSpec,
    WorkloadSpec,
)
from servewatch.store import Store

START_S = 1_800_000_000.0  # 2027-01-15 08:00 UTC
SEED = 7
REPLICAS = 3
STEP_S = 240.0
SLO = SloSpec(ttft_s=1.0, tpot_s=0.1, target_ratio=0.9)
# A slow engine: each decode step costs 20 ms plus 0.4 ms per sequence, prefill 5k tokens/s.
ENGINE = EngineParams(step_base_s=0.02, step_per_seq_s=0.0004, step_per_prefill_token_s=0.0002)
TENANTS = (TenantSpec("chat", 3.0, 300), TenantSpec("api", 1.0, 0))
RAMP_RPS_PER_REPLICA = (1.8, 2.4, 2.8, 3.0, 3.2, 3.4, 3.6, 3.8, 4.2)
LOW_RPS_PER_REPLICA = 1.4
LOW_CHAT_RPS_PER_REPLICA = 0.6


def _topology() -> TopologySpec:
    return TopologySpec(zones=("zone-a", "zone-b", "zone-c"), hosts_per_zone=1, replicas_per_host=1)


def _ramp() -> ArrivalSpec:
    steps = tuple(
        RateStep(i * STEP_S, rate * REPLICAS) for i, rate in enumerate(RAMP_RPS_PER_REPLICA)
    )
    return ArrivalSpec(kind=ArrivalKind.STEPS, rate_rps=steps[0].rate_rps, steps=steps)


def knee_fleet() -> FleetConfig:
    return FleetConfig(
        topology=_topology(),
        engine=ENGINE,
        workload=WorkloadSpec(arrival=_ramp(), tenants=TENANTS),
        slo=SLO,
    )


def low_fleet() -> FleetConfig:
    arrival = ArrivalSpec(kind=ArrivalKind.POISSON, rate_rps=LOW_RPS_PER_REPLICA * REPLICAS)
    return FleetConfig(
        topology=_topology(),
        engine=ENGINE,
        workload=WorkloadSpec(arrival=arrival, tenants=TENANTS),
        slo=SLO,
    )


def unstable_cache_fleet() -> FleetConfig:
    conversation = ConversationSpec(
        turns_mean=4.0, think_time_s=Distribution.lognormal(15.0, 0.5, max_value=120.0)
    )
    restarts = tuple(
        FailureSpec(FailureKind.REPLICA_CRASH, at_s, f"vllm-{i}", duration_s=60.0)
        for i, at_s in enumerate((360.0, 1080.0, 1680.0))
    )
    return FleetConfig(
        topology=_topology(),
        engine=ENGINE,
        router=RouterSpec(policy=RouterPolicy.PREFIX_AFFINITY),
        workload=WorkloadSpec(arrival=_ramp(), conversation=conversation, tenants=TENANTS),
        failures=restarts,
        slo=SLO,
    )


def low_conversations_fleet() -> FleetConfig:
    conversation = ConversationSpec(
        turns_mean=4.0, think_time_s=Distribution.lognormal(15.0, 0.5, max_value=120.0)
    )
    arrival = ArrivalSpec(kind=ArrivalKind.POISSON, rate_rps=LOW_CHAT_RPS_PER_REPLICA * REPLICAS)
    return FleetConfig(
        topology=_topology(),
        engine=ENGINE,
        router=RouterSpec(policy=RouterPolicy.PREFIX_AFFINITY),
        workload=WorkloadSpec(arrival=arrival, conversation=conversation, tenants=TENANTS),
        slo=SLO,
        conversation_ids=True,
    )


CASES = {
    "knee": knee_fleet,
    "low": low_fleet,
    "unstable_cache": unstable_cache_fleet,
    "low_conversations": low_conversations_fleet,
}
RAMP_HOURS = len(RAMP_RPS_PER_REPLICA) * STEP_S / 3600
HOURS = {"knee": RAMP_HOURS, "low": 0.5, "unstable_cache": RAMP_HOURS, "low_conversations": 0.5}


def record_case(case: str, folder: Path) -> dict[str, Any]:
    """Record one case into `folder`; returns its manifest."""
    return record_emulated_fleet(
        CASES[case](),
        folder=folder,
        start_s=START_S,
        hours=HOURS[case],
        scrape_interval_s=60.0,
        seed=SEED,
    )


def replayed_case(case: str, root: Path) -> tuple[Path, dict[str, Any]]:
    """Record a case and replay it into a new store; returns the store path and manifest."""
    folder = root / case
    record_case(case, folder)
    db = root / f"{case}.duckdb"
    with Store.open(db) as store:
        replay_fixture(folder, store=store)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return db, manifest
