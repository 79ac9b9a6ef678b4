"""Test helpers: a live emulated fleet on 127.0.0.1 and a real Prometheus 2.42 scraping it.

The fleet runs at wall-clock time in a background thread; Prometheus gets one job per target
kind (`vllm`, `dcgm`) with the fleet's target labels, a 1 s scrape interval by default, and a
fresh TSDB under the test's directory. Both stop when their context ends.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from servewatch.emulator.fixture_targets import fleet_targets
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig
from servewatch.emulator.live_server import LiveFleetServer, run_live
from servewatch.emulator.vllm_metrics import EngineSettings
from tests.conftest import free_port, require_program

DEADLINE_S = 45.0
T = TypeVar("T")


def poll(what: str, check: Callable[[], T | None], *, deadline_s: float = DEADLINE_S) -> T:
    """Call `check` until it returns something other than None; fail after the deadline.

    Prometheus offers nothing to wait on for "this much has been scraped", so tests ask.
    """
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        result = check()
        if result is not None:
            return result
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


class FleetHold:
    """Stops a live fleet's clock (`live_fleet(..., hold=...)`) while its servers stay up."""

    def __init__(self) -> None:
        self.frozen = threading.Event()
        self.runner: threading.Thread | None = None

    def freeze(self) -> None:
        """Stop the simulation; returns once its pages will change no more."""
        self.frozen.set()
        if self.runner is not None:
            self.runner.join()


@contextmanager
def live_fleet(
    config: FleetConfig,
    *,
    seed: int,
    tick_s: float = 0.1,
    ports: Mapping[str, int] | None = None,
    hold: FleetHold | None = None,
) -> Iterator[tuple[LiveFleetServer, FleetSimulation]]:
    """`config` emulated at wall-clock time and served; failures run on the same clock.

    `ports` (see `fleet_ports`) fixes where targets listen, so that a Prometheus can be
    started, and scraping, before the fleet's clock starts. `hold.freeze()` stops the
    fleet's clock for good: the servers stay up and serve their last pages, byte for byte, so
    two scrapers reading them later read the same values.
    """
    start_s = time.time()
    server = LiveFleetServer(
        config.placements(),
        started_s=start_s,
        engine=EngineSettings.from_engine(config.engine),
        ports=ports,
    )
    simulation = FleetSimulation(config, observer=server, seed=seed, start_s=start_s)
    stop = threading.Event()
    held = hold or FleetHold()

    def wait(timeout_s: float) -> bool:
        return stop.wait(timeout_s) or held.frozen.is_set()

    runner = threading.Thread(
        target=run_live,
        args=(simulation, server),
        kwargs={"clock": time.time, "wait": wait, "tick_s": tick_s},
        name="emulated-fleet",
    )
    held.runner = runner
    server.start()
    runner.start()
    try:
        yield server, simulation
    finally:
        stop.set()
        runner.join()
        server.stop()


def fleet_ports(config: FleetConfig) -> dict[str, int]:
    """A free 127.0.0.1 port for every target of `config`'s fleet."""
    return {t.target_id: free_port() for t in fleet_targets(config.placements())}


def scrape_configs(server: LiveFleetServer) -> list[dict[str, Any]]:
    """Prometheus scrape configs for the fleet: jobs `vllm` and `dcgm`, its target labels."""
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
    return jobs


@contextmanager
def running_prometheus(
    workdir: Path,
    jobs: list[dict[str, Any]],
    *,
    scrape_interval_s: float = 1.0,
    rule_files: Sequence[Path] = (),
) -> Iterator[httpx.Client]:
    """A Prometheus on a free 127.0.0.1 port scraping `jobs` and evaluating `rule_files` (at
    the scrape interval); the client's base URL is it."""
    binary = require_program("prometheus")
    interval_ms = round(scrape_interval_s * 1000)
    config = {
        "global": {
            "scrape_interval": f"{interval_ms}ms",
            "scrape_timeout": f"{interval_ms * 9 // 10}ms",
            "evaluation_interval": f"{interval_ms}ms",
        },
        "scrape_configs": jobs,
        "rule_files": [str(path) for path in rule_files],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    port = free_port()
    argv = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with served("prometheus", argv, port=port, ready_path="/-/ready", workdir=workdir) as client:
        yield client


@contextmanager
def served(
    what: str, argv: Sequence[str], *, port: int, ready_path: str, workdir: Path
) -> Iterator[httpx.Client]:
    """`argv` started with its output in `workdir/<what>.log`, waited for until `ready_path`
    answers 200 on 127.0.0.1:`port` (failing with the log's tail if it exits first), and
    stopped when the context ends; the client's base URL is its address."""
    log_path = workdir / f"{what}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0)

    def ready() -> bool | None:
        if process.poll() is not None:
            pytest.fail(f"{what} exited: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            return True if client.get(ready_path).status_code == 200 else None
        except httpx.TransportError:
            return None

    try:
        poll(f"{what} to be ready", ready)
        yield client
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def instant_query(client: httpx.Client, expr: str, *, time_s: float | None = None) -> list[Any]:
    """The result list of an instant query (a vector or matrix), failing on an error answer."""
    params: dict[str, str] = {"query": expr}
    if time_s is not None:
        params["time"] = f"{time_s:.3f}"
    body = client.get("/api/v1/query", params=params).json()
    assert body["status"] == "success", body
    result: list[Any] = body["data"]["result"]
    return result
