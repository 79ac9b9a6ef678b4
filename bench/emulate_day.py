"""Fixture-mode speed: a day of a 12-replica emulated fleet at about 20 req/s in virtual time.

Ours: `FleetSimulation` for 24 h (3 zones x 2 hosts x 2 replicas, diurnal arrivals averaging
20 req/s, multi-turn conversations, least-loaded routing), every record going to a counting
observer, so the figure is the simulation alone (the wire outputs are benchmarked apart).
Peer: drawing the same workload's arrivals and lengths and nothing else (every turn answered
the instant it arrives), measured in the same run, so the ratio shows what simulating the
engines costs on top of generating the requests. Unit: virtual seconds per wall second; the
target is >= 720 (a day in under 2 minutes). `--quick` simulates 1 h.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from bench.report import Comparison
from emulator.fleet import FleetSimulation
from emulator.fleet_config import FleetConfig, TopologySpec
from emulator.records import EngineSteps, FinishedRequest, ReplicaEvent
from emulator.workload import ArrivalKind, ArrivalSpec, SyntheticWorkload

START_S = 1_795_046_400.0  # 2026-11-18T00:00:00Z: a whole UTC day, peak at 15:00
SEED = 20_261_118
TARGET_RATIO = 720.0


@dataclass
class CountingObserver:
    requests: int = 0
    failed: int = 0
    step_records: int = 0
    steps: int = 0
    events: int = 0

    def request_finished(self, record: FinishedRequest) -> None:
        self.requests += 1
        self.failed += record.failed

    def engine_steps(self, record: EngineSteps) -> None:
        self.step_records += 1
        self.steps += record.iterations

    def replica_event(self, event: ReplicaEvent) -> None:
        self.events += 1


def day_config() -> FleetConfig:
    base = FleetConfig.default()
    return replace(
        base,
        topology=TopologySpec(zones=("zone-a", "zone-b", "zone-c"), hosts_per_zone=2),
        workload=replace(
            base.workload, arrival=ArrivalSpec(kind=ArrivalKind.DIURNAL, rate_rps=20.0)
        ),
    )


def simulate(config: FleetConfig, virtual_s: float) -> tuple[float, CountingObserver]:
    observer = CountingObserver()
    started = time.perf_counter()
    sim = FleetSimulation(config, observer=observer, seed=SEED, start_s=START_S)
    sim.run_until(START_S + virtual_s)
    return time.perf_counter() - started, observer


def draw_requests_only(config: FleetConfig, virtual_s: float) -> tuple[float, int]:
    started = time.perf_counter()
    source = SyntheticWorkload(
        config.workload, seed=SEED, start_s=START_S, until_s=START_S + virtual_s
    )
    drawn = 0
    while (request := source.next_arrival()) is not None:
        while request is not None:
            drawn += 1
            request = source.follow_up(
                request,
                completion_tokens=min(request.output_tokens, request.max_tokens),
                end_s=request.arrival_s,
                ok=True,
            )
    return time.perf_counter() - started, drawn


def run(*, quick: bool = False) -> list[Comparison]:
    virtual_s = 3600.0 if quick else 86_400.0
    config = day_config()
    sim_s, counts = simulate(config, virtual_s)
    draw_s, drawn = draw_requests_only(config, virtual_s)
    ratio = virtual_s / sim_s
    print(
        f"   simulated {virtual_s / 3600:.0f} h of {len(config.placements())} replicas in "
        f"{sim_s:.1f} s wall: {counts.requests:,} requests ({counts.failed} failed), "
        f"{counts.steps:,} engine steps in {counts.step_records:,} step records; "
        f"drawing {drawn:,} requests alone took {draw_s:.1f} s. Target ratio >= "
        f"{TARGET_RATIO:.0f}: {'met' if ratio >= TARGET_RATIO else 'NOT met'} ({ratio:.0f})",
        flush=True,
    )
    return [
        Comparison(
            benchmark=(
                f"emulate {virtual_s / 3600:.0f} h of a 12-replica fleet at ~20 req/s "
                "(virtual seconds per wall second)"
            ),
            unit="virtual s / wall s",
            ours_label="servewatch FleetSimulation (engines, routing, records)",
            ours=ratio,
            peer_label="drawing the same arrivals and lengths only",
            peer=virtual_s / draw_s,
        )
    ]
