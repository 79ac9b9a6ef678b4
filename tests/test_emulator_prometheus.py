"""A real Prometheus 2.42 scrapes a live emulated fleet: every page accepted, PromQL answers.

The default fleet (six replicas on three hosts: nine targets with the DCGM exporters) runs at
wall-clock time in a background thread and is served on 127.0.0.1; Prometheus scrapes every
second.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from emulator.fleet import FleetSimulation
from emulator.fleet_config import FleetConfig
from emulator.live_server import LiveFleetServer, run_live
from emulator.records import ReplicaEvent, ReplicaEventKind
from emulator.vllm_metrics import EngineSettings
from tests.conftest import require_program

TTFT_P95 = (
    "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))"
)
DEADLINE_S = 45.0
T = TypeVar("T")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def poll(what: str, check: Callable[[], T | None], *, deadline_s: float = DEADLINE_S) -> T:
    """Call `check` until it returns something other than None; fail after the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        result = check()
        if result is not None:
            return result
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def fleet() -> Iterator[tuple[LiveFleetServer, FleetSimulation]]:
    config = FleetConfig.default()
    start_s = time.time()
    server = LiveFleetServer(
        config.placements(), started_s=start_s, engine=EngineSettings.from_engine(config.engine)
    )
    simulation = FleetSimulation(config, observer=server, seed=11, start_s=start_s)
    stop = threading.Event()
    runner = threading.Thread(
        target=run_live,
        args=(simulation, server),
        kwargs={"clock": time.time, "wait": stop.wait, "tick_s": 0.1},
        name="emulated-fleet",
    )
    server.start()
    runner.start()
    yield server, simulation
    stop.set()
    runner.join()
    server.stop()


@pytest.fixture
def prometheus(
    tmp_path: Path, fleet: tuple[LiveFleetServer, FleetSimulation]
) -> Iterator[httpx.Client]:
    binary = require_program("prometheus")
    server, _ = fleet
    jobs = []
    for job in ("vllm", "dcgm"):
        groups = [
            {
                "targets": group["targets"],
                "labels": {k: v for k, v in group["labels"].items() if k != "job"},
            }
            for group in server.file_sd()
            if group["labels"]["job"] == job
        ]
        jobs.append({"job_name": job, "static_configs": groups})
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "scrape_configs": jobs,
    }
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0)

    def ready() -> bool | None:
        if process.poll() is not None:
            pytest.fail(f"prometheus exited: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            return True if client.get("/-/ready").status_code == 200 else None
        except httpx.TransportError:
            return None

    try:
        poll("prometheus to be ready", ready)
        yield client
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def query(client: httpx.Client, expr: str) -> list[dict[str, Any]]:
    body = client.get("/api/v1/query", params={"query": expr}).json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


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
