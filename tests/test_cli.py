"""The CLI contract: help on every command, --json documents, exit codes, the demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from servewatch import __version__
from servewatch.capacity.fleet_drills import topology
from servewatch.capacity.placement import layout_from_inventory
from servewatch.cli import app
from servewatch.demo import demo_fleet
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.ground_truth import meets_slo
from servewatch.emulator.records import FinishedRequests
from servewatch.emulator.workload import ArrivalSpec
from servewatch.store import Store
from tests.conftest import FIXTURES

SMALL = FIXTURES / "vllm_spans_small"


def test_version(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"servewatch {__version__}"


@pytest.mark.parametrize("command", [[], ["ingest"], ["ingest", "traces"], ["sli"], ["demo"]])
def test_every_command_has_help(runner: CliRunner, command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.stdout
    assert len(result.stdout.splitlines()) > 5


def test_sli_on_an_empty_store_says_so(runner: CliRunner, tmp_path: Path) -> None:
    db = tmp_path / "e.duckdb"
    Store.open(db).close()
    result = runner.invoke(app, ["--db", str(db), "sli", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["overall"]["requests"] == 0
    assert "ingest traces first" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "yesterday"], "--from: 'yesterday' is not a time"),
        (["--from", "1795000600", "--to", "1795000000"], "must be after --from"),
        (["--tpot-ms", "0"], "--tpot-ms must be a positive number"),
        (["--window", "5 minutes"], "--window: '5 minutes' is not a duration"),
        (["--by", "zone"], "Invalid value for '--by'"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    runner: CliRunner, tmp_path: Path, args: list[str], message: str
) -> None:
    result = runner.invoke(app, ["--db", str(tmp_path / "x.duckdb"), "sli", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())


def test_missing_trace_file_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["--db", str(tmp_path / "x.duckdb"), "ingest", "traces", str(tmp_path / "nope")]
    )
    assert result.exit_code == 2


def test_store_from_a_newer_version_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    db = tmp_path / "future.duckdb"
    Store.open(db).close()
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO schema_version VALUES (1000, 'future', now())")
    con.close()
    result = runner.invoke(app, ["--db", str(db), "sli"])
    assert result.exit_code == 2
    assert "schema version 1000" in result.stderr


def test_ingest_json_reports_rejects(runner: CliRunner, tmp_path: Path) -> None:
    traces = tmp_path / "t.jsonl"
    good = (SMALL / "spans.jsonl").read_text(encoding="utf-8").splitlines()[0]
    traces.write_text(f"{good}\nnot json\n", encoding="utf-8")
    result = runner.invoke(
        app, ["--db", str(tmp_path / "x.duckdb"), "ingest", "traces", str(traces), "--json"]
    )
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["rejected"] == 1
    assert doc["rejects"][0]["location"] == "line 2"
    assert doc["new_requests"] > 0
    assert "rejected" in result.stderr


@pytest.mark.slow
def test_demo_records_replays_analyses_and_goes_live(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "demo-out"
    args = ["demo", "--out", str(out), "--hours", "0.5", "--live-seconds", "6", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["emulated"] is True
    assert summary["recorded"]["requests"] > 1000
    assert summary["replayed"]["new_requests"] == summary["recorded"]["requests"]
    assert {s["slo"] for s in summary["slo_status"]} == {
        "ttft-500ms",
        "chat-goodput",
        "availability",
    }
    assert (out / "report" / "report.html").exists()
    assert "Capacity decision record" in (out / "decision.md").read_text(encoding="utf-8")
    # The injected host loss is named as a host loss, not as many replica faults.
    assert any(
        f["kind"] == "host_loss" and f["scope_unit"] == "host" and f["scope"] == "host-1"
        for f in summary["health_findings"]
    ), summary["health_findings"]
    assert summary["live"]["scrapes"] > 0
    assert summary["live"]["points"] > 0
    manifest = json.loads((out / "fixture" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["emulated"] is True
    assert manifest["ground_truth"]["capacity_rps_per_replica"] > 0
    # The fleet's own truth, its topology and router, beside one replica's.
    assert manifest["ground_truth"]["fleet_capacity_rps_per_replica"] > 0
    assert manifest["ground_truth"]["router"] == "least_loaded"
    # The recommended fleet holds its drill and one host fewer fails it (the record's
    # evidence); the record names both and marks the drilled rows of its failure table.
    record = json.loads((out / "decision.json").read_text(encoding="utf-8"))
    drills = record["drills"]
    assert drills["recommended"]["holds"], drills["summary"]
    assert not drills["smaller"]["holds"], drills["summary"]
    hosts = drills["recommended_hosts"]
    assert record["recommendation"]["hosts"] == hosts
    marks = {row["hosts"]: row["drill"] for row in record["failure_table"]["rows"]}
    assert marks[hosts] == "holds"
    assert marks[hosts - 1] == "fails"
    assert "Failure drill" in (out / "decision.md").read_text(encoding="utf-8")
    page = (out / "report" / "report.html").read_text(encoding="utf-8")
    assert "Failure drill: attainment through the loss" in page
    assert f"{hosts} hosts (holds)" in page
    assert f"{hosts - 1} hosts (fails)" in page
    assert drills["traffic_step"]["warm_replicas"] is not None, drills["traffic_step"]
    # `servewatch drill` on the demo's store and requirement drills the same fleet.
    drilled = runner.invoke(
        app,
        [
            "--db",
            str(out / "servewatch.duckdb"),
            "drill",
            "--requirement",
            str(out / "requirement.toml"),
            "--hosts",
            str(hosts + 1),
            "--json",
        ],
    )
    assert drilled.exit_code == 0, drilled.output
    doc = json.loads(drilled.stdout)
    assert doc["drills"]["recommended_hosts"] == hosts
    assert doc["stated"]["hosts"] == hosts + 1
    assert doc["stated"]["holds"]
    # An independent re-simulation: the true emulated fleet at that size, at the drill's
    # demand, with one host lost, keeps the SLO's target after the loss.
    assert resimulated_attainment(hosts, demand_rps=drills["recommended"]["demand_rps"]) >= 0.9


def resimulated_attainment(hosts: int, *, demand_rps: float) -> float:
    """The demo's own fleet config grown to `hosts` hosts as the recommender grows it (into
    the emptiest zone), driven at `demand_rps`; attainment of what arrives in the 3 minutes
    after its largest host is lost, with no replacement."""
    config = demo_fleet(hours=0.5, rate_rps=3.0)
    layout = layout_from_inventory((p.replica, p.host, p.zone) for p in config.placements())
    footprint = layout.resized(hosts=hosts, zones=("zone-a", "zone-b"), replicas_per_host=4)
    loss_s = 600.0
    fleet = replace(
        config,
        topology=topology(footprint, replicas_per_host=4, gpus=1),
        workload=replace(config.workload, arrival=ArrivalSpec(rate_rps=demand_rps)),
        failures=(FailureSpec(FailureKind.HOST_LOSS, at_s=loss_s, target="host-0"),),
    )
    start_s = 1_900_000_000.0
    collect = FinishedRequests(from_s=start_s + loss_s)
    sim = FleetSimulation(fleet, observer=collect, seed=11, start_s=start_s)
    sim.run_until(start_s + loss_s + 180.0 + 300.0)
    judged = [r for r in collect.finished if r.arrival_s < start_s + loss_s + 180.0]
    assert len(judged) > 100
    return sum(meets_slo(r, fleet.slo) for r in judged) / len(judged)


def test_demo_with_a_bad_duration_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--out", str(tmp_path), "--hours", "0"])
    assert result.exit_code == 2
    assert "--hours" in result.stderr


def test_size_reproduces_the_seed_host_table(runner: CliRunner) -> None:
    args = ["--demand-req-per-min", "120", "--capacity-req-per-min", "40"]
    args += ["--replicas-per-host", "2", "--failure-unit", "host", "--json"]
    result = runner.invoke(app, ["size", *args])
    assert result.exit_code == 0, result.output
    table = json.loads(result.stdout)["failure_table"]
    rows = {row["hosts"]: row for row in table["rows"]}
    assert [(rows[h]["healthy_capacity"], rows[h]["after_host_loss"]) for h in (2, 3, 4)] == [
        (160, 80),
        (240, 160),
        (320, 240),
    ]
    assert table["minimum_hosts"] == 3
    assert rows[3]["max_admission"] == 160


def test_size_without_demand_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(app, ["size", "--capacity-req-per-min", "40"])
    assert result.exit_code == 2
    assert "--demand-req-per-min" in result.stderr


def servewatch_at_width(args: list[str], *, columns: int) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it, in a terminal `columns` wide (rich reads COLUMNS once)."""
    return subprocess.run(
        [sys.executable, "-m", "servewatch.cli", *args],
        capture_output=True,
        text=True,
        env=os.environ | {"COLUMNS": str(columns)},
        timeout=120,
        check=False,
    )


def test_an_error_is_one_line_at_any_terminal_width(tmp_path: Path) -> None:
    config = tmp_path / ("a-rather-long-folder-name-" * 8) / "servewatch.toml"
    config.parent.mkdir()
    config.write_text("[scrape]\ninterval_s = 15\n", encoding="utf-8")
    args = ["scrape", "--config", str(config), "--once"]
    narrow, wide = (servewatch_at_width(args, columns=c) for c in (40, 300))
    assert narrow.returncode == wide.returncode == 2
    assert narrow.stderr == wide.stderr == f"error: {config}: no targets to scrape\n"


def test_help_keeps_every_word_and_bracket_in_a_narrow_terminal() -> None:
    result = servewatch_at_width(["slo", "status", "--help"], columns=40)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "servewatch.toml ([slo] files, store path)." in text
    assert (
        "Budget remaining and consumed, burn rate per alert window, time to exhaustion and "
        "alert state of every SLO, exact from per-minute good and total counts."
    ) in text
    listing = servewatch_at_width(["--help"], columns=40)
    assert listing.returncode == 0
    text = " ".join(listing.stdout.split())
    assert (
        "Replay a recorded fixture into the store: its spans and every page, scrape by scrape."
    ) in text
    commands = listing.stdout.split("Commands:", 1)[1]
    assert "..." not in commands


def test_square_brackets_in_an_error_are_shown(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["--db", str(tmp_path / "x.duckdb"), "slo", "status"])
    assert result.exit_code == 2
    assert "under [slo] files" in result.stderr


def test_a_config_that_is_not_utf8_is_one_line_naming_the_file(
    runner: CliRunner, tmp_path: Path
) -> None:
    config = tmp_path / "servewatch.toml"
    config.write_bytes(b"[scrape]\ninterval_s = 15 # \xff\n")
    result = runner.invoke(app, ["scrape", "--config", str(config), "--once"])
    assert result.exit_code == 2
    assert result.stderr == f"error: {config}: line 2: not UTF-8 text (TOML files are UTF-8)\n"


def test_invalid_toml_is_one_line_naming_the_file_and_line(
    runner: CliRunner, tmp_path: Path
) -> None:
    config = tmp_path / "servewatch.toml"
    config.write_text("[scrape]\ninterval_s = = 15\n", encoding="utf-8")
    result = runner.invoke(app, ["scrape", "--config", str(config), "--once"])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {config}: not valid TOML: ")
    assert "line 2" in result.stderr
    assert result.stderr.count("\n") == 1


def test_drill_a_fleet_config_with_a_traffic_step(runner: CliRunner, tmp_path: Path) -> None:
    fleet = FIXTURES.parent / "docs" / "fleet.example.toml"
    args = ["drill", "--fleet", str(fleet), "--req-per-min", "900", "--steady-s", "60"]
    args += ["--after-s", "60", "--traffic-step", "1.5x", "--over", "2m"]
    args += ["--replica-req-per-min", "600", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["drill"]["holds"] is True
    assert [p["phase"] for p in doc["drill"]["phases"]] == [
        "steady",
        "failed",
        "replacement",
        "recovered",
    ]
    assert doc["traffic_step"]["warm_replicas"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give one of --requirement (with the store) or --fleet"),
        (["--fleet", "nowhere.toml"], "nowhere.toml"),
        (["--fleet", "{fleet}", "--traffic-step", "double"], "such as 2x"),
        (["--fleet", "{fleet}", "--traffic-step", "2x", "--over", "soon"], "--over"),
        (["--fleet", "{fleet}", "--recovery-s", "0"], "recovery_interval_s"),
    ],
)
def test_drill_bad_input_is_a_clear_error(runner: CliRunner, args: list[str], message: str) -> None:
    fleet = str(FIXTURES.parent / "docs" / "fleet.example.toml")
    result = runner.invoke(app, ["drill", *(a.replace("{fleet}", fleet) for a in args)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
