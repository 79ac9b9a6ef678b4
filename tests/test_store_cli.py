"""First contact with a store: commands that only read refuse a store that is not there (and
create nothing), a --db that cannot be a store file is one clear line, and a damaged store is a
clear error in every command that opens one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.traces.ingest import ingest_trace_files
from servewatch.service import Service
from servewatch.store import Store, StoreError
from tests.conftest import FIXTURES, free_port

SPANS = FIXTURES / "vllm_spans_small" / "spans.jsonl"
SLOS = FIXTURES / "vllm_spans_small" / "slos.yaml"
PAGE = FIXTURES / "samples" / "vllm_metrics_production-stack-issue-617.txt"
REQUIREMENT = (
    'name = "small"\nfailure_unit = "host"\n[demand]\nreq_per_min = 60\n'
    "[replica]\ncapacity_req_per_min = 10\n"
)


def reading_commands(tmp_path: Path) -> dict[str, list[str]]:
    requirement = tmp_path / "requirement.toml"
    requirement.write_text(REQUIREMENT, encoding="utf-8")
    return {
        "sli": ["sli"],
        "slo status": ["slo", "status", "--slo", str(SLOS)],
        "slo evaluate": ["slo", "evaluate", "--slo", str(SLOS)],
        "alerts": ["alerts"],
        "health": ["health"],
        "report": ["report", "--out", str(tmp_path / "report"), "--no-images"],
        "recommend": ["recommend", "--requirement", str(requirement)],
        "export": ["export", "--all", "--out", str(tmp_path / "export")],
    }


READING = [
    "sli",
    "slo status",
    "slo evaluate",
    "alerts",
    "health",
    "report",
    "recommend",
    "export",
]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("recording") / "fixture"
    args = ["emulate", "--record", str(folder), "--hours", "0.02", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return folder


def every_command(tmp_path: Path, recording: Path) -> dict[str, list[str]]:
    """Each command that opens the store, with arguments that reach the store."""
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f'[[targets]]\nkind = "vllm"\nurl = "http://127.0.0.1:{free_port()}/metrics"\n',
        encoding="utf-8",
    )
    at = "2026-11-18T11:00:00Z"
    return reading_commands(tmp_path) | {
        "ingest traces": ["ingest", "traces", str(SPANS)],
        "ingest metrics": ["ingest", "metrics", str(PAGE), "--target", "t", "--at", at],
        "replay": ["replay", str(recording)],
        "scrape": ["scrape", "--config", str(config), "--once"],
    }


@pytest.mark.parametrize("command", READING)
def test_a_reading_command_refuses_a_missing_store_and_creates_nothing(
    runner: CliRunner, tmp_path: Path, command: str
) -> None:
    db = tmp_path / "mistyped" / "fleet.duckdb"
    result = runner.invoke(app, ["--db", str(db), *reading_commands(tmp_path)[command]])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: no store at {db}; `servewatch ingest` or `servewatch run` creates one\n"
    )
    assert not db.parent.exists()


def test_a_writing_command_creates_the_store_and_its_folders(
    runner: CliRunner, tmp_path: Path
) -> None:
    db = tmp_path / "new" / "folder" / "fleet.duckdb"
    result = runner.invoke(app, ["--db", str(db), "ingest", "traces", str(SPANS)])
    assert result.exit_code == 0, result.output
    assert db.is_file()


@pytest.mark.parametrize("command", [["sli"], ["ingest", "traces", str(SPANS)]])
def test_a_db_below_a_file_is_one_line(
    runner: CliRunner, tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "notes.txt").write_text("x", encoding="utf-8")
    db = tmp_path / "notes.txt" / "fleet.duckdb"
    result = runner.invoke(app, ["--db", str(db), *command])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: store {db}: {tmp_path / 'notes.txt'} is a file, not a folder\n"
    )


@pytest.mark.parametrize("command", [["sli"], ["ingest", "traces", str(SPANS)]])
def test_a_db_that_is_a_folder_is_one_line(
    runner: CliRunner, tmp_path: Path, command: list[str]
) -> None:
    result = runner.invoke(app, ["--db", str(tmp_path), *command])
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: store {tmp_path}: is a folder, not a store file\n"


def random_bytes(db: Path) -> None:
    db.write_bytes(os.urandom(300_000))


def truncated(db: Path) -> None:
    with Store.open(db) as store:
        ingest_trace_files([SPANS], store=store)
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


DAMAGE = {"random bytes": random_bytes, "truncated": truncated}
COMMANDS = [*READING, "ingest traces", "ingest metrics", "replay", "scrape"]


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("command", COMMANDS)
def test_a_damaged_store_is_a_clear_error_in_every_command(
    runner: CliRunner, tmp_path: Path, recording: Path, damage: str, command: str
) -> None:
    db = tmp_path / "fleet.duckdb"
    DAMAGE[damage](db)
    args = every_command(tmp_path, recording)[command]
    result = runner.invoke(app, ["--db", str(db), *args])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr.startswith(f"error: store {db} ")
    assert result.stderr.count("\n") == 1
    assert "damaged" in result.stderr


def test_damage_found_while_a_command_reads_is_one_line(runner: CliRunner, tmp_path: Path) -> None:
    """Blocks overwritten in place: DuckDB opens the file and fails on the query that reads
    them (the requests of `sli`), which is one line too."""
    db = tmp_path / "fleet.duckdb"
    with Store.open(db) as store:
        ingest_trace_files([SPANS], store=store)
    data = bytearray(db.read_bytes())
    first_block_end = 3 * 4096 + 262_144
    data[first_block_end:] = os.urandom(len(data) - first_block_end)
    db.write_bytes(bytes(data))
    result = runner.invoke(app, ["--db", str(db), "sli"])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: store {db} is damaged")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_run_refuses_a_damaged_store(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "fleet.duckdb"
    DAMAGE[damage](db)
    config = tmp_path / "servewatch.toml"
    config.write_text(
        '[otlp]\nlisten = "127.0.0.1:0"\ngrpc_listen = "127.0.0.1:0"\n', encoding="utf-8"
    )
    with pytest.raises(StoreError, match="damaged"):
        Service(config, store_path=db)


def test_rules_out_a_folder_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["slo", "rules", "--slo", str(SLOS), "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: --out {tmp_path}: is a folder; give the rule file's path\n"


def test_report_out_a_file_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    db = tmp_path / "fleet.duckdb"
    Store.open(db).close()
    out = tmp_path / "report.html"
    out.write_text("x", encoding="utf-8")
    result = runner.invoke(app, ["--db", str(db), "report", "--out", str(out), "--no-images"])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: --out {out}: is a file; the report is a folder (report.html and charts/)\n"
    )


def test_a_store_whose_trailing_free_blocks_were_truncated_opens(tmp_path: Path) -> None:
    """DuckDB cuts free blocks off the end of the file at a checkpoint while its header still
    counts them: a sound file then holds fewer blocks than the header's total (retention or
    compaction freeing the last blocks does this), and must not be called damaged."""
    db = tmp_path / "fleet.duckdb"
    with Store.open(db) as store:
        ingest_trace_files([SPANS], store=store)
        store._con.execute("CHECKPOINT")
        # Blocks at the end of the file, freed again: what a retention run can leave.
        store._con.execute("CREATE TABLE filler AS SELECT random() AS x FROM range(3000000)")
        store._con.execute("CHECKPOINT")
        store._con.execute("DROP TABLE filler")
        store._con.execute("CHECKPOINT")
    with Store.open(db, read_only=True) as store:
        assert store.count("requests") > 0
        size = store._con.execute("PRAGMA database_size").fetchone()
    assert size is not None
    total_blocks, free_blocks = int(size[3]), int(size[5])
    assert free_blocks > 0
    assert db.stat().st_size < 3 * 4096 + 262_144 * total_blocks  # the header counts more
