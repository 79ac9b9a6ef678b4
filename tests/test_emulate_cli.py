"""`servewatch emulate --record` writes a fixture that `replay` reads; replaying it twice
leaves identical tables."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from servewatch.cli import app
from tests.conftest import stored_tables


def test_record_then_replay_twice_leaves_identical_tables(
    tmp_path: Path, runner: CliRunner
) -> None:
    folder = tmp_path / "recording"
    recorded = runner.invoke(app, ["emulate", "--record", str(folder), "--hours", "0.1", "--json"])
    assert recorded.exit_code == 0, recorded.output
    summary = json.loads(recorded.stdout)
    assert summary["requests"] > 0
    assert summary["ground_truth"]["capacity_rps_per_replica"] > 0

    db = str(tmp_path / "replayed.duckdb")
    first = runner.invoke(app, ["--db", db, "replay", str(folder), "--json"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["traces"]["new_requests"] == summary["requests"]
    before = stored_tables(db)
    second = runner.invoke(app, ["--db", db, "replay", str(folder), "--json"])
    assert second.exit_code == 0, second.output
    report = json.loads(second.stdout)
    assert report["metrics"]["new_points"] == 0
    assert report["traces"]["new_requests"] == 0
    after = stored_tables(db)
    for table in before:
        assert after[table].equals(before[table]), table
    assert before["points"].height > 0

    # Traces and histograms of one emulated run agree within a bucket, window by window.
    sli = runner.invoke(app, ["--db", db, "sli", "--window", "3m", "--by", "fleet", "--json"])
    assert sli.exit_code == 0, sli.output
    checked = [c for c in json.loads(sli.stdout)["cross_check"] if c["diverges"] is not None]
    assert checked
    assert not any(c["diverges"] for c in checked)


def test_a_bad_fleet_config_names_the_field(tmp_path: Path, runner: CliRunner) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[topology]\nreplicas_per_host = 0\n", encoding="utf-8")
    result = runner.invoke(
        app, ["emulate", "--config", str(config), "--record", str(tmp_path / "x")]
    )
    assert result.exit_code == 2
    assert "replicas_per_host" in result.stderr
