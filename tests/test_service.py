"""`servewatch run` as a user runs it: a real process scraping a real endpoint and receiving
real OTLP exports, one writer per store, clean exit on SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.scrape.scraper import ScrapeResult
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.collectors.traces.ingest import ingest_trace_files
from servewatch.scraping import TargetHealth
from servewatch.service import SelfMetrics, Service, serve_health
from servewatch.store import Store
from tests.conftest import FIXTURES, free_port
from tests.test_otlp_receiver import make_spans

SERVEWATCH = [sys.executable, "-m", "servewatch.cli"]


def poll(check: object, *, deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def start_run(config: Path, *, health_port: int) -> subprocess.Popen[str]:
    """`servewatch run --config CONFIG` as a process, its /metrics, /healthz and API on
    `health_port`."""
    return subprocess.Popen(
        [*SERVEWATCH, "run", "--config", str(config), "--health-port", str(health_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
        text=True,
    )


def answers(url: str, status: int) -> Callable[[], bool]:
    """A `poll` check: `url` answers with `status`."""

    def check() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code == status
        except httpx.HTTPError:
            return False

    return check


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


@pytest.mark.slow
def test_run_scrapes_receives_and_stops_cleanly(endpoint: str, tmp_path: Path) -> None:
    otlp_port, health_port = free_port(), free_port()
    db = tmp_path / "fleet.duckdb"
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f"""
[store]
path = "{db}"
[scrape]
interval_s = 1
timeout_s = 1
[[targets]]
kind = "vllm"
url = "{endpoint}"
replica = "vllm-0"
[otlp]
listen = "127.0.0.1:{otlp_port}"
grpc_listen = "127.0.0.1:0"
""",
        encoding="utf-8",
    )
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    process = start_run(config, health_port=health_port)
    try:
        health = f"http://127.0.0.1:{health_port}"
        poll(answers(f"{health}/healthz", 200), deadline_s=30, what="/healthz")
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{otlp_port}/v1/traces", timeout=5)
        assert exporter.export(make_spans(20)) == SpanExportResult.SUCCESS
        exporter.shutdown()

        def scraped_and_received() -> bool:
            text = httpx.get(f"{health}/metrics", timeout=1).text
            return (
                metric_value(text, "servewatch_samples_ingested_total") > 0
                and metric_value(text, "servewatch_spans_ingested_total") >= 20
            )

        poll(scraped_and_received, deadline_s=30, what="a scrape and the spans")
        text = httpx.get(f"{health}/metrics", timeout=1).text
        # Each scrape's lag against its slot is exposed; one target at 1 s never skips a slot.
        assert metric_value(text, "servewatch_scrape_lag_seconds_count") >= 1
        assert metric_value(text, "servewatch_scrape_targets") == 1
        assert metric_value(text, "servewatch_scrape_skipped_slots_total") == 0

        second = subprocess.run(
            [*SERVEWATCH, "run", "--config", str(config), "--health-port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        assert second.returncode == 1
        # The service left a note: the refusal names it and where its API answers.
        said = " ".join(second.stderr.split())
        assert "is held by `servewatch run`" in said, said
        assert f"its API at http://127.0.0.1:{health_port}" in said, said
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    with Store.open(db) as store:
        assert store.count("requests") == 20
        assert store.count("scrapes") >= 1
        assert store.count("points") > 0


@pytest.mark.slow
def test_reading_commands_answer_while_run_holds_the_store(
    tmp_path: Path, runner: CliRunner
) -> None:
    db = tmp_path / "fleet.duckdb"
    spans = str(FIXTURES / "vllm_spans_small" / "spans.jsonl")
    assert runner.invoke(app, ["--db", str(db), "ingest", "traces", spans]).exit_code == 0
    sli = ["--db", str(db), "sli", "--json", "--ttft-ms", "500", "--window", "5m"]
    alone = runner.invoke(app, sli)
    assert alone.exit_code == 0, alone.output
    health_port = free_port()
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f'[store]\npath = "{db}"\n[otlp]\nlisten = "127.0.0.1:0"\ngrpc_listen = "127.0.0.1:0"\n',
        encoding="utf-8",
    )
    process = start_run(config, health_port=health_port)
    try:
        api = f"http://127.0.0.1:{health_port}"
        poll(answers(f"{api}/metrics", 200), deadline_s=30, what="the service's API")
        held = runner.invoke(app, sli)
        assert held.exit_code == 0, held.output
        assert f"reading it through {api}" in " ".join(held.stderr.split())
        assert json.loads(held.stdout) == json.loads(alone.stdout)
        out = tmp_path / "report"
        report = runner.invoke(
            app, ["--db", str(db), "report", "--out", str(out), "--no-images", "--json"]
        )
        assert report.exit_code == 0, report.output
        assert (out / "report.html").is_file()
        health = runner.invoke(app, ["--db", str(db), "health", "--json"])
        assert health.exit_code == 0, health.output
        # status asks the service, which adds what it says of itself.
        status = runner.invoke(app, ["--db", str(db), "status", "--json"])
        assert status.exit_code == 0, status.output
        (held_status,) = json.loads(status.stdout)["stores"]
        assert held_status["verdict"] == "empty"  # no targets: it only receives spans
        assert held_status["last_request"] is not None
        assert held_status["collector"]["pid"] == process.pid
        assert held_status["collector"]["healthz"].startswith("ok")
        bad = httpx.get(f"{api}/api/v1/window", params={"from": "soon"}, timeout=5)
        assert bad.status_code == 400
        assert "from: 'soon' is not an ISO 8601 time" in bad.text
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert not Path(f"{db}.holder.json").exists()  # the note goes with the service


def service_config(tmp_path: Path, *, interval_s: float = 15) -> Path:
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "s.duckdb"}"\n[scrape]\ninterval_s = {interval_s}\n'
        '[otlp]\nlisten = "127.0.0.1:0"\ngrpc_listen = "127.0.0.1:0"\n',
        encoding="utf-8",
    )
    return config


def test_a_failing_job_is_logged_with_its_traceback_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = Service(service_config(tmp_path))
    try:

        def boom() -> None:
            raise RuntimeError("disk on fire")

        job = service._timed("boom", boom)
        job()
        job()
        assert service.metrics.job_failures.labels("boom")._value.get() == 2
        records = [r for r in caplog.records if "job boom failed" in r.getMessage()]
        assert records
        assert records[0].exc_info is not None
        assert "disk on fire" in str(records[0].exc_info[1])
        ok = service._timed("fine", lambda: None)
        ok()  # the next job runs as usual
        assert service.metrics.job_last_success.labels("fine")._value.get() > 0
    finally:
        service.stop()


def test_an_invalid_config_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = service_config(tmp_path, interval_s=17)
    service = Service(path)
    try:
        path.write_text("[scrape]\ninterval_s = -1\n", encoding="utf-8")
        service.reload_config()
        assert service.state.config.scrape.interval_s == 17
        assert service.metrics.config_errors._value.get() == 1
        path.write_text("[[broken", encoding="utf-8")
        service.reload_config()
        assert service.metrics.config_errors._value.get() == 2
        assert service.metrics.config_age._value.get() >= 0
        path.write_text(
            f'[store]\npath = "{tmp_path / "s.duckdb"}"\n[scrape]\ninterval_s = 19\n',
            encoding="utf-8",
        )
        service.reload_config()
        assert service.state.config.scrape.interval_s == 19
    finally:
        service.stop()


def test_report_and_recommendation_jobs_write_their_outputs(tmp_path: Path) -> None:
    requirement = tmp_path / "req.toml"
    requirement.write_text(
        'name = "small"\nfailure_unit = "host"\n[demand]\nreq_per_min = 60\n'
        "[replica]\ncapacity_req_per_min = 10\n",
        encoding="utf-8",
    )
    config = service_config(tmp_path)
    config.write_text(
        config.read_text(encoding="utf-8")
        + f'[jobs]\nreport_dir = "{tmp_path / "report"}"\nrequirement = "{requirement}"\n',
        encoding="utf-8",
    )
    service = Service(config)
    try:
        spans = FIXTURES / "vllm_spans_small" / "spans.jsonl"

        def ingest(store: Store) -> None:
            ingest_trace_files([spans], store=store)

        service.writer.submit_task(ingest)
        service.report_once()
        service.recommend_once()
        service.writer.flush()
        assert service.writer.counters.failed_tasks == 0
        assert (tmp_path / "report" / "report.html").exists()
        assert service.store.count("recommendations") == 1
    finally:
        service.stop()


def dead_targets_config(tmp_path: Path, *, count: int, failing_after: int) -> Path:
    targets = "".join(
        f'[[targets]]\nkind = "vllm"\nreplica = "vllm-{i}"\n'
        f'url = "http://127.0.0.1:{free_port()}/metrics"\n'
        for i in range(count)
    )
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "s.duckdb"}"\n'
        f"[scrape]\ninterval_s = 1\ntimeout_s = 1\nfailing_after = {failing_after}\n"
        f'[otlp]\nlisten = "127.0.0.1:0"\ngrpc_listen = "127.0.0.1:0"\n{targets}',
        encoding="utf-8",
    )
    return config


def scrape_result(target: Target, *, error: str | None) -> ScrapeResult:
    return ScrapeResult(
        target=target,
        started_ts=datetime(2026, 11, 18, 11, 0),
        duration_s=0.01,
        body=None if error else "vllm:num_requests_running 1\n",
        openmetrics=False,
        error=error,
    )


TARGETS = [
    Target(
        f"http://10.0.0.{i}:8000/metrics",
        TargetKind.VLLM,
        f"http://10.0.0.{i}:8000/metrics",
        replica=f"vllm-{i}",
    )
    for i in range(3)
]
REFUSED = "ConnectError: connection refused"


def test_a_failing_streak_is_warned_once_and_its_recovery_noted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    health = TargetHealth(failing_after=3)
    health.keep(TARGETS)
    for _ in range(2):
        health.record(scrape_result(TARGETS[0], error=REFUSED))
    assert health.failing_count() == 0
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    for _ in range(3):  # the third failure in a row warns; the fourth and fifth do not again
        health.record(scrape_result(TARGETS[0], error=REFUSED))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"target vllm-0 ({TARGETS[0].url}) failed 3 scrapes in a row: {REFUSED}"]
    assert health.failing_count() == 1
    caplog.clear()
    health.record(scrape_result(TARGETS[0], error=None))
    assert [r.getMessage() for r in caplog.records] == [
        "target vllm-0 (http://10.0.0.0:8000/metrics) answers again after 5 failed scrapes"
    ]
    assert health.failing_count() == 0


def test_healthz_says_degraded_then_no_target_answered() -> None:
    metrics = SelfMetrics()
    health = TargetHealth(failing_after=1)
    health.keep(TARGETS)
    metrics.targets_failing.set_function(health.failing_count)
    server = serve_health(metrics, health, port=0)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert httpx.get(f"{url}/healthz").text == "ok\n"
        health.record(scrape_result(TARGETS[1], error=REFUSED))
        degraded = httpx.get(f"{url}/healthz")
        assert degraded.status_code == 200
        assert degraded.text == (
            "degraded: 1 of 3 targets failing: vllm-1 (ConnectError: connection refused)\n"
        )
        health.record(scrape_result(TARGETS[0], error=REFUSED))
        health.record(scrape_result(TARGETS[2], error="ReadTimeout: timed out"))
        down = httpx.get(f"{url}/healthz")
        assert down.status_code == 503
        assert down.text == (
            "no target answered: 3 of 3 targets failing: vllm-0 (ConnectError: connection "
            "refused); vllm-1 (ConnectError: connection refused); vllm-2 (ReadTimeout: timed "
            "out)\n"
        )
        assert metric_value(httpx.get(f"{url}/metrics").text, "servewatch_targets_failing") == 3
        health.keep(TARGETS[:1])  # targets gone from the configuration are forgotten
        assert health.failing_count() == 1
    finally:
        server.shutdown()
        server.server_close()


def test_no_target_answering_is_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    health = TargetHealth(failing_after=2)
    health.keep(TARGETS)
    for _ in range(3):
        for target in TARGETS:
            health.record(scrape_result(target, error=REFUSED))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings.count("no target answered: all 3 targets failed their last 2 scrapes") == 1


@pytest.mark.slow
def test_run_with_every_target_dead_warns_and_reports_unhealthy(tmp_path: Path) -> None:
    health_port = free_port()
    config = dead_targets_config(tmp_path, count=2, failing_after=2)
    process = start_run(config, health_port=health_port)
    try:
        health = f"http://127.0.0.1:{health_port}"
        poll(answers(f"{health}/healthz", 503), deadline_s=30, what="/healthz to answer 503")
        assert httpx.get(f"{health}/healthz", timeout=1).text.startswith(
            "no target answered: 2 of 2 targets failing: vllm-0 (ConnectError"
        )
        text = httpx.get(f"{health}/metrics", timeout=1).text
        assert metric_value(text, "servewatch_targets_failing") == 2
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "target vllm-0 (http://127.0.0.1:" in stderr
    assert "failed 2 scrapes in a row: ConnectError" in stderr
    assert "no target answered: all 2 targets failed their last 2 scrapes" in stderr
