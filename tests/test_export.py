"""`servewatch export`: every table of a store written to Parquet reads back as the store reads
it (same rows, same order), a window cuts a table on its time column at exactly [from, to), and
bad input (an unknown table, a file already there, a missing store) is one line and exit 2."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.fixture.replay import replay_fixture
from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.pipeline.request_minutes import EventCriterion
from servewatch.pipeline.tables import (
    ALERTS_SCHEMA,
    INGEST_ERRORS_SCHEMA,
    RECOMMENDATIONS_SCHEMA,
    RECORDED_POINTS_SCHEMA,
)
from servewatch.store import EXPORT_TABLES, ExportError, Store
from servewatch.store.export import POINT_STORAGE_TABLES
from servewatch.store.point_layout import POINT_BLOCK
from servewatch.store.rollup_job import roll_up_requests
from tests.conftest import SAMPLE_PAGE
from tests.health_fleet import START, fleet_config, record

MINUTES = 3.0
CRITERIA = (EventCriterion("ttft-500ms", ttft_limit_s=0.5), EventCriterion("availability"))
# A page scraped after the recording's block is compacted: its points stay in the head, so
# the store holds points both ways and the export must give both as the points view does.
LATE_SCRAPE = START + POINT_BLOCK + timedelta(minutes=30)
LATE_TARGET = Target("late-0", TargetKind.VLLM, "http://127.0.0.1:1/metrics", replica="late-0")
TIMES = [START + timedelta(minutes=m) for m in (0.5, 1.5, 2.5)]
TABLES = [table.name for table in EXPORT_TABLES]
WINDOWED = {table.name: table.time_column for table in EXPORT_TABLES if table.time_column}


def _events(store: Store) -> None:
    """Rows for the tables a recording leaves empty, at three times so windows can cut them."""
    store.write_ingest_errors(
        pl.DataFrame(
            [("spans.jsonl", f"line {i}", "not JSON", ts) for i, ts in enumerate(TIMES)],
            schema=INGEST_ERRORS_SCHEMA,
            orient="row",
        )
    )
    store.write_alert_changes(
        pl.DataFrame(
            [
                ("ttft-500ms", "page", 3600, 300, state, ts, None, 20.0, 18.0, 14.4, 0.02, "{}")
                for state, ts in zip(("pending", "firing", "resolved"), TIMES, strict=True)
            ],
            schema=ALERTS_SCHEMA,
            orient="row",
        )
    )
    store.write_recommendation(
        pl.DataFrame(
            [(ts, "chat", f"{i + 3} hosts", "{}") for i, ts in enumerate(TIMES)],
            schema=RECOMMENDATIONS_SCHEMA,
            orient="row",
        )
    )
    store.write_recorded_points(
        pl.DataFrame(
            [
                ("http://prometheus:9090", record, '{"pool":"chat"}', ts, 0.25 * i)
                for i, ts in enumerate(TIMES)
                for record in ("pool:vllm_request_success:rate5m", "pool:vllm_e2e:p90_5m")
            ],
            schema=RECORDED_POINTS_SCHEMA,
            orient="row",
        )
    )


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three minutes of an emulated fleet replayed and rolled up, its block of points
    compacted, one later scrape in the head, and a few alerts, recommendations and errors."""
    folder = record(fleet_config(), tmp_path_factory.mktemp("export") / "fixture", minutes=MINUTES)
    path = tmp_path_factory.mktemp("export-db") / "fleet.duckdb"
    with Store.open(path) as store:
        replay_fixture(folder, store=store)
        roll_up_requests(store, criteria=CRITERIA)
        store.compact_points(before=START + POINT_BLOCK)
        ingest_pages([Page(LATE_TARGET, LATE_SCRAPE, SAMPLE_PAGE.decode("utf-8"))], store=store)
        _events(store)
        # As a rollup from compacted partitions records them (tests/test_compact.py).
        store._con.execute(
            "INSERT INTO rollup_partitions VALUES ('request_minutes', ?, 'f', ?)",
            [f"date={START:%Y-%m-%d}/hour={START:%H}", START],
        )
        assert store.count("point_rows") > 0
        assert store.count("points_head") > 0
    return path


Reader = Callable[[Store, datetime | None, datetime | None], pl.DataFrame]


def _whole(read: Callable[[Store], pl.LazyFrame], column: str | None = None) -> Reader:
    """A read without a window of its own, cut by the test (on `column`) as a window would."""

    def reader(store: Store, from_ts: datetime | None, to_ts: datetime | None) -> pl.DataFrame:
        frame = read(store).collect()
        if column is not None and from_ts is not None:
            frame = frame.filter(pl.col(column) >= from_ts)
        if column is not None and to_ts is not None:
            frame = frame.filter(pl.col(column) < to_ts)
        return frame

    return reader


def _sql(table: str) -> Reader:
    # Tables of bookkeeping that no analysis reads: the store's rows as SQL gives them.
    return _whole(lambda store: store._con.sql(f"SELECT * FROM {table}").pl().lazy())


# The store's own read of each table, in its own order (the export's order is that order,
# with the table's key breaking ties).
STORE_READS: dict[str, Reader] = {
    "schema_version": _sql("schema_version"),
    "targets": _whole(lambda s: s.read_targets()),
    "scrapes": lambda s, f, t: s.read_scrapes(from_ts=f, to_ts=t).collect(),
    "series": _whole(lambda s: s.read_series()),
    "points": lambda s, f, t: s.read_points(from_ts=f, to_ts=t).collect(),
    "requests": lambda s, f, t: s.read_requests(from_ts=f, to_ts=t).collect(),
    "ingest_errors": _whole(lambda s: s.read_ingest_errors(), "recorded_ts"),
    "request_minutes": lambda s, f, t: s.read_request_minutes(from_ts=f, to_ts=t).collect(),
    "slo_minutes": lambda s, f, t: s.read_slo_minutes(from_ts=f, to_ts=t).collect(),
    "rollup_watermarks": _sql("rollup_watermarks"),
    "rollup_partitions": _sql("rollup_partitions"),
    "unknown_families": _whole(lambda s: s.read_unknown_families()),
    "alerts": _whole(lambda s: s.read_alert_changes(), "changed_ts"),
    "recommendations": _whole(lambda s: s.read_recommendations(), "created_ts"),
    "recorded_points": _whole(lambda s: s.read_recorded_points(), "ts"),
}


# What each store read orders by (its ORDER BY; none for the two read with plain SQL), and
# each table's key (docs/schema.md), which breaks the ties a read leaves.
READ_ORDERS: dict[str, list[str]] = {
    "schema_version": [],
    "targets": ["target_id"],
    "scrapes": ["target_id", "ts"],
    "series": ["series_id"],
    "points": ["series_id", "ts"],
    "requests": ["end_ts"],
    "ingest_errors": ["source"],
    "request_minutes": ["minute_ts", "replica"],
    "slo_minutes": ["slo", "minute_ts", "replica"],
    "rollup_watermarks": [],
    "rollup_partitions": [],
    "unknown_families": ["target_id", "family"],
    "alerts": ["changed_ts", "slo"],
    "recommendations": ["created_ts"],
    "recorded_points": ["source", "record", "labels", "ts"],
}
KEYS: dict[str, list[str]] = {
    "schema_version": ["version"],
    "targets": ["target_id"],
    "scrapes": ["target_id", "ts"],
    "series": ["series_id"],
    "points": ["series_id", "ts"],
    "requests": ["trace_id", "span_id"],
    "ingest_errors": ["source", "location"],
    "request_minutes": ["replica", "minute_ts"],
    "slo_minutes": ["minute_ts", "slo", "replica", "pool", "model", "tenant", "adapter"],
    "rollup_watermarks": ["source"],
    "rollup_partitions": ["rollup", "partition"],
    "unknown_families": ["target_id", "family"],
    "alerts": ["slo", "long_window_s", "short_window_s", "changed_ts"],
    "recommendations": ["name", "created_ts"],
    "recorded_points": ["source", "record", "labels", "ts"],
}


def _sorted(frame: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    # Stable, nulls last as DuckDB sorts them.
    return frame.sort(columns, nulls_last=True, maintain_order=True) if columns else frame


def _expected(
    store: Store, table: str, from_ts: datetime | None = None, to_ts: datetime | None = None
) -> pl.DataFrame:
    """The store's read of `table` in the window, in its order, ties broken by the key."""
    read = STORE_READS[table](store, from_ts, to_ts)
    assert_frame_equal(read, _sorted(read, READ_ORDERS[table]))  # the order is the read's
    return _sorted(read, [*READ_ORDERS[table], *KEYS[table]])


def test_every_table_of_the_store_is_exported_or_is_how_points_are_stored(db: Path) -> None:
    with Store.open(db, read_only=True) as store:
        stored = set(store.tables())
    assert sorted(TABLES) == sorted(STORE_READS) == sorted(READ_ORDERS) == sorted(KEYS)
    assert sorted([*TABLES, *POINT_STORAGE_TABLES]) == sorted(stored)


@pytest.mark.parametrize("table", TABLES)
def test_a_table_reads_back_as_the_store_reads_it(db: Path, tmp_path: Path, table: str) -> None:
    out = tmp_path / f"{table}.parquet"
    with Store.open(db, read_only=True) as store:
        written = store.export_table(table, out)
        expected = _expected(store, table)
    back = pl.read_parquet(out)
    assert expected.height > 0, f"the fixture leaves {table} empty: nothing is compared"
    assert_frame_equal(back, expected)
    assert (written.rows, written.bytes) == (back.height, out.stat().st_size)
    assert not back.select(KEYS[table]).is_duplicated().any()


def test_points_are_exported_as_the_points_view_gives_them(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "points.parquet"
    with Store.open(db, read_only=True) as store:
        store.export_table("points", out)
        view = store._con.sql("SELECT * FROM points ORDER BY series_id, ts").pl()
    back = pl.read_parquet(out)
    assert back.columns == ["series_id", "ts", "value"]
    assert_frame_equal(back, view)
    assert back["ts"].max() == LATE_SCRAPE  # the head's points are there too


def _edges(store: Store, table: str) -> tuple[datetime, datetime]:
    """Two stored times of the table's time column, a third and two thirds of the way."""
    times = _expected(store, table)[WINDOWED[table]].unique().sort().to_list()
    assert len(times) >= 3, f"{table} needs three times to cut"
    return times[len(times) // 3], times[2 * len(times) // 3]


@pytest.mark.parametrize("table", sorted(WINDOWED))
def test_a_window_cuts_at_its_edges(db: Path, tmp_path: Path, table: str) -> None:
    """[from, to) on the time column: a row at `from` is in, a row at `to` is out."""
    column = WINDOWED[table]
    out = tmp_path / "cut.parquet"
    with Store.open(db, read_only=True) as store:
        first, end = _edges(store, table)
        store.export_table(table, out, from_ts=first, to_ts=end)
        expected = _expected(store, table, first, end)
    back = pl.read_parquet(out)
    assert_frame_equal(back, expected)
    assert back[column].min() == first
    assert back[column].max() < end
    assert back[column].n_unique() >= 1


def test_a_point_window_between_milliseconds_is_cut_as_the_reads_cut(
    db: Path, tmp_path: Path
) -> None:
    """Point times are whole milliseconds: a bound a microsecond past a sample leaves it
    out at `from` and keeps it at `to`."""
    out = tmp_path / "points.parquet"
    with Store.open(db, read_only=True) as store:
        first, end = _edges(store, "points")
        just_after = timedelta(microseconds=1)
        store.export_table("points", out, from_ts=first + just_after, to_ts=end + just_after)
        expected = _expected(store, "points", first + just_after, end + just_after)
    back = pl.read_parquet(out)
    assert_frame_equal(back, expected)
    assert back["ts"].min() > first
    assert back["ts"].max() == end


def test_a_table_without_time_is_exported_whole_in_a_window(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "series.parquet"
    with Store.open(db, read_only=True) as store:
        written = store.export_table("series", out, from_ts=TIMES[1], to_ts=TIMES[2])
        whole = store.count("series")
    assert written.time_column is None
    assert written.rows == whole == pl.read_parquet(out).height


def test_the_same_store_exports_the_same_bytes(db: Path, tmp_path: Path) -> None:
    with Store.open(db, read_only=True) as store:
        first = store.export_all(tmp_path / "a")
        second = store.export_all(tmp_path / "b")
    for one, other in zip(first, second, strict=True):
        assert one.path.read_bytes() == other.path.read_bytes(), one.table


def test_an_unknown_table_names_the_allowed_ones(db: Path, tmp_path: Path) -> None:
    with (
        Store.open(db, read_only=True) as store,
        pytest.raises(ExportError, match=r"unknown table 'nope': the tables are schema_version"),
    ):
        store.export_table("nope", tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


def _cli(runner: CliRunner, db: Path, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["--db", str(db), "export", *args])
    return result.exit_code, result.stdout, " ".join(result.stderr.split())


def test_json_names_each_file_with_its_rows_and_bytes(
    runner: CliRunner, db: Path, tmp_path: Path
) -> None:
    out = tmp_path / "requests.parquet"
    code, stdout, stderr = _cli(runner, db, "requests", "--out", str(out), "--json")
    assert code == 0, stderr
    (file,) = json.loads(stdout)["files"]
    assert file == {
        "table": "requests",
        "path": str(out),
        "rows": pl.read_parquet(out).height,
        "bytes": out.stat().st_size,
    }
    assert f"requests: {file['rows']:,} rows" in stderr  # progress on stderr, not stdout


def test_all_writes_one_file_per_table(runner: CliRunner, db: Path, tmp_path: Path) -> None:
    out = tmp_path / "tables"
    code, stdout, stderr = _cli(
        runner, db, "--all", "--out", str(out), "--from", "2026-11-19T00:01:00Z", "--json"
    )
    assert code == 0, stderr
    files = json.loads(stdout)["files"]
    assert [f["table"] for f in files] == TABLES
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.parquet" for t in TABLES)
    for file in files:
        assert set(file) == {"table", "path", "rows", "bytes"}
        assert pl.read_parquet(file["path"]).height == file["rows"]
    assert "series: " in stderr
    assert "(no time column: written whole)" in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "unknown table 'nope': the tables are schema_version, targets, scrapes"),
        (["point_rows"], "point_rows is part of how points are stored: export points"),
        ([], "give a TABLE (schema_version, targets,"),
        (["targets", "--all"], "give one TABLE or --all"),
        (["requests", "--from", "yesterday"], "--from: 'yesterday' is not a time"),
        (
            ["requests", "--from", "1795046500", "--to", "1795046400"],
            "must be after --from",
        ),
    ],
)
def test_bad_input_exits_2_with_a_message(
    runner: CliRunner, db: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "out.parquet"
    code, stdout, stderr = _cli(runner, db, *args, "--out", str(out))
    assert code == 2, stderr
    assert message in stderr
    assert stdout == ""
    assert not out.exists()


def test_an_existing_file_is_refused_unless_forced(
    runner: CliRunner, db: Path, tmp_path: Path
) -> None:
    out = tmp_path / "targets.parquet"
    out.write_bytes(b"keep me")
    code, _, stderr = _cli(runner, db, "targets", "--out", str(out))
    assert code == 2
    assert stderr == f"error: --out {out}: already exists; pass --force to overwrite it"
    assert out.read_bytes() == b"keep me"
    code, _, stderr = _cli(runner, db, "targets", "--out", str(out), "--force")
    assert code == 0, stderr
    assert pl.read_parquet(out).height > 0
    assert [p.name for p in tmp_path.iterdir()] == ["targets.parquet"]  # no partial file left


def test_all_into_a_folder_holding_a_table_writes_nothing(
    runner: CliRunner, db: Path, tmp_path: Path
) -> None:
    (tmp_path / "points.parquet").write_bytes(b"keep me")
    code, _, stderr = _cli(runner, db, "--all", "--out", str(tmp_path))
    assert code == 2
    assert f"--out {tmp_path}: already holds points.parquet; pass --force" in stderr
    assert [p.name for p in tmp_path.iterdir()] == ["points.parquet"]


def test_out_a_folder_is_bad_input(runner: CliRunner, db: Path, tmp_path: Path) -> None:
    code, _, stderr = _cli(runner, db, "targets", "--out", str(tmp_path))
    assert code == 2
    assert stderr == f"error: --out {tmp_path}: is a folder; give the Parquet file's path"


def test_out_below_a_file_is_bad_input(runner: CliRunner, db: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x", encoding="utf-8")
    out = tmp_path / "notes.txt" / "exports" / "targets.parquet"
    code, _, stderr = _cli(runner, db, "targets", "--out", str(out))
    assert code == 2
    assert stderr == f"error: --out: {tmp_path / 'notes.txt'} is a file, not a folder"


def test_a_missing_store_is_refused_and_nothing_is_written(
    runner: CliRunner, tmp_path: Path
) -> None:
    missing = tmp_path / "mistyped" / "fleet.duckdb"
    out = tmp_path / "tables"
    code, _, stderr = _cli(runner, missing, "--all", "--out", str(out))
    assert code == 2
    assert stderr == (
        f"error: no store at {missing}; `servewatch ingest` or `servewatch run` creates one"
    )
    assert not missing.parent.exists()
    assert not out.exists()


def test_export_has_help(runner: CliRunner) -> None:
    result = runner.invoke(app, ["export", "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.stdout
    assert "--force" in result.stdout
