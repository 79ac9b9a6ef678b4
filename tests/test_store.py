"""The store: migrations, refusal of newer files, schema constants, idempotent writes."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import duckdb
import polars as pl
import pytest

from pipeline.store import LATEST_VERSION, MIGRATIONS, SchemaTooNewError, Store, StoreError
from pipeline.tables import INGEST_ERRORS_SCHEMA, REQUESTS_SCHEMA

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
        },
        schema=REQUESTS_SCHEMA,
    )


def test_new_store_has_raw_tables_at_latest_version(store: Store) -> None:
    assert store.schema_version == LATEST_VERSION
    for table in RAW_TABLES:
        assert store.count(table) == 0


def test_schema_constants_match_tables(store: Store) -> None:
    assert store.table_schema("requests") == REQUESTS_SCHEMA
    assert store.table_schema("ingest_errors") == INGEST_ERRORS_SCHEMA


def test_migration_versions_are_consecutive() -> None:
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
