"""The requests write path: deduplication on (trace_id, span_id) without a key index, and
migration 8, which drops that index from existing stores."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl

from servewatch.pipeline.tables import REQUESTS_SCHEMA
from servewatch.store import Store
from servewatch.store.migrations import LATEST_VERSION, MIGRATIONS
from servewatch.store.requests import MAX_TIME_RANGES, RETRY_HORIZON, time_ranges

T0 = datetime(2026, 11, 18, 10, 0, 0)


def spans(n: int, *, seed: int = 3) -> pl.DataFrame:
    """Request rows ending over ten minutes, in completion order, with random ids."""
    rng = random.Random(seed)
    ends = sorted(T0 + timedelta(microseconds=rng.randrange(600_000_000)) for _ in range(n))
    given = {
        "trace_id": [f"{rng.getrandbits(128):032x}" for _ in range(n)],
        "span_id": [f"{rng.getrandbits(64):016x}" for _ in range(n)],
        "request_id": [f"req-{i}" for i in range(n)],
        "arrival_ts": [end - timedelta(seconds=2) for end in ends],
        "end_ts": ends,
        "ok": [True] * n,
        "e2e_s": [2.0] * n,
        "emulated": [False] * n,
        "source": ["test"] * n,
    }
    return pl.DataFrame(
        {name: given.get(name, [None] * n) for name in REQUESTS_SCHEMA.names()},
        schema=REQUESTS_SCHEMA,
    )


def stored(store: Store) -> pl.DataFrame:
    return store._read("SELECT * FROM requests ORDER BY rowid", table="requests").collect()


def test_repeats_within_one_frame_are_stored_once_and_the_first_is_kept() -> None:
    rows = spans(4)
    again = rows.slice(1, 1).with_columns(request_id=pl.lit("req-repeat"))
    with Store.open(":memory:") as store:
        assert store.write_requests(pl.concat([rows, again, rows.slice(3, 1)])) == 4
        assert stored(store)["request_id"].to_list() == [f"req-{i}" for i in range(4)]


def test_replaying_spans_in_other_batches_leaves_the_same_table() -> None:
    rows = spans(300)
    clock = lambda: datetime(2026, 11, 18, 11, 0, 0)  # noqa: E731 (the stores' fixed clock)
    with Store.open(":memory:", clock=clock) as once, Store.open(":memory:", clock=clock) as twice:
        for start in range(0, rows.height, 40):
            once.write_requests(rows.slice(start, 40))
            twice.write_requests(rows.slice(start, 40))
        # A replay in shuffled batches of other sizes, each spanning other end times, some
        # mixing new rows with stored ones.
        replay = pl.concat([rows.sample(fraction=1.0, shuffle=True, seed=5), spans(10, seed=8)])
        new = sum(twice.write_requests(replay.slice(start, 23)) for start in range(0, 310, 23))
        assert new == 10
        once.write_requests(spans(10, seed=8))
        assert stored(twice).equals(stored(once))
        assert twice.count("requests") == 310


def test_a_stored_span_id_of_another_trace_leaves_the_row_in() -> None:
    rows = spans(5)
    other_trace = rows.slice(2, 1).with_columns(trace_id=pl.lit("f" * 32), request_id=pl.lit("x"))
    with Store.open(":memory:") as store:
        assert store.write_requests(rows) == 5
        assert store.write_requests(pl.concat([rows.slice(2, 1), other_trace])) == 1
        assert stored(store)["request_id"].to_list() == [*(f"req-{i}" for i in range(5)), "x"]


HOUR = timedelta(hours=1)


def test_a_span_resent_with_other_times_within_the_retry_horizon_is_stored_once() -> None:
    now = [datetime(2026, 11, 18, 11, 0, 0)]
    rows = spans(20)
    # The same ids, hours later and otherwise changed: a client that re-stamps its retries.
    moved = rows.with_columns(
        pl.col("end_ts") + timedelta(hours=3),
        pl.col("arrival_ts") + timedelta(hours=2),
        e2e_s=pl.lit(9.0),
    )
    with Store.open(":memory:", clock=lambda: now[0]) as store:
        assert store.write_requests(rows) == 20
        now[0] += RETRY_HORIZON - timedelta(seconds=1)
        assert store.write_requests(moved) == 0
        assert store.write_requests(pl.concat([moved.head(5), spans(3, seed=9)])) == 3
        assert stored(store)["e2e_s"].head(20).to_list() == [2.0] * 20
        # Past the horizon, copies with the same end or the same start time are recognised;
        # only a copy with both moved is not.
        now[0] += timedelta(seconds=2)
        assert store.write_requests(rows.head(4)) == 0
        assert store.write_requests(rows.head(4).with_columns(pl.col("end_ts") + HOUR)) == 0
        assert store.write_requests(moved.head(4)) == 4
        assert store.count("requests") == 27


def test_time_ranges_cover_the_batch_and_leave_out_the_widest_gaps() -> None:
    ends = spans(200)["end_ts"]  # ten minutes from T0
    stragglers = [T0 - timedelta(hours=5), T0 + timedelta(hours=3), T0 + timedelta(hours=3)]
    batch = pl.concat([ends, pl.Series(stragglers, dtype=pl.Datetime("us"))]).shuffle(seed=2)
    ranges = time_ranges(batch)
    assert 3 <= len(ranges) <= MAX_TIME_RANGES
    assert all(any(lo <= end <= hi for lo, hi in ranges) for end in batch)
    between = [T0 - timedelta(hours=4), T0 + timedelta(hours=1), T0 + timedelta(hours=2)]
    assert not any(lo <= t <= hi for lo, hi in ranges for t in between)
    assert time_ranges(batch.head(1)) == [(batch[0], batch[0])]


def _store_at_version_7(path: Path) -> None:
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, description VARCHAR NOT NULL,"
        " applied_ts TIMESTAMP NOT NULL)"
    )
    for migration in MIGRATIONS[:7]:
        for statement in migration.statements:
            con.execute(statement)
        con.execute(
            "INSERT INTO schema_version VALUES (?, ?, ?)",
            [migration.version, migration.description, T0],
        )
    con.close()


def test_migration_8_keeps_the_rows_in_order_and_drops_the_key(tmp_path: Path) -> None:
    path = tmp_path / "v7.duckdb"
    _store_at_version_7(path)
    rows = spans(50).with_columns(ingested_ts=pl.lit(T0, dtype=pl.Datetime("us")))
    con = duckdb.connect(str(path))
    # Version 7 predates migration 9's conversation_id and 10's adapter, which later stores hold
    # null for them.
    con.register("incoming", rows.drop("conversation_id", "adapter").to_arrow())
    con.execute("INSERT INTO requests SELECT * FROM incoming")
    key = "SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'requests' AND "
    assert con.execute(key + "constraint_type = 'PRIMARY KEY'").fetchall() == [(1,)]
    con.close()
    with Store.open(path) as store:
        assert store.schema_version == LATEST_VERSION >= 8
        assert store.table_schema("requests") == REQUESTS_SCHEMA
        as_stored = store._read("SELECT * FROM requests", table="requests").collect()
        assert as_stored.equals(rows)
        assert store._scalar(key + "constraint_type = 'PRIMARY KEY'") == 0
        assert store.write_requests(rows.slice(10, 20)) == 0
        assert store.count("requests") == 50
