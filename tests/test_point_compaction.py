"""Points storage (migration 7): an as-written head, and closed blocks (`POINT_BLOCK`) compacted
into shared sample instants plus (series_id, instant, value) rows."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

from servewatch.pipeline.tables import POINTS_SCHEMA, SAMPLES_SCHEMA, SCRAPES_SCHEMA
from servewatch.store import Store
from servewatch.store.migrations import MIGRATIONS
from servewatch.store.point_layout import POINT_BLOCK
from servewatch.store.points import write_chunks

T0 = datetime(2026, 11, 18, 0, 0, 0)


def batch(
    times: list[datetime], *, series: int = 3, target: str = "t1"
) -> tuple[pl.DataFrame, pl.DataFrame]:
    scrapes = pl.DataFrame(
        [(target, ts, True, None, series, None, "vllm") for ts in times],
        schema=SCRAPES_SCHEMA,
        orient="row",
    )
    samples = pl.DataFrame(
        [
            (target, ts, ts, f"vllm:m{m}", "{}", "sig", "vllm_engine", float(i * 10 + m))
            for i, ts in enumerate(times)
            for m in range(series)
        ],
        schema=SAMPLES_SCHEMA,
        orient="row",
    )
    return scrapes, samples


def query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


def compacted_order(path: Path) -> list[tuple[int, datetime]]:
    """(series_id, ts) of `point_rows` in storage order."""
    return [
        (s, t)
        for s, t in query(
            path,
            "SELECT series_id, CAST(ts AS TIMESTAMP) FROM point_rows "
            "JOIN point_instants USING (instant)",
        )
    ]


def head_rows(path: Path) -> int:
    return int(query(path, "SELECT count(*) FROM points_head")[0][0])


def blocks(path: Path) -> list[tuple[Any, ...]]:
    return query(path, "SELECT block_ts, compacted FROM point_blocks ORDER BY 1")


def test_a_closed_block_moves_from_the_head_into_instants_and_rows(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    times = [T0 + POINT_BLOCK * k / 12 for k in range(12)]  # the first block
    with Store.open(path) as store:
        for ts in times:  # one scrape a write: stored scrape by scrape
            store.write_scrapes(*batch([ts]))
        before = store.read_points().collect()
    assert head_rows(path) == 36
    assert blocks(path) == [(T0, False)]
    with Store.open(path) as store:
        report = store.compact_points(before=T0 + POINT_BLOCK)
        assert (report.blocks, report.points) == (1, 36)
        assert store.read_points().collect().equals(before)
        assert store.compact_points(before=T0 + POINT_BLOCK).blocks == 0
    assert head_rows(path) == 0
    assert blocks(path) == [(T0, True)]
    # The three series share the target's 12 scrape instants, stored once.
    assert query(path, "SELECT count(*), count(DISTINCT ts) FROM point_instants") == [(12, 12)]
    # Series after series, the direction alternating, so the instant column moves by +-1.
    assert compacted_order(path) == (
        [(1, t) for t in times] + [(2, t) for t in reversed(times)] + [(3, t) for t in times]
    )


def test_each_target_keeps_its_own_sample_times(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    jitter = timedelta(milliseconds=7)
    a_times = [T0 + timedelta(seconds=15 * k) for k in range(4)]
    b_times = [t + jitter for t in a_times]
    with Store.open(path) as store:
        store.write_scrapes(*batch(a_times, target="a"))
        store.write_scrapes(*batch(b_times, series=2, target="b"))
        expected = store.read_points().collect()
        store.compact_points(before=T0 + POINT_BLOCK)
        assert store.read_points().collect().equals(expected)
        series = store.read_series().collect()
    assert query(path, "SELECT count(*) FROM point_instants") == [(8,)]
    b_ids = set(series.filter(pl.col("target_id") == "b")["series_id"])
    assert {t for s, t in compacted_order(path) if s in b_ids} == set(b_times)


def test_writes_compact_blocks_half_a_block_behind_the_newest_point(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        store.write_scrapes(*batch([T0, T0 + POINT_BLOCK / 2]))
        store.write_scrapes(*batch([T0 + POINT_BLOCK * 3 / 2 - timedelta(seconds=1)]))
        assert store.compact_points(before=T0).blocks == 0
    assert blocks(path) == [(T0, False), (T0 + POINT_BLOCK, False)]
    with Store.open(path) as store:
        store.write_scrapes(*batch([T0 + POINT_BLOCK * 3 / 2]))
    assert blocks(path) == [(T0, True), (T0 + POINT_BLOCK, False)]
    assert head_rows(path) == 6


def test_late_points_reopen_a_compacted_block(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        store.write_scrapes(*batch([T0 + POINT_BLOCK / 2, T0 + 2 * POINT_BLOCK]))
        assert store.read_points().collect().height == 6
    assert blocks(path) == [(T0, True), (T0 + 2 * POINT_BLOCK, False)]
    with Store.open(path) as store:
        store.write_scrapes(*batch([T0 + timedelta(minutes=5)]))  # late
        assert store.read_points().collect().height == 9
    assert blocks(path)[0] == (T0, False)
    with Store.open(path) as store:
        store.write_scrapes(*batch([T0 + 2 * POINT_BLOCK + timedelta(minutes=1)]))  # next
        points = store.read_points().collect()
    assert blocks(path)[0] == (T0, True)
    first_block = points.filter(pl.col("ts") < T0 + POINT_BLOCK)
    assert first_block.height == 6
    assert query(path, "SELECT count(*) FROM point_instants") == [(2,)]
    assert [t for s, t in compacted_order(path) if s == 1] == [
        T0 + timedelta(minutes=5),
        T0 + POINT_BLOCK / 2,
    ]


def test_windows_read_the_same_points_wherever_they_are_stored(tmp_path: Path) -> None:
    """Random scrapes of two targets over six hours (several blocks), written out of order in
    batches (so blocks are compacted, reopened and compacted again, and some stay in the head):
    every window reads exactly the points written in it."""
    rng = random.Random(4)
    path = tmp_path / "s.duckdb"
    scrapes = [
        (target, T0 + timedelta(seconds=15 * k, milliseconds=rng.randrange(0, 40)))
        for target in ("a", "b")
        for k in range(0, 3 * 480, 7)
    ]
    rng.shuffle(scrapes)
    with Store.open(path) as store:
        for start in range(0, len(scrapes), 40):
            for target in ("a", "b"):
                times = sorted(t for g, t in scrapes[start : start + 40] if g == target)
                if times:
                    store.write_scrapes(*batch(times, target=target))
        everything = store.read_points().collect()
        assert store.count("points") == everything.height == len(scrapes) * 3
    assert head_rows(path) > 0
    assert query(path, "SELECT count(*) FROM point_rows")[0][0] > 0
    with Store.open(path) as store:
        for from_h, to_h in ((0, 6), (0.5, 1.25), (1.9, 2.1), (3.99, 6), (5.5, 9)):
            low = T0 + timedelta(hours=from_h)
            high = T0 + timedelta(hours=to_h)
            window = store.read_points(from_ts=low, to_ts=high).collect()
            expected = everything.filter((pl.col("ts") >= low) & (pl.col("ts") < high))
            assert window.equals(expected), (from_h, to_h)
        store.compact_points(before=T0 + timedelta(days=1))
        assert store.read_points().collect().equals(everything)
    assert head_rows(path) == 0


def test_times_are_kept_to_the_millisecond_and_windows_stay_half_open(tmp_path: Path) -> None:
    at = T0 + timedelta(microseconds=1_234_567)
    with Store.open(tmp_path / "s.duckdb") as store:
        store.write_scrapes(*batch([at]))
        for compact in (False, True):
            if compact:
                store.compact_points(before=T0 + POINT_BLOCK)
            stored = T0 + timedelta(microseconds=1_234_000)
            points = store.read_points().collect()
            assert points.schema == POINTS_SCHEMA
            assert set(points["ts"]) == {stored}
            assert store.read_points(from_ts=stored).collect().height == 3
            after = stored + timedelta(microseconds=1)
            assert store.read_points(from_ts=after).collect().height == 0
            assert store.read_points(to_ts=stored).collect().height == 0
            assert store.read_points(to_ts=after).collect().height == 3
            assert store.points_range() == (stored, stored)


def test_retention_drops_points_instants_and_blocks(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        store.write_scrapes(*batch([T0, T0 + 3 * POINT_BLOCK, T0 + 5 * POINT_BLOCK]))
        assert store.drop_points_before(T0 + POINT_BLOCK) == 3
        assert store.count("points") == 6
        assert store.drop_points_before(T0 + 4 * POINT_BLOCK) == 3
        assert store.points_range() == (T0 + 5 * POINT_BLOCK, T0 + 5 * POINT_BLOCK)
    assert [b for b, _ in blocks(path)] == [T0 + 5 * POINT_BLOCK]
    assert query(path, "SELECT count(*) FROM point_instants") == [(0,)]


def store_at_version(path: Path, version: int) -> duckdb.DuckDBPyConnection:
    """A store file as servewatch at schema `version` left it (open connection)."""
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, description VARCHAR NOT NULL,"
        " applied_ts TIMESTAMP NOT NULL)"
    )
    for migration in MIGRATIONS[:version]:
        for statement in migration.statements:
            con.execute(statement)
        con.execute("INSERT INTO schema_version VALUES (?, ?, now())", [migration.version, "x"])
    con.execute("INSERT INTO series VALUES (1, 'a', NULL, 'm', '{}', NULL)")
    con.execute("INSERT INTO series VALUES (2, 'b', NULL, 'm', '{}', NULL)")
    return con


@pytest.mark.parametrize("version", [5, 6])
def test_older_files_migrate_to_compacted_points(tmp_path: Path, version: int) -> None:
    path = tmp_path / f"v{version}.duckdb"
    con = store_at_version(path, version)
    table = "points" if version == 5 else "points_ms"
    con.execute(
        f"INSERT INTO {table} VALUES (2, ?, 1.0), (1, ?, 2.0), (1, ?, 3.0), (1, ?, 4.0)",
        [
            T0 + timedelta(hours=3),
            T0 + timedelta(hours=3),
            T0,
            T0 + timedelta(hours=3, milliseconds=5),
        ],
    )
    if version == 6:
        # Migration 6 tracked 2 h blocks.
        con.execute(
            "INSERT INTO point_blocks VALUES (?, true), (?, false)",
            [T0, T0 + timedelta(hours=2)],
        )
    con.close()
    with Store.open(path) as store:
        assert store.schema_version == MIGRATIONS[-1].version
        assert store.read_points().collect().rows() == [
            (1, T0, 3.0),
            (1, T0 + timedelta(hours=3), 2.0),
            (1, T0 + timedelta(hours=3, milliseconds=5), 4.0),
            (2, T0 + timedelta(hours=3), 1.0),
        ]
        assert store.table_schema("points") == POINTS_SCHEMA
        # Written after the migration, into the same (compacted) block: reopened and merged.
        store.write_scrapes(*batch([T0 + timedelta(hours=3, minutes=1)], series=1, target="a"))
        store.compact_points(before=T0 + timedelta(days=1))
        assert store.count("points") == 5
    assert blocks(path) == [(T0, True), (T0 + timedelta(hours=3), True)]
    assert head_rows(path) == 0
    tables = {row[0] for row in query(path, "SELECT table_name FROM duckdb_tables()")}
    assert "points_ms" not in tables
    # Instants of targets a and b are kept apart even at the same time.
    assert query(path, "SELECT count(*) FROM point_instants") == [(5,)]


def test_a_batch_larger_than_a_row_group_is_written_in_chunks_of_whole_scrapes() -> None:
    # A transaction of more rows than a DuckDB row group is written ahead of its commit and
    # rewritten by the next checkpoint, leaving free blocks; the store cuts such a batch.
    times = [T0 + timedelta(seconds=15 * k) for k in range(7)]
    scrapes, samples = batch(times, series=3)
    chunks = write_chunks(scrapes, samples, rows=7)
    sizes = [(s.height, p.height) for s, p in chunks]
    assert sizes == [(2, 6), (2, 6), (2, 6), (1, 3)]
    assert pl.concat([p for _, p in chunks]).sort(pl.all()).equals(samples.sort(pl.all()))
    assert write_chunks(scrapes, samples, rows=100) == [(scrapes, samples)]
    # a scrape of more samples than a chunk holds is a chunk of its own
    assert [s.height for s, _ in write_chunks(scrapes, samples, rows=2)] == [1] * 7


def test_a_batch_written_in_chunks_stores_what_one_write_would(tmp_path: Path) -> None:
    times = [T0 + timedelta(seconds=15 * k) for k in range(300)]
    scrapes, samples = batch(times, series=500)  # 150,000 samples: three chunks
    assert len(write_chunks(scrapes, samples)) == 3
    with Store.open(tmp_path / "s.duckdb") as store:
        assert store.write_scrapes(scrapes, samples) == (300, 150_000)
        assert store.write_scrapes(scrapes, samples) == (0, 0)
        stored = store.read_points().collect()
    assert stored.height == 150_000
