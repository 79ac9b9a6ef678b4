"""The store: migrations, refusal of newer files, schema constants, idempotent writes."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl
import pytest

from servewatch.pipeline.tables import (
    ALERTS_SCHEMA,
    INGEST_ERRORS_SCHEMA,
    POINTS_SCHEMA,
    RECOMMENDATIONS_SCHEMA,
    RECORDED_POINTS_SCHEMA,
    REQUEST_MINUTES_SCHEMA,
    REQUESTS_SCHEMA,
    SAMPLES_SCHEMA,
    SCRAPES_SCHEMA,
    SERIES_SCHEMA,
    SLO_MINUTES_SCHEMA,
    TARGETS_SCHEMA,
    UNKNOWN_FAMILIES_SCHEMA,
)
from servewatch.store import SchemaTooNewError, Store, StoreError
from servewatch.store.keyed_points import KeyedPoints
from servewatch.store.migrations import LATEST_VERSION, MIGRATIONS
from servewatch.store.target_writes import SEEN_HELD_BACK

RAW_TABLES = ("targets", "scrapes", "series", "points", "requests", "ingest_errors")


def request_rows(n: int, *, offset: int = 0) -> pl.DataFrame:
    base = datetime(2026, 11, 18, 10, 0, 0)
    return pl.DataFrame(
        {
            "trace_id": [f"{i + offset:032x}" for i in range(n)],
            "span_id": [f"{i + offset:016x}" for i in range(n)],
            "request_id": [f"req-{i + offset}" for i in range(n)],
            "replica": ["r0"] * n,
            "host": ["h0"] * n,
            "zone": [None] * n,
            "model": [None] * n,
            "pool": [None] * n,
            "tenant": [None] * n,
            "arrival_ts": [base] * n,
            "end_ts": [base] * n,
            "ok": [True] * n,
            "error_type": [None] * n,
            "prompt_tokens": [10] * n,
            "completion_tokens": [5] * n,
            "ttft_s": [0.1] * n,
            "e2e_s": [0.5] * n,
            "queue_s": [0.01] * n,
            "prefill_s": [0.09] * n,
            "decode_s": [0.4] * n,
            "inference_s": [0.49] * n,
            "max_tokens": [None] * n,
            "emulated": [True] * n,
            "source": ["test"] * n,
            "ingested_ts": [None] * n,
            "conversation_id": [f"conv-{(i + offset) // 3}" for i in range(n)],
            "adapter": [None] * n,
        },
        schema=REQUESTS_SCHEMA,
    )


def test_new_store_has_raw_tables_at_latest_version(store: Store) -> None:
    assert store.schema_version == LATEST_VERSION
    for table in RAW_TABLES:
        assert store.count(table) == 0


@pytest.mark.parametrize(
    ("table", "schema"),
    [
        ("requests", REQUESTS_SCHEMA),
        ("ingest_errors", INGEST_ERRORS_SCHEMA),
        ("targets", TARGETS_SCHEMA),
        ("scrapes", SCRAPES_SCHEMA),
        ("series", SERIES_SCHEMA),
        ("points", POINTS_SCHEMA),
        ("request_minutes", REQUEST_MINUTES_SCHEMA),
        ("slo_minutes", SLO_MINUTES_SCHEMA),
        ("unknown_families", UNKNOWN_FAMILIES_SCHEMA),
        ("alerts", ALERTS_SCHEMA),
        ("recommendations", RECOMMENDATIONS_SCHEMA),
        ("recorded_points", RECORDED_POINTS_SCHEMA),
    ],
)
def test_schema_constants_match_tables(store: Store, table: str, schema: pl.Schema) -> None:
    assert store.table_schema(table) == schema


def test_migration_versions_are_consecutive() -> None:
    # A store at version N skips every migration numbered N or less: a gap, or a migration
    # numbered below one already released, would never run on some stores.
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))


def test_reopen_keeps_data_and_version(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store.open(path) as first:
        first.write_requests(request_rows(3))
    with Store.open(path) as second:
        assert second.schema_version == LATEST_VERSION
        assert second.count("requests") == 3


def test_older_file_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, description VARCHAR NOT NULL,"
        " applied_ts TIMESTAMP NOT NULL)"
    )
    con.close()
    with Store.open(path) as store:
        assert store.schema_version == LATEST_VERSION
        assert store.count("requests") == 0


def test_newer_file_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "new.duckdb"
    Store.open(path).close()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_version VALUES (?, 'from the future', now())", [99])
    con.close()
    with pytest.raises(SchemaTooNewError, match=r"schema version 99.*up to \d+.*upgrade"):
        Store.open(path)


def test_writing_requests_twice_adds_nothing(store: Store) -> None:
    assert store.write_requests(request_rows(5)) == 5
    assert store.write_requests(request_rows(5)) == 0
    assert store.write_requests(request_rows(5, offset=3)) == 3
    assert store.count("requests") == 8


def test_frame_with_wrong_columns_is_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="expected"):
        store.write_requests(request_rows(1).drop("source"))


def test_read_requests_window_is_half_open(store: Store) -> None:
    rows = request_rows(3).with_columns(
        end_ts=pl.Series(
            [datetime(2026, 1, 1, 0, 0, s) for s in (0, 30, 59)], dtype=pl.Datetime("us")
        )
    )
    store.write_requests(rows)
    selected = store.read_requests(
        from_ts=datetime(2026, 1, 1, 0, 0, 0), to_ts=datetime(2026, 1, 1, 0, 0, 59)
    ).collect()
    assert selected["end_ts"].dt.second().to_list() == [0, 30]


def scrape_batch(
    ts_list: list[datetime], *, target: str = "t1"
) -> tuple[pl.DataFrame, pl.DataFrame]:
    scrapes = pl.DataFrame(
        {
            "target_id": [target] * len(ts_list),
            "ts": ts_list,
            "ok": [True] * len(ts_list),
            "duration_s": [0.01] * len(ts_list),
            "samples": [2] * len(ts_list),
            "error": [None] * len(ts_list),
            "kind": ["vllm"] * len(ts_list),
        },
        schema=SCRAPES_SCHEMA,
    )
    rows = [
        (target, ts, ts, metric, '{"engine":"0"}', "sig", "vllm_engine", float(i))
        for i, ts in enumerate(ts_list)
        for metric in ("vllm:num_requests_running", "vllm:num_requests_waiting")
    ]
    samples = pl.DataFrame(rows, schema=SAMPLES_SCHEMA, orient="row")
    return scrapes, samples


def test_scrapes_are_written_once_and_series_get_stable_ids(store: Store) -> None:
    t0 = datetime(2026, 11, 18, 10, 0, 0)
    first = [t0, datetime(2026, 11, 18, 10, 0, 15)]
    assert store.write_scrapes(*scrape_batch(first)) == (2, 4)
    series_before = store.read_series().collect()
    assert store.write_scrapes(*scrape_batch(first)) == (0, 0)
    # A later batch overlapping the first adds only the new scrape's points, same series ids.
    later = [datetime(2026, 11, 18, 10, 0, 15), datetime(2026, 11, 18, 10, 0, 30)]
    assert store.write_scrapes(*scrape_batch(later)) == (1, 2)
    assert store.read_series().collect().equals(series_before)
    assert store.read_series().collect()["series_id"].to_list() == [1, 2]
    points = store.read_points().collect()
    assert points.height == 6
    assert points["series_id"].is_sorted()


def test_new_target_series_continue_the_id_sequence(store: Store) -> None:
    t0 = datetime(2026, 11, 18, 10, 0, 0)
    store.write_scrapes(*scrape_batch([t0], target="a"))
    store.write_scrapes(*scrape_batch([t0], target="b"))
    series = store.read_series().collect()
    assert series.select("series_id", "target_id").rows() == [
        (1, "a"),
        (2, "a"),
        (3, "b"),
        (4, "b"),
    ]


def test_targets_upsert_keeps_the_seen_range(store: Store) -> None:
    def target(first: datetime, last: datetime, zone: str) -> pl.DataFrame:
        return pl.DataFrame(
            [
                (
                    "t1",
                    "vllm",
                    "http://127.0.0.1:1/metrics",
                    "r1",
                    "h1",
                    zone,
                    None,
                    None,
                    1,
                    first,
                    last,
                    None,
                )
            ],
            schema=TARGETS_SCHEMA,
            orient="row",
        )

    early, late = datetime(2026, 1, 1), datetime(2026, 1, 2)
    store.write_targets(target(late, late, "z1"))
    store.write_targets(target(early, early, "z2"))
    row = store.read_targets().collect().row(0, named=True)
    assert (row["first_seen_ts"], row["last_seen_ts"], row["zone"]) == (early, late, "z2")


def test_a_reopened_store_skips_stored_scrapes_and_keeps_series_ids(tmp_path: Path) -> None:
    # What the write path remembers is read back from the tables, not assumed empty.
    t0, t1 = datetime(2026, 11, 18, 10, 0, 0), datetime(2026, 11, 18, 10, 0, 15)
    with Store.open(tmp_path / "s.duckdb") as store:
        assert store.write_scrapes(*scrape_batch([t1])) == (1, 2)
    with Store.open(tmp_path / "s.duckdb") as store:
        assert store.write_scrapes(*scrape_batch([t1])) == (0, 0)
        # older than the latest stored scrape of the target, but never stored: it is new
        assert store.write_scrapes(*scrape_batch([t0, t1])) == (1, 2)
        store.write_scrapes(*scrape_batch([t0], target="b"))
        series = store.read_series().collect()
        assert series.select("series_id", "target_id").rows() == [
            (1, "t1"),
            (2, "t1"),
            (3, "b"),
            (4, "b"),
        ]
        assert store.count("points") == 6


def test_keys_written_by_another_connection_are_read_again(tmp_path: Path) -> None:
    t0, t1, t2 = (datetime(2026, 11, 18, 10, 0, s) for s in (0, 15, 30))
    with Store.open(tmp_path / "s.duckdb") as one, Store.open(tmp_path / "s.duckdb") as other:
        one.write_scrapes(*scrape_batch([t0], target="a"))
        other.write_scrapes(*scrape_batch([t1], target="b"))  # ids 3, 4: unknown to `one`
        other.write_scrapes(*scrape_batch([t2], target="a"))  # a scrape `one` has not seen
        assert one.write_scrapes(*scrape_batch([t2], target="a")) == (0, 0)
        assert one.write_scrapes(*scrape_batch([t1], target="c")) == (1, 2)
        series = one.read_series().collect()
        assert series["series_id"].to_list() == [1, 2, 3, 4, 5, 6]
        assert series["target_id"].to_list() == ["a", "a", "b", "b", "c", "c"]


def test_targets_written_with_scrapes_keep_the_seen_range(store: Store) -> None:
    def target(first: datetime, last: datetime, zone: str | None = None) -> pl.DataFrame:
        row = ("t1", "vllm", "http://127.0.0.1:1/metrics", "r1", "h1", zone, None, None, 1)
        return pl.DataFrame([(*row, first, last, None)], schema=TARGETS_SCHEMA, orient="row")

    t0, t1 = datetime(2026, 11, 18, 10, 0, 0), datetime(2026, 11, 18, 10, 0, 15)
    store.write_scrapes(*scrape_batch([t1]), targets=target(t1, t1))
    store.write_scrapes(*scrape_batch([t0]), targets=target(t0, t0))  # a late page
    store.write_scrapes(*scrape_batch([t1]), targets=target(t1, t1))  # re-sent: no change
    row = store.read_targets().collect().row(0, named=True)
    assert (row["first_seen_ts"], row["last_seen_ts"], row["zone"]) == (t0, t1, None)
    store.write_targets(target(t1, t1, zone="z1"))  # an attribute changed: the row follows
    later = datetime(2026, 11, 18, 10, 0, 30)
    store.write_scrapes(*scrape_batch([later]), targets=target(later, later, zone="z1"))
    row = store.read_targets().collect().row(0, named=True)
    assert (row["first_seen_ts"], row["last_seen_ts"], row["zone"]) == (t0, later, "z1")


def test_seen_times_held_back_are_exact_to_every_reader(tmp_path: Path) -> None:
    def target(at: datetime, zone: str | None = None) -> pl.DataFrame:
        row = ("t1", "vllm", "http://127.0.0.1:1/metrics", "r1", "h1", zone, None, None, 1)
        return pl.DataFrame([(*row, at, at, None)], schema=TARGETS_SCHEMA, orient="row")

    def in_table(path: Path) -> tuple[datetime, datetime]:
        # The table itself, around the store's own reads (which write held-back times first).
        with duckdb.connect(str(path)) as con:  # in this process: beside an open store too
            rows = con.execute("SELECT first_seen_ts, last_seen_ts FROM targets").fetchall()
        return rows[0]

    path = tmp_path / "s.duckdb"
    t0 = datetime(2026, 11, 18, 10, 0, 0)
    seconds = [0, 15, 30, 45, 60, 75, 90]
    with Store.open(path) as store:
        for s in seconds:
            at = t0 + timedelta(seconds=s)
            store.write_scrapes(*scrape_batch([at]), targets=target(at))
            row = store.read_targets().collect().row(0, named=True)
            assert (row["first_seen_ts"], row["last_seen_ts"]) == (t0, at)
        later = t0 + timedelta(seconds=105)
        store.write_scrapes(*scrape_batch([later]), targets=target(later))
    assert in_table(path) == (t0, later)  # written at close

    with Store.open(path) as store:
        for s in range(120, 120 + 15 * 6, 15):  # 75 s of steady batches, read by nobody
            at = t0 + timedelta(seconds=s)
            store.write_scrapes(*scrape_batch([at]), targets=target(at))
        at = t0 + timedelta(seconds=120 + 15 * 5)
        # Held back at most SEEN_HELD_BACK: one batch of the six wrote them.
        first, last = in_table(path)
        assert first == t0
        assert at - last < SEEN_HELD_BACK
        store.write_scrapes(*scrape_batch([at + timedelta(seconds=15)]), targets=target(at, "z"))
        # A changed target writes what was held back with it, and the upsert keeps the later.
        assert in_table(path) == (t0, at)


def test_keyed_points_store_what_their_samples_would() -> None:
    t0, t1, t2 = (datetime(2026, 11, 18, 10, 0, s) for s in (0, 15, 30))
    with Store.open(":memory:") as by_id, Store.open(":memory:") as by_sample:
        for store in (by_id, by_sample):
            store.write_scrapes(*scrape_batch([t0]))
        scrapes, samples = scrape_batch([t1, t2])
        keys = samples.filter(pl.col("ts") == t1).select("metric", "labels")
        ids = by_id.series_ids("t1", keys)
        assert ids is not None
        assert by_id.series_ids("t1", pl.DataFrame({"metric": ["x"], "labels": ["{}"]})) is None
        keyed = [
            KeyedPoints(ids, ts, samples.filter(pl.col("ts") == ts).get_column("value").to_list())
            for ts in (t1, t2)
        ]
        empty = samples.clear()
        assert by_id.write_scrapes(scrapes, empty, keyed=keyed) == (2, 4)
        assert by_id.write_scrapes(scrapes, empty, keyed=keyed) == (0, 0)  # stored once
        assert by_sample.write_scrapes(scrapes, samples) == (2, 4)
        for read in (Store.read_scrapes, Store.read_series, Store.read_points):
            assert read(by_id).collect().equals(read(by_sample).collect())
        with pytest.raises(ValueError, match="series ids of another store"):
            by_sample.write_scrapes(scrapes, empty, keyed=keyed)
