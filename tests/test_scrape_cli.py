"""`servewatch scrape --once` against real local HTTP endpoints: a live page and a dead target."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from servewatch.cli import app
from tests.conftest import free_port


def test_scrape_once_stores_the_live_page_and_records_the_dead_target(
    endpoint: str, tmp_path: Path, runner: CliRunner
) -> None:
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f"""
[store]
path = "fleet.duckdb"

[scrape]
interval_s = 15
timeout_s = 2

[[targets]]
kind = "vllm"
url = "{endpoint}"
replica = "vllm-0"
host = "host-a"

[[targets]]
kind = "vllm"
url = "http://127.0.0.1:{free_port()}/metrics"
replica = "vllm-1"
""",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["scrape", "--config", str(config), "--once", "--json"])
    assert result.exit_code == 0, result.output
    (round_,) = json.loads(result.stdout)["rounds"]
    assert round_["pages"] == 2
    assert round_["stored_samples"] > 0
    (failed,) = round_["failed_scrapes"]
    assert failed["source"] != endpoint  # the source is the dead target's id (its URL)
    assert failed["message"].startswith("ConnectError")
    assert (tmp_path / "fleet.duckdb").exists()


def test_scrape_without_targets_is_a_usage_error(tmp_path: Path, runner: CliRunner) -> None:
    config = tmp_path / "servewatch.toml"
    config.write_text("[scrape]\ninterval_s = 15\n", encoding="utf-8")
    result = runner.invoke(app, ["scrape", "--config", str(config), "--once"])
    assert result.exit_code == 2
    assert "no targets" in result.stderr
