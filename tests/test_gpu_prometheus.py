"""GPU figures per replica against a real Prometheus 2.42, on one live emulated fleet.

The fleet mixes single-GPU replicas (two on host-0), a tensor-parallel replica (both GPUs of
host-1) and a MIG host (host-2: three 1g.10gb slices of one GPU, a replica each), every
replica a Kubernetes pod whose GPUs dcgm-exporter labels with its pod. A real Prometheus
scrapes it every second while it serves load; then the fleet's clock stops (its servers stay
up, serving their last pages byte for byte), Prometheus scrapes the still pages, and
`servewatch scrape --once` reads the same pages. So both hold the same values, and
servewatch's per-replica GPU power and utilisation (`sli --by replica`) must equal exactly
what PromQL computes from Prometheus' per-GPU series joined to the vLLM targets by pod and
namespace: the sum of the replica's GPUs' power, the mean of their utilisation. The same
holds for the samples `servewatch import prometheus --raw` reads back from Prometheus, whose
vLLM targets are named by their pod and namespace labels.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.emulator.fleet_config import FleetConfig, HostSpec, TopologySpec
from servewatch.emulator.live_server import LiveFleetServer
from servewatch.emulator.workload import ArrivalKind, ArrivalSpec, WorkloadSpec
from tests.live_prometheus import (
    FleetHold,
    instant_query,
    live_fleet,
    poll,
    running_prometheus,
    scrape_configs,
)

pytestmark = pytest.mark.slow

NAMESPACE = "serving"
LOADED_S = 4.0  # how long the fleet serves load before its clock stops
FLEET = FleetConfig(
    topology=TopologySpec(
        zones=("zone-a", "zone-b"),
        layout=(
            HostSpec("zone-a", replica_gpus=(1, 1)),
            HostSpec("zone-a", replica_gpus=(2,)),
            HostSpec("zone-b", replica_gpus=(1, 1, 1), mig_profile="1g.10gb"),
        ),
        namespace=NAMESPACE,
    ),
    workload=WorkloadSpec(arrival=ArrivalSpec(kind=ArrivalKind.POISSON, rate_rps=1.5)),
)
# The vLLM targets of each pod, joined to its GPUs: only GPUs of a replica count.
REPLICA_GPUS = '(%s) and on (namespace, pod) up{job="vllm"}'
POWER = REPLICA_GPUS % "sum by (namespace, pod) (DCGM_FI_DEV_POWER_USAGE)"
UTIL = REPLICA_GPUS % (
    "sum by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL * 0.01)"
    " / count by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL)"
)


def _by_replica(result: list[dict[str, Any]]) -> dict[str, float]:
    return {
        f"{r['metric']['namespace']}/{r['metric']['pod']}": float(r["value"][1]) for r in result
    }


def _servewatch_config(tmp_path: Path, server: LiveFleetServer) -> Path:
    lines = ["[store]", f'path = "{tmp_path / "fleet.duckdb"}"']
    for target in server.targets:
        lines += ["[[targets]]", f'url = "{target.url}"', f'kind = "{target.kind.value}"']
        lines += [f'{name} = "{value}"' for name, value in target.labels.items()]
    path = tmp_path / "servewatch.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _sli_gpus(runner: CliRunner, db: str, window: list[str]) -> dict[str, tuple[float, float]]:
    """Per replica (GPU power W, GPU utilisation) from `sli --by replica`; no GPU unmatched."""
    sli = runner.invoke(
        app, ["--db", db, "sli", "--source", "histograms", "--by", "replica", "--json", *window]
    )
    assert sli.exit_code == 0, sli.output
    section = json.loads(sli.stdout)["histograms"]
    assert section["unmatched_gpus"] == []
    return {
        group["replica"]: (group["gpu_power_w"]["mean"], group["gpu_util_ratio"]["mean"])
        for group in section["groups"]
        if group["replica"] is not None
    }


def test_gpu_power_and_utilisation_per_replica_equal_prometheus_per_gpu_sums(
    tmp_path: Path,
) -> None:
    hold = FleetHold()
    # Snapshots a second apart, so a GPU's duty cycle (and utilisation) is not all or nothing.
    with (
        live_fleet(FLEET, seed=5, hold=hold, tick_s=1.0) as (server, _),
        running_prometheus(tmp_path, scrape_configs(server)) as prometheus,
    ):
        loaded_until = time.monotonic() + LOADED_S

        def loaded_and_scraped() -> bool | None:
            up = instant_query(prometheus, 'up{job="dcgm"} == 1')
            return True if len(up) == 3 and time.monotonic() > loaded_until else None

        poll("Prometheus to scrape every GPU exporter under load", loaded_and_scraped)
        hold.freeze()
        frozen_s = time.time()

        def scraped_still_pages() -> float | None:
            # Every GPU and every engine scraped since the freeze: the import below reads
            # from the freeze on, and a replica without an engine sample in it would leave
            # its GPUs to no replica.
            stamps = instant_query(prometheus, "timestamp(DCGM_FI_DEV_POWER_USAGE)")
            engines = instant_query(prometheus, 'timestamp(up{job="vllm"})')
            oldest = min((float(r["value"][1]) for r in [*stamps, *engines]), default=0.0)
            complete = len(stamps) == 7 and len(engines) == 6
            return time.time() if complete and oldest > frozen_s + 0.01 else None

        at_s = poll("Prometheus to scrape the still pages", scraped_still_pages)
        power = _by_replica(instant_query(prometheus, POWER, time_s=at_s))
        util = _by_replica(instant_query(prometheus, UTIL, time_s=at_s))
        per_gpu = instant_query(prometheus, "DCGM_FI_DEV_POWER_USAGE", time_s=at_s)

        runner = CliRunner()
        config = _servewatch_config(tmp_path, server)
        scraped = runner.invoke(app, ["scrape", "--config", str(config), "--once"])
        assert scraped.exit_code == 0, scraped.output
        window = [
            "--from",
            datetime.fromtimestamp(frozen_s, tz=UTC).isoformat(),
            "--to",
            datetime.fromtimestamp(time.time() + 1, tz=UTC).isoformat(),
        ]
        # The same still pages through Prometheus: its raw samples since the freeze.
        imported_db = str(tmp_path / "imported.duckdb")
        until = datetime.fromtimestamp(at_s, tz=UTC).isoformat()
        url = str(prometheus.base_url)
        span = ["--from", window[1], "--to", until]
        imported = runner.invoke(
            app, ["--db", imported_db, "import", "prometheus", url, "--raw", *span]
        )
        assert imported.exit_code == 0, imported.output
    ours = _sli_gpus(runner, str(tmp_path / "fleet.duckdb"), window)
    theirs = _sli_gpus(runner, imported_db, window)

    replicas = {f"{NAMESPACE}/vllm-{i}" for i in range(6)}
    assert set(power) == set(util) == replicas
    assert set(ours) == set(theirs) == replicas
    # every GPU and MIG slice draws its own power: seven distinct readings
    assert len({float(r["value"][1]) for r in per_gpu}) == 7
    assert len({r["metric"]["GPU_I_ID"] for r in per_gpu if "GPU_I_ID" in r["metric"]}) == 3
    for replica in sorted(replicas):
        assert ours[replica] == (power[replica], util[replica]), replica
        # imported: the mean of each GPU's identical samples, exact but for float rounding
        assert theirs[replica] == pytest.approx((power[replica], util[replica]), rel=1e-12)
    # the tensor-parallel replica's power is its two GPUs' sum, not one GPU's twice
    tp = [float(r["value"][1]) for r in per_gpu if r["metric"]["pod"] == "vllm-2"]
    assert len(tp) == 2
    assert ours[f"{NAMESPACE}/vllm-2"][0] == sum(tp)
