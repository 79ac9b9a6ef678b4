"""A real Prometheus 2.42 scrapes a live emulated fleet: every page accepted, PromQL answers.

The default fleet (six replicas on three hosts: nine targets with the DCGM exporters) runs at
wall-clock time in a background thread and is served on 127.0.0.1; Prometheus scrapes every
second.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig
from servewatch.emulator.live_server import LiveFleetServer
from servewatch.emulator.records import ReplicaEvent, ReplicaEventKind
from tests.live_prometheus import (
    instant_query,
    live_fleet,
    poll,
    running_prometheus,
    scrape_configs,
)

TTFT_P95 = (
    "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))"
)


@pytest.fixture
def fleet() -> Iterator[tuple[LiveFleetServer, FleetSimulation]]:
    with live_fleet(FleetConfig.default(), seed=11) as pair:
        yield pair


@pytest.fixture
def prometheus(
    tmp_path: Path, fleet: tuple[LiveFleetServer, FleetSimulation]
) -> Iterator[httpx.Client]:
    server, _ = fleet
    with running_prometheus(tmp_path, scrape_configs(server)) as client:
        yield client


def query(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    return instant_query(client, expr)


@pytest.mark.slow
def test_prometheus_accepts_every_page_and_answers_ttft_p95(
    fleet: tuple[LiveFleetServer, FleetSimulation], prometheus: httpx.Client
) -> None:
    server, simulation = fleet
    placements = simulation.placements
    n_targets = len(server.targets)
    assert n_targets == 9

    def all_targets_up() -> list[dict[str, Any]] | None:
        active = prometheus.get("/api/v1/targets").json()["data"]["activeTargets"]
        healthy = [t for t in active if t["health"] == "up" and t["lastError"] == ""]
        return active if len(active) == n_targets and len(healthy) == n_targets else None

    targets = poll("every target to be scraped without error", all_targets_up)
    assert {t["labels"]["job"] for t in targets} == {"vllm", "dcgm"}

    def finite_p95() -> float | None:
        result = query(prometheus, TTFT_P95)
        if len(result) != 1:
            return None
        v = float(result[0]["value"][1])
        return v if math.isfinite(v) else None

    p95_s = poll("a finite TTFT p95 from rate() over the scraped histograms", finite_p95)
    # A lightly loaded fleet: prefill of a few hundred to a few thousand tokens, little queueing.
    assert 0.001 < p95_s < 2.5

    ups = query(prometheus, "up")
    assert len(ups) == n_targets
    assert all(r["value"][1] == "1" for r in ups)
    emulated = query(prometheus, "servewatch_emulated")
    assert len(emulated) == n_targets
    assert {r["metric"]["replica"] for r in query(prometheus, "vllm:num_requests_running")} == {
        p.replica for p in placements
    }
    assert len(query(prometheus, "DCGM_FI_DEV_POWER_USAGE")) == 6
    samples_per_page = query(prometheus, 'scrape_samples_scraped{job="vllm"}')
    assert all(float(r["value"][1]) > 250 for r in samples_per_page)
    metadata = prometheus.get(
        "/api/v1/metadata", params={"metric": "vllm:time_to_first_token_seconds"}
    ).json()["data"]
    assert metadata["vllm:time_to_first_token_seconds"][0]["type"] == "histogram"

    # Prometheus' own counters of rejected samples stay at zero.
    own = prometheus.get("/metrics").text
    for counter in (
        "prometheus_target_scrapes_sample_duplicate_timestamp_total",
        "prometheus_target_scrapes_sample_out_of_order_total",
        "prometheus_target_scrapes_sample_out_of_bounds_total",
        "prometheus_target_scrapes_exceeded_sample_limit_total",
    ):
        line = next(line for line in own.splitlines() if line.startswith(counter + " "))
        assert float(line.split()[1]) == 0, line

    # A lost host (injected into the outputs directly, so its timing is the test's): its
    # replicas' and its exporter's targets stop answering, the others do not.
    lost = [p.replica for p in placements if p.host == "host-2"]
    assert lost == ["vllm-4", "vllm-5"]
    for replica in lost:
        server.replica_event(ReplicaEvent(replica, time.time(), ReplicaEventKind.HOST_LOST))

    def host_down() -> list[dict[str, Any]] | None:
        result = query(prometheus, "up")
        down = {r["metric"]["instance"] for r in result if r["value"][1] == "0"}
        return result if len(down) == 3 else None

    result = poll("host-2's targets to be down", host_down)
    down_labels = {
        (r["metric"]["job"], r["metric"].get("replica"), r["metric"]["host"])
        for r in result
        if r["value"][1] == "0"
    }
    assert down_labels == {
        ("vllm", "vllm-4", "host-2"),
        ("vllm", "vllm-5", "host-2"),
        ("dcgm", None, "host-2"),
    }
