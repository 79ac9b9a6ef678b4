"""A store window: every frame an analysis of one window needs, each table read once; readers
that open the store read-only and never write; the window on the wire, as the local API sends
it."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.fixture.replay import replay_fixture
from servewatch.pipeline.request_minutes import request_minutes
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.window import (
    WINDOW_TABLES,
    Window,
    WindowQuery,
    window_from_bytes,
    window_to_bytes,
)
from servewatch.report_service import store_report
from servewatch.store import Store, StoreError, roll_up_request_minutes
from servewatch.store.migrations import LATEST_VERSION
from tests.conftest import FIXTURES
from tests.health_fleet import START, fleet_config, record

MINUTES = 4.0


@pytest.fixture(scope="module")
def recorded_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few minutes of an emulated fleet, replayed and rolled up: spans and scraped pages."""
    folder = record(fleet_config(), tmp_path_factory.mktemp("window") / "fixture", minutes=MINUTES)
    db = tmp_path_factory.mktemp("window-db") / "fleet.duckdb"
    with Store.open(db) as store:
        replay_fixture(folder, store=store)
        roll_up_request_minutes(store)
    return db


def test_the_report_reads_each_table_once(recorded_db: Path) -> None:
    with Store.open(recorded_db, read_only=True) as store:
        store_report(store, limits=GoodputLimits(ttft_s=1.0))
        assert dict(store.reads) == dict.fromkeys(WINDOW_TABLES, 1)
        store.reads.clear()
        # A window with both ends, as `servewatch report --from --to` reads it.
        store_report(
            store,
            limits=GoodputLimits(ttft_s=1.0),
            from_ts=START + timedelta(minutes=1),
            to_ts=START + timedelta(minutes=3),
        )
        assert dict(store.reads) == dict.fromkeys(WINDOW_TABLES, 1)


def test_a_window_holds_what_the_store_reads_would(recorded_db: Path) -> None:
    start, end = START + timedelta(minutes=1), START + timedelta(minutes=3)
    with Store.open(recorded_db, read_only=True) as store:
        window = store.read_window(from_ts=start, to_ts=end, points_after=timedelta(seconds=30))
        assert window.request_minutes_current
        assert window.requests.equals(store.read_requests(from_ts=start, to_ts=end).collect())
        # Points from a minute before the window until 30 s after its end, both inclusive.
        assert window.points.equals(
            store.read_points(
                from_ts=start - timedelta(minutes=1),
                to_ts=end + timedelta(seconds=30, microseconds=1),
            ).collect()
        )
        inner = window.points_between(start, end).collect()
        assert inner.equals(store.read_points(from_ts=start, to_ts=end).collect())
        stored = store.points_range()
    assert window.stored_points is not None
    assert stored == (window.stored_points.first, window.stored_points.last)
    with pytest.raises(ValueError, match=r"points from .* asked of a window read from"):
        window.points_between(start - timedelta(minutes=2), end)
    with pytest.raises(ValueError, match="requests until None asked of a window read until"):
        window.requests_between(start, None)


def test_a_window_lagging_its_rollup_counts_minutes_from_requests(recorded_db: Path) -> None:
    with Store.open(":memory:") as store:
        with Store.open(recorded_db, read_only=True) as source:
            requests = source.read_requests().collect()
        store.write_requests(
            requests.with_columns(pl.lit(None, pl.Datetime("us")).alias("ingested_ts"))
        )
        window = store.read_window()
        assert not window.request_minutes_current
        assert window.request_minutes.equals(request_minutes(window.requests.lazy()).collect())
        roll_up_request_minutes(store)
        rolled = store.read_window()
    assert rolled.request_minutes_current
    # The rollup (SQL) and the definition (Polars) agree on every count.
    counts = ["replica", "minute_ts", "requests", "failed_requests", "prompt_tokens"]
    assert rolled.request_minutes.select(counts).equals(window.request_minutes.select(counts))


def test_a_window_crosses_the_wire_unchanged(recorded_db: Path) -> None:
    with Store.open(recorded_db, read_only=True) as store:
        window = store.read_window(to_ts=START + timedelta(minutes=2))
    back = window_from_bytes(window_to_bytes(window))
    for table, frame in window.frames().items():
        assert back.frames()[table].equals(frame), table
    assert (back.from_ts, back.to_ts, back.points_from_ts, back.points_to_ts) == (
        window.from_ts,
        window.to_ts,
        window.points_from_ts,
        window.points_to_ts,
    )
    assert (back.stored_points, back.stored_requests) == (
        window.stored_points,
        window.stored_requests,
    )


@pytest.mark.parametrize(
    "data",
    [b"", b"not a zip", window_to_bytes.__name__.encode()],
)
def test_what_is_not_a_window_is_refused_by_name(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a servewatch window"):
        window_from_bytes(data)


def test_a_window_frame_of_another_shape_is_refused() -> None:
    frames = {table: pl.DataFrame(schema=schema) for table, schema in WINDOW_TABLES.items()}
    frames["requests"] = pl.DataFrame({"trace_id": ["a"]})
    with pytest.raises(ValueError, match="window frame requests has columns"):
        Window(
            from_ts=None,
            to_ts=None,
            points_from_ts=None,
            points_to_ts=None,
            stored_points=None,
            stored_requests=None,
            **frames,
        )


@pytest.mark.parametrize(
    "query",
    [
        WindowQuery(),
        WindowQuery(from_ts=START, to_ts=START + timedelta(hours=1)),
        WindowQuery(to_ts=START, points_before=timedelta(minutes=5), points_after=timedelta(0)),
        WindowQuery(from_ts=START, points_after=timedelta(seconds=90.5)),
    ],
)
def test_window_queries_round_trip(query: WindowQuery) -> None:
    assert WindowQuery.from_params(query.to_params()) == query


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"since": "2026-11-19T00:00:00"}, r"unknown parameters \['since'\]; allowed"),
        ({"from": "yesterday"}, "from: 'yesterday' is not an ISO 8601 time"),
        ({"points_after_s": "a lot"}, "points_after_s: 'a lot' is not a number"),
        ({"points_before_s": "-1"}, r"points_before_s: -1.0 is not within \[0, 1 year\)"),
        (
            {"from": "2026-11-19T01:00:00", "to": "2026-11-19T00:00:00"},
            "to .* must be after from",
        ),
    ],
)
def test_bad_window_queries_say_what_is_wrong(params: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WindowQuery.from_params(params)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_reading_commands_never_write(recorded_db: Path, tmp_path: Path, runner: CliRunner) -> None:
    slos = FIXTURES / "vllm_spans_small" / "slos.yaml"
    before = _digest(recorded_db)
    wal = Path(f"{recorded_db}.wal")
    at = (START + timedelta(minutes=MINUTES)).isoformat()
    commands = [
        ["sli", "--json"],
        ["sli", "--json", "--window", "1m", "--source", "both"],
        ["health", "--json"],
        ["report", "--out", str(tmp_path / "report"), "--no-images", "--json"],
        ["slo", "status", "--slo", str(slos), "--at", at, "--json"],
        ["alerts", "--json"],
    ]
    for command in commands:
        result = runner.invoke(app, ["--db", str(recorded_db), *command])
        assert result.exit_code == 0, (command, result.output)
        json.loads(result.stdout)
        assert _digest(recorded_db) == before, command
        assert not wal.exists(), command


def test_a_read_only_open_refuses_an_older_schema(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    with Store.open(db) as store:
        # As a store written by the previous servewatch would say.
        store._con.execute("DROP TABLE rollup_partitions")
        store._con.execute("DELETE FROM schema_version WHERE version = ?", [LATEST_VERSION])
    with pytest.raises(StoreError, match=r"a writing command .* migrates it"):
        Store.open(db, read_only=True)
    with Store.open(db) as store:  # a writer migrates it
        assert store.schema_version == LATEST_VERSION
    with Store.open(db, read_only=True) as store:
        assert store.read_only
