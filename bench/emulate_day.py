"""Fixture-mode speed: a day of a 12-replica emulated fleet at about 20 req/s in virtual time.

Ours, twice:
- fixture mode as a whole: `FleetSimulation` for 24 h (3 zones x 2 hosts x 2 replicas, diurnal
  arrivals averaging 20 req/s, multi-turn conversations, least-loaded routing) recorded by a
  `FixtureWriter` into a temporary folder: a vLLM page per replica and a DCGM page per host every
  15 s, every request's span as OTLP JSON lines, the manifest (what `servewatch emulate
  --record` does, at its finest scrape interval);
- the simulation alone, every record going to a counting observer.
Peer: drawing the same workload's arrivals and lengths and nothing else (every turn answered
the instant it arrives), measured in the same run, so the ratios show what simulating the
engines and writing the outputs cost on top of generating the requests. Unit: virtual seconds
per wall second; the target for the whole is >= 720 (a day in under 2 minutes). `--quick`
simulates 1 h. The line printed first says whether the emulator runs compiled
(emulator/native.py; `make native` builds it). Fixture mode's CPU time is printed per process
(the simulating one and the helper that writes the files, with the helper's time in the kernel,
which creating a hundred thousand page files can dominate): on two cores the whole can finish
in under two minutes only if each stays well below that.
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.report import Comparison
from servewatch.emulator import native
from servewatch.emulator.fixture_writer import record_fleet
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig, TopologySpec
from servewatch.emulator.records import EngineSteps, FinishedRequest, ReplicaEvent
from servewatch.emulator.workload import ArrivalKind, ArrivalSpec, SyntheticWorkload

START_S = 1_795_046_400.0  # 2026-11-18T00:00:00Z: a whole UTC day, peak at 15:00
SEED = 20_261_118
TARGET_RATIO = 720.0
SCRAPE_INTERVAL_S = 15.0


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


@dataclass(frozen=True)
class Recorded:
    """One fixture-mode run: wall time, CPU time of this (simulating) process and of the
    helper process that writes the files, the manifest and the bytes written."""

    wall_s: float
    simulating_cpu_s: float
    helper_cpu_s: float
    helper_system_cpu_s: float  # in the kernel: mostly creating the page files
    manifest: dict[str, Any]
    size_bytes: int


def _cpu_s(who: int) -> tuple[float, float]:
    """(user + system, system) CPU seconds of `who` so far."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime, usage.ru_stime


def record(config: FleetConfig, virtual_s: float) -> Recorded:
    """Fixture mode into a fresh temporary folder."""
    parent = Path(tempfile.mkdtemp(prefix="servewatch-bench-fixture-"))
    try:
        # The helper is a child process: its CPU time shows in RUSAGE_CHILDREN once it has
        # exited, which `record_fixture` waits for.
        self_before, children_before = (
            _cpu_s(resource.RUSAGE_SELF),
            _cpu_s(resource.RUSAGE_CHILDREN),
        )
        started = time.perf_counter()
        manifest = record_fleet(
            config,
            parent / "fixture",
            start_s=START_S,
            end_s=START_S + virtual_s,
            scrape_interval_s=SCRAPE_INTERVAL_S,
            seed=SEED,
        )
        wall_s = time.perf_counter() - started
        size = sum(p.stat().st_size for p in parent.rglob("*") if p.is_file())
        self_after, children_after = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN)
        return Recorded(
            wall_s=wall_s,
            simulating_cpu_s=self_after[0] - self_before[0],
            helper_cpu_s=children_after[0] - children_before[0],
            helper_system_cpu_s=children_after[1] - children_before[1],
            manifest=manifest,
            size_bytes=size,
        )
    finally:
        shutil.rmtree(parent, ignore_errors=True)


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
    hours = f"{virtual_s / 3600:.0f} h"
    config = day_config()
    print(f"   {native.describe()}", flush=True)
    recorded = record(config, virtual_s)
    sim_s, counts = simulate(config, virtual_s)
    draw_s, drawn = draw_requests_only(config, virtual_s)
    whole, alone = virtual_s / recorded.wall_s, virtual_s / sim_s
    manifest = recorded.manifest
    print(
        f"   fixture mode: {hours} of {len(config.placements())} replicas in "
        f"{recorded.wall_s:.1f} s wall ({manifest['spans']['count']:,} spans, "
        f"{manifest['pages']['count']:,} pages every {SCRAPE_INTERVAL_S:g} s, "
        f"{recorded.size_bytes / 2**20:,.0f} MiB). Target ratio >= {TARGET_RATIO:.0f}: "
        f"{'met' if whole >= TARGET_RATIO else 'NOT met'} ({whole:.0f})\n"
        f"   fixture mode CPU: simulating process {recorded.simulating_cpu_s:.1f} s, "
        f"file-writing helper {recorded.helper_cpu_s:.1f} s ({recorded.helper_system_cpu_s:.1f} s "
        "of it in the kernel)\n"
        f"   simulation alone: {sim_s:.1f} s wall: {counts.requests:,} requests "
        f"({counts.failed} failed), {counts.steps:,} engine steps in {counts.step_records:,} "
        f"step records; drawing {drawn:,} requests alone took {draw_s:.1f} s",
        flush=True,
    )
    peer_label = "drawing the same arrivals and lengths only"
    return [
        Comparison(
            benchmark=(
                f"fixture mode: {hours} of a 12-replica fleet at ~20 req/s, pages every 15 s and "
                "spans written (virtual seconds per wall second)"
            ),
            unit="virtual s / wall s",
            ours_label="servewatch FleetSimulation + FixtureWriter",
            ours=whole,
            peer_label=peer_label,
            peer=virtual_s / draw_s,
        ),
        Comparison(
            benchmark=(
                f"emulate {hours} of a 12-replica fleet at ~20 req/s, simulation alone "
                "(virtual seconds per wall second)"
            ),
            unit="virtual s / wall s",
            ours_label="servewatch FleetSimulation (engines, routing, records)",
            ours=alone,
            peer_label=peer_label,
            peer=virtual_s / draw_s,
        ),
    ]
