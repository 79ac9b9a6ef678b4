"""`servewatch record`: a live emulated fleet (pages and OTLP spans) recorded, then replayed."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.config import load_config
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig
from servewatch.emulator.live_server import LiveFleetServer, run_live
from servewatch.emulator.span_output import otlp_http_span_output
from servewatch.emulator.vllm_metrics import EngineSettings
from servewatch.scraping import resolve_targets
from servewatch.store import Store
from tests.conftest import free_port, stored_tables


@pytest.fixture
def live_fleet_config(tmp_path: Path) -> Iterator[Path]:
    """A served emulated fleet sending spans to the port a servewatch.toml listens on."""
    port = free_port()
    fleet = FleetConfig.default()
    spans = otlp_http_span_output(
        fleet.placements(),
        endpoint=f"http://127.0.0.1:{port}/v1/traces",
        schedule_delay_ms=100,
        timeout_s=2,
    )
    start_s = time.time()
    server = LiveFleetServer(
        fleet.placements(),
        started_s=start_s,
        engine=EngineSettings.from_engine(fleet.engine),
        spans=spans,
    )
    simulation = FleetSimulation(fleet, observer=server, seed=3, start_s=start_s)
    stop = threading.Event()
    runner = threading.Thread(
        target=run_live,
        args=(simulation, server),
        kwargs={"clock": time.time, "wait": stop.wait, "tick_s": 0.1},
    )
    server.start()
    runner.start()
    lines = [
        "[scrape]",
        "interval_s = 1.0",
        "timeout_s = 1.0",
        "[otlp]",
        f'listen = "127.0.0.1:{port}"',
        'grpc_listen = "127.0.0.1:0"',
    ]
    for target in server.targets:
        lines += ["[[targets]]", f'url = "{target.url}"', f'kind = "{target.kind.value}"']
        lines += [f'{name} = "{value}"' for name, value in target.labels.items()]
    path = tmp_path / "servewatch.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        yield path
    finally:
        stop.set()
        runner.join()
        server.stop()
        spans.shutdown()


def pages_of(folder: Path, config_path: Path) -> list[Page]:
    """The recorded pages read straight from their files, with the live targets."""
    manifest = json.loads((folder / "manifest.json").read_text())
    targets = {t.target_id: t for t in resolve_targets(load_config(config_path))[0]}
    start_ms = round(manifest["time_range"]["start_s"] * 1000)
    interval_ms = round(manifest["scrape_interval_s"] * 1000)
    pages = []
    for k in range(manifest["pages"]["scrapes"]):
        at_ms = start_ms + k * interval_ms
        scrape_ts = datetime.fromtimestamp(at_ms / 1000, tz=UTC).replace(tzinfo=None)
        for entry in manifest["targets"]:
            path = folder / entry["pages"] / f"{at_ms}.prom.gz"
            body = gzip.decompress(path.read_bytes()).decode() if path.exists() else None
            pages.append(
                Page(targets[entry["id"]], scrape_ts, body, openmetrics=False, error="down")
                if body is None
                else Page(targets[entry["id"]], scrape_ts, body, openmetrics=False)
            )
    return pages


@pytest.mark.slow
def test_record_a_live_fleet_then_replay_twice(
    live_fleet_config: Path, tmp_path: Path, runner: CliRunner
) -> None:
    out = tmp_path / "recording"
    recorded = runner.invoke(
        app,
        ["record", "--config", str(live_fleet_config), "--out", str(out), "--minutes", "0.06"],
        catch_exceptions=False,
    )
    assert recorded.exit_code == 0, recorded.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["emulated"] is False
    assert manifest["recorded"] is True
    assert manifest["pages"]["scrapes"] >= 3
    assert manifest["pages"]["count"] == manifest["pages"]["scrapes"] * len(manifest["targets"])
    assert manifest["spans"]["count"] > 0
    vllm = [t for t in manifest["targets"] if t["kind"] == "vllm"]
    assert vllm
    assert all(set(t["labels"]) == {"replica", "host", "zone"} for t in vllm)
    assert all(t["id"].startswith("http://127.0.0.1:") for t in manifest["targets"])

    db = tmp_path / "replayed.duckdb"
    first = runner.invoke(app, ["--db", str(db), "replay", str(out), "--json"])
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["emulated"] is False
    assert report["traces"]["new_requests"] == manifest["spans"]["count"]
    assert report["traces"]["rejects"] == []
    before = stored_tables(db)
    second = runner.invoke(app, ["--db", str(db), "replay", str(out), "--json"])
    assert second.exit_code == 0, second.output
    after = stored_tables(db)
    for table in before:
        assert after[table].equals(before[table]), table
    assert before["points"].height > 0
    assert set(before["requests"]["replica"]) <= {t["labels"]["replica"] for t in vllm}

    # The same pages ingested directly (with the live targets) give the same metric tables.
    with Store.open(tmp_path / "direct.duckdb") as direct:
        ingest_pages(pages_of(out, live_fleet_config), store=direct)
        assert direct.read_series().collect().equals(before["series"])
        assert direct.read_points().collect().equals(before["points"])
        columns = ["target_id", "ts", "ok", "samples"]
        scrapes = direct.read_scrapes().collect()
        assert scrapes.select(columns).equals(before["scrapes"].select(columns))


def test_bad_config_is_a_clear_error(tmp_path: Path, runner: CliRunner) -> None:
    config = tmp_path / "servewatch.toml"
    config.write_text("[scrape]\ninterval_s = -1\n", encoding="utf-8")
    result = runner.invoke(app, ["record", "--config", str(config), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "scrape.interval_s" in result.output
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("kind", ["file", "non-empty folder", "unwritable"])
def test_unusable_out_is_a_clear_error(tmp_path: Path, runner: CliRunner, kind: str) -> None:
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f'[otlp]\nlisten = "127.0.0.1:{free_port()}"\ngrpc_listen = "127.0.0.1:0"\n',
        encoding="utf-8",
    )
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("x")
    elif kind == "non-empty folder":
        out.mkdir()
        (out / "keep.txt").write_text("x")
    else:
        # A folder below a file cannot be made, whoever runs the test (root included).
        (tmp_path / "a-file").write_text("x")
        out = tmp_path / "a-file" / "out"
    args = ["record", "--config", str(config), "--out", str(out), "--minutes", "0.01"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    expected = "cannot write" if kind == "unwritable" else "not an empty folder"
    assert expected in result.output
