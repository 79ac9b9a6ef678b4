"""The live side of `servewatch run` against an emulated fleet on 127.0.0.1: the report page at
`/`, the JSON API, the reading commands beside the service, and the fleet gauges on /metrics
checked against the library's own figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servewatch.collectors.scrape.targets import TargetKind
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig, TopologySpec
from servewatch.emulator.live_server import LiveFleetServer, run_live
from servewatch.emulator.span_output import otlp_http_span_output
from servewatch.emulator.vllm_metrics import EngineSettings
from servewatch.emulator.workload import ArrivalSpec
from servewatch.health.finding import FindingKind
from servewatch.pipeline.metric_sli import Scope, gauge_stats, series_dimensions
from servewatch.pipeline.signals import Signal
from servewatch.pipeline.tables import RECOMMENDATIONS_SCHEMA
from servewatch.service import Service
from servewatch.slo.burn_rate import evaluation_minute
from servewatch.slo_service import load_specs, status_at
from servewatch.store import Store, utc_now

SERVEWATCH = [sys.executable, "-m", "servewatch.cli"]
TOKEN = "live-test-token"
SLOS = """\
version: servewatch/v1
slos:
  - name: ttft-500ms
    sli: {kind: latency, metric: ttft, threshold_s: 0.5, source: traces}
    objective_ratio: 0.99
    period: 7d
  - name: availability
    sli: {kind: availability, source: metrics}
    objective_ratio: 0.999
    period: 30d
"""
# A stored decision record's fields the pool gauges read (the rest of a record is not needed).
RECORD = {
    "name": "chat",
    "created_at": "2026-12-01T06:00:00+00:00",
    "verdict": "4 replicas on 2 hosts hold the SLO after losing a host.",
    "recommendation": {"hosts": 2, "replicas": 4},
    "capacity_fit": {"pool": "chat"},
    "capacity_by_pool": [
        {
            "pool": "chat",
            "capacity_low_rps": 1.5,
            "capacity_rps_per_replica": 2.0,
            "capacity_high_rps": 2.5,
        }
    ],
}


def cli(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SERVEWATCH_API_TOKEN"}
    if token is not None:
        env["SERVEWATCH_API_TOKEN"] = token
    return subprocess.run(
        [*SERVEWATCH, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def get(url: str, **params: Any) -> httpx.Response:
    return httpx.get(url, params=params, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def assert_same(left: Any, right: Any, where: str = "$") -> None:
    """Equal documents, floats to 1e-9: a mean's last bits depend on how Polars splits the
    work, which differs between two processes reading the same data."""
    if isinstance(left, float) or isinstance(right, float):
        assert left == pytest.approx(right, rel=1e-9, nan_ok=True), where
    elif isinstance(left, dict) and isinstance(right, dict):
        assert left.keys() == right.keys(), where
        for key in left:
            assert_same(left[key], right[key], f"{where}.{key}")
    elif isinstance(left, list) and isinstance(right, list):
        assert len(left) == len(right), where
        for i, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert left == right, where


def wait_for(check: Any, *, deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}")


def fleet() -> FleetConfig:
    config = FleetConfig.default()
    return replace(
        config,
        pool="chat",
        topology=TopologySpec(zones=("zone-a",), hosts_per_zone=(1,), replicas_per_host=2),
        workload=replace(config.workload, arrival=ArrivalSpec(rate_rps=4.0)),
        failures=(),
    )


def write_config(tmp_path: Path, server: LiveFleetServer) -> Path:
    (tmp_path / "slos.yaml").write_text(SLOS, encoding="utf-8")
    targets = "".join(
        f'[[targets]]\nkind = "{t.kind.value}"\nurl = "{t.url}"\n'
        + "".join(f'{k} = "{v}"\n' for k, v in t.labels.items())
        + ("" if t.kind is TargetKind.DCGM else 'pool = "chat"\n')
        for t in server.targets
    )
    path = tmp_path / "servewatch.toml"
    path.write_text(
        f'[store]\npath = "fleet.duckdb"\n[scrape]\ninterval_s = 1\ntimeout_s = 1\n'
        f'[otlp]\nlisten = "127.0.0.1:0"\ngrpc_listen = "127.0.0.1:0"\n'
        f'[slo]\nfiles = ["slos.yaml"]\n[api]\nbearer_token = "{TOKEN}"\n{targets}',
        encoding="utf-8",
    )
    return path


def expected_pool(store: Store, *, at: datetime) -> dict[str, float]:
    """Queue depth and KV usage of pool chat as the pipeline computes them per replica."""
    dims = series_dimensions(store.read_series(), store.read_targets()).collect().lazy()
    points = store.read_points(from_ts=at - timedelta(minutes=2), to_ts=at)
    end_s = (at - datetime(1970, 1, 1)).total_seconds()
    figures = {}
    for name, signal in (
        ("queue", Signal.REQUESTS_WAITING),
        ("kv", Signal.KV_CACHE_USAGE_RATIO),
    ):
        means = gauge_stats(
            points, dims, signal=signal, range_s=60, window_ends_s=[end_s], scope=Scope.REPLICA
        ).collect()
        figures[name] = means["mean"].sum() if name == "queue" else means["mean"].mean()
    requests = store.read_requests(from_ts=at - timedelta(minutes=5), to_ts=at).collect()
    figures["demand_rps"] = requests.height / 300.0
    return figures


@pytest.mark.slow
def test_live_page_api_cli_and_gauges_while_run_scrapes_an_emulated_fleet(
    tmp_path: Path,
) -> None:
    config = fleet()
    started = time.time()
    server = LiveFleetServer(
        config.placements(), started_s=started, engine=EngineSettings.from_engine(config.engine)
    )
    server.start()
    stop = threading.Event()
    service = Service(write_config(tmp_path, server))
    spans = otlp_http_span_output(
        config.placements(),
        endpoint=service.receiver.endpoint,
        conversation_ids=config.conversation_ids,
    )
    server.spans = spans
    simulation = FleetSimulation(config, observer=server, seed=3, start_s=started)
    driver = threading.Thread(
        target=run_live,
        args=(simulation, server),
        kwargs={"clock": time.time, "wait": stop.wait},
        daemon=True,
    )
    db = tmp_path / "fleet.duckdb"
    specs, _ = load_specs([tmp_path / "slos.yaml"])
    try:
        driver.start()
        service.start(health_port=0)
        # The test evaluates at instants it chooses; the schedule would move the figures.
        service.scheduler.pause()
        api = service.api_url
        assert api is not None

        def counted() -> tuple[int, int]:
            return service.writer.call(
                lambda s: (s.count("requests"), s.count("points")), timeout_s=30
            )

        wait_for(lambda: min(counted()) > 0 and counted()[0] >= 30, deadline_s=60, what="data")
        service.writer.call(
            lambda s: s.write_recommendation(
                pl.DataFrame(
                    [(utc_now(), "chat", RECORD["verdict"], json.dumps(RECORD))],
                    schema=RECOMMENDATIONS_SCHEMA,
                    orient="row",
                )
            ),
            timeout_s=30,
        )
        service.evaluate_once()
        service.writer.flush()

        # While the fleet runs: the page and every answer, and the CLI beside the service.
        assert httpx.get(f"{api}/", timeout=30).status_code == 401
        assert httpx.get(f"{api}/healthz", timeout=30).status_code == 200
        page = get(f"{api}/")
        assert page.status_code == 200, page.text
        assert page.headers["content-type"].startswith("text/html")
        assert "<title>" in page.text
        assert get(f"{api}/", _="again").headers["etag"] == page.headers["etag"]
        for path in ("sli", "slo", "alerts", "health", "recommendation"):
            answer = get(f"{api}/api/v1/{path}")
            assert answer.status_code == 200, (path, answer.text)
            assert answer.headers["content-type"] == "application/json"
        assert get(f"{api}/api/v1/recommendation").json() == RECORD
        assert get(f"{api}/api/v1/sli", by="nothing").status_code == 400
        missing = get(f"{api}/api/v1/slo", slo="nope")
        assert missing.status_code == 404
        assert "does not evaluate ['nope']" in missing.text

        live_sli = cli("--db", str(db), "sli", "--json", "--ttft-ms", "500")
        assert live_sli.returncode == 0, live_sli.stderr
        assert "reading it through" in " ".join(live_sli.stderr.split())
        assert json.loads(live_sli.stdout)["overall"]["requests"] > 0
        refused = cli("--db", str(db), "alerts", "--json", token=None)
        assert refused.returncode == 1
        assert "set SERVEWATCH_API_TOKEN" in " ".join(refused.stderr.split())

        # The fleet stops; once its last data is in, the answers are fixed and comparable.
        stop.set()
        driver.join(timeout=30)
        server.stop()
        spans.shutdown()
        service.scrape_loop.stop()
        service.pages.close()  # writes the pages gathered so far
        service.writer.flush()
        last = service.writer.call(lambda s: s.points_range(), timeout_s=30)
        assert last is not None
        at = last[1] + timedelta(seconds=1)

        window = {"from": "2020-01-01T00:00:00Z", "to": (at + timedelta(hours=1)).isoformat()}
        by_cli = cli(
            "--db", str(db), "sli", "--json", "--ttft-ms", "500",
            "--from", window["from"], "--to", window["to"],
        )  # fmt: skip
        assert by_cli.returncode == 0, by_cli.stderr
        by_api = get(f"{api}/api/v1/sli", ttft_ms="500", **window)
        assert_same(json.loads(by_cli.stdout), by_api.json())
        status_cli = cli(
            "--db", str(db), "slo", "status", "--slo", str(tmp_path / "slos.yaml"),
            "--at", at.isoformat(), "--json",
        )  # fmt: skip
        assert status_cli.returncode == 0, status_cli.stderr
        assert_same(
            json.loads(status_cli.stdout), get(f"{api}/api/v1/slo", at=at.isoformat()).json()
        )
        alerts_cli = cli("--db", str(db), "alerts", "--json")
        assert json.loads(alerts_cli.stdout) == get(f"{api}/api/v1/alerts").json()
        last_cli = cli("--db", str(db), "recommend", "--last", "--json")
        assert last_cli.returncode == 0, last_cli.stderr
        assert json.loads(last_cli.stdout) == RECORD

        # Pool gauges at an instant inside the data, against the pipeline's own figures.
        service.evaluate_once(now=at)
        service.writer.flush()
        assert service.fleet_gauges.snapshot.at == at
        served = samples(get(f"{api}/metrics").text)
        pool = service.writer.call(lambda s: expected_pool(s, at=at), timeout_s=60)
        chat = (("pool", "chat"),)
        assert served[("servewatch_pool_queue_depth", chat)] == pytest.approx(pool["queue"])
        assert served[("servewatch_pool_kv_usage_ratio", chat)] == pytest.approx(pool["kv"])
        assert served[("servewatch_pool_recommended_replicas", chat)] == 4
        serving = len(config.placements())
        for bound, per_replica in (("low", 1.5), ("mid", 2.0), ("high", 2.5)):
            key = ("servewatch_pool_capacity_rps", (("bound", bound), ("pool", "chat")))
            assert served[key] == pytest.approx(per_replica * serving)
        assert served[("servewatch_pool_headroom_ratio", chat)] == pytest.approx(
            1 - pool["demand_rps"] / (2.0 * serving)
        )
        for kind in FindingKind:
            assert ("servewatch_findings_active", (("mode", kind.value),)) in served

        # SLO gauges at the next whole minute, every event of the data inside it.
        at = evaluation_minute(at) + timedelta(minutes=1)
        service.evaluate_once(now=at)
        service.writer.flush()
        served = samples(get(f"{api}/metrics").text)
        statuses = service.writer.call(lambda s: status_at(s, specs=specs, at=at), timeout_s=60)
        assert {s.slo for s in statuses} == {"ttft-500ms", "availability"}
        for status in statuses:
            slo = (("slo", status.slo),)
            assert status.total > 0, status.slo
            assert served[("servewatch_slo_events_total", slo)] == status.total
            assert served[("servewatch_slo_good_events_total", slo)] == status.good
            assert served[("servewatch_slo_attainment_ratio", slo)] == pytest.approx(
                status.good / status.total
            )
            assert served[("servewatch_slo_budget_remaining_ratio", slo)] == pytest.approx(
                status.budget_remaining_ratio
            )
            for burn in status.windows:
                key = ("servewatch_slo_burn_rate", (("slo", status.slo), ("window", burn.window)))
                if burn.burn_rate is None:
                    assert key not in served
                else:
                    assert served[key] == pytest.approx(burn.burn_rate)
        # Evaluated again, nothing new: the counters stay where they are (monotonic, once).
        service.evaluate_once(now=at + timedelta(seconds=30))
        service.writer.flush()
        again = samples(get(f"{api}/metrics").text)
        for status in statuses:
            slo = (("slo", status.slo),)
            assert again[("servewatch_slo_events_total", slo)] == status.total
    finally:
        stop.set()
        server.stop()
        spans.shutdown()
        service.stop()
