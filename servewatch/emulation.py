"""`servewatch emulate`: an emulated fleet recorded to a fixture folder, or served live."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servewatch.emulator.fixture_writer import record_fleet
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig
from servewatch.emulator.gateway_metrics import GatewaySpec
from servewatch.emulator.ground_truth import capacity_for_config, fleet_capacity_for_config
from servewatch.emulator.live_server import LiveFleetServer, run_live
from servewatch.emulator.span_output import otlp_http_span_output
from servewatch.emulator.vllm_metrics import EngineSettings


def record_emulated_fleet(
    fleet: FleetConfig,
    *,
    folder: Path,
    start_s: float,
    hours: float,
    scrape_interval_s: float,
    seed: int,
) -> dict[str, Any]:
    """Simulate `hours` in virtual time and write the fixture folder; returns its manifest."""
    truth = capacity_for_config(fleet, seed=seed)
    fleet_truth = fleet_capacity_for_config(fleet, seed=seed)
    return record_fleet(
        fleet,
        folder,
        start_s=start_s,
        end_s=start_s + hours * 3600,
        scrape_interval_s=scrape_interval_s,
        seed=seed,
        ground_truth={
            "capacity_rps_per_replica": truth.capacity_rps,
            "attainment_ratio": truth.attainment_ratio,
            # The recorded fleet's own: its topology and router (see emulator/ground_truth.py).
            "fleet_capacity_rps_per_replica": fleet_truth.capacity_rps,
            "fleet_attainment_ratio": fleet_truth.attainment_ratio,
            "router": fleet.router.policy.value,
            "slo": {
                "ttft_s": fleet.slo.ttft_s,
                "tpot_s": fleet.slo.tpot_s,
                "target_ratio": fleet.slo.target_ratio,
            },
        },
        description="servewatch emulate --record",
        generator={"seed": seed, "hours": hours},
    )


def serve_emulated_fleet(
    fleet: FleetConfig,
    *,
    seed: int,
    otlp_endpoint: str | None,
    stop: threading.Event,
    announce: Callable[[list[dict[str, Any]]], None],
) -> None:
    """Serve the fleet on 127.0.0.1 at wall-clock time until `stop` is set."""
    spans = (
        otlp_http_span_output(
            fleet.placements(), endpoint=otlp_endpoint, conversation_ids=fleet.conversation_ids
        )
        if otlp_endpoint
        else None
    )
    started = time.time()
    server = LiveFleetServer(
        fleet.placements(),
        started_s=started,
        engine=EngineSettings.from_engine(fleet.engine),
        spans=spans,
        gateway=GatewaySpec.of(fleet),
    )
    simulation = FleetSimulation(fleet, observer=server, seed=seed, start_s=started)
    server.start()
    try:
        announce([{"kind": t.kind.value, "url": t.url, "labels": t.labels} for t in server.targets])
        run_live(simulation, server, clock=time.time, wait=stop.wait)
    finally:
        server.stop()
        if spans is not None:
            spans.shutdown()
