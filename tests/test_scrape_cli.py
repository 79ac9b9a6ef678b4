"""`servewatch scrape --once` against real local HTTP endpoints: a live page and a dead target."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.store import Store
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


@pytest.mark.slow
def test_scrape_runs_each_target_on_its_schedule_until_interrupted(
    endpoint: str, tmp_path: Path
) -> None:
    """The continuous mode, as a user runs it: a real process, stopped with Ctrl-C (SIGINT)."""
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f"""
[store]
path = "fleet.duckdb"

[scrape]
interval_s = 1
timeout_s = 1

[[targets]]
kind = "vllm"
url = "{endpoint}"
replica = "vllm-0"
""",
        encoding="utf-8",
    )
    program = Path(sys.executable).parent / "servewatch"
    process = subprocess.Popen(
        [str(program), "scrape", "--config", str(config)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    batches = 0
    for line in process.stdout:  # each stored batch prints one line
        batches += line.startswith("stored ")
        if batches == 3:
            break
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    with Store.open(tmp_path / "fleet.duckdb") as store:
        scrapes = store.read_scrapes().collect()
    assert scrapes.height >= 3
    assert scrapes["ok"].all()
    gaps_s = scrapes["ts"].diff().drop_nulls().dt.total_microseconds() / 1e6
    # One scrape per slot: never two within the same interval, never stacked.
    assert gaps_s.min() > 0.5


def test_scrape_once_fails_when_no_target_answers(tmp_path: Path, runner: CliRunner) -> None:
    config = tmp_path / "servewatch.toml"
    config.write_text(
        '[store]\npath = "fleet.duckdb"\n[scrape]\ntimeout_s = 2\n'
        + "".join(
            f'[[targets]]\nkind = "vllm"\nurl = "http://127.0.0.1:{free_port()}/metrics"\n'
            for _ in range(3)
        ),
        encoding="utf-8",
    )
    result = runner.invoke(app, ["scrape", "--config", str(config), "--once"])
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("stored 3 pages: 0 samples, 3 failed")
    assert result.stderr.count("failed http://127.0.0.1:") == 3
    assert result.stderr.endswith("error: no target answered: all 3 scrapes failed\n")
