"""The store's connection and clock, and the few queries every part of it uses."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

import duckdb
import polars as pl

from servewatch.store.sql import identifier
from servewatch.store.written_keys import WrittenKeys

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """Naive UTC now: the store's time convention."""
    return datetime.now(UTC).replace(tzinfo=None)


class StoreBase:
    """An open DuckDB connection with its path and clock; the base of every part of `Store`."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: str, clock: Clock) -> None:
        self._con = connection
        self.path = path
        self._clock = clock
        self._written = WrittenKeys()
        # Targets' seen times the write path holds back, by target (`PointWrites`), and the
        # latest scrape time of the batch that last wrote them.
        self._unwritten_seen: dict[str, tuple[object, ...]] = {}
        self._seen_written_ts: datetime | None = None
        self.reads: Counter[str] = Counter()
        """How often each table's rows were read through this connection (a table read once
        per window is what `read_window` promises, and the tests count)."""

    def _settle(self) -> None:
        """Write what the write path holds back; called before anything reads its tables."""

    def now(self) -> datetime:
        """The store's clock (naive UTC), injected at open for tests."""
        return self._clock()

    def table_schema(self, table: str) -> pl.Schema:
        """The Polars schema of an existing table (for checks against `pipeline.tables`)."""
        empty: pl.DataFrame = self._con.sql(f"SELECT * FROM {identifier(table)} LIMIT 0").pl()
        return empty.schema

    def tables(self) -> dict[str, tuple[str, ...]]:
        """Every table and view of the schema (temporary ones aside), with its columns in
        order: what docs/schema.md documents."""
        rows = self._con.execute(
            "SELECT table_name, column_name FROM duckdb_columns() "
            "WHERE NOT internal AND database_name <> 'temp' ORDER BY table_name, column_index"
        ).fetchall()
        out: dict[str, list[str]] = {}
        for table, column in rows:
            out.setdefault(str(table), []).append(str(column))
        return {table: tuple(columns) for table, columns in out.items()}

    def count(self, table: str) -> int:
        return self._scalar(f"SELECT count(*) FROM {identifier(table)}")

    def setting(self, name: str) -> str:
        """The current value of one of DuckDB's settings for this store, as DuckDB prints it
        (`threads` -> '2', `checkpoint_threshold` -> '61.0 MiB')."""
        rows = self._con.execute("SELECT current_setting(?)", [name]).fetchall()
        return str(rows[0][0])

    def _scalar(self, sql: str) -> int:
        # fetchall, not fetchone: DuckDB 2 keeps a partly fetched result open on the connection.
        rows = self._con.execute(sql).fetchall()
        return int(rows[0][0])

    def _read(self, sql: str, params: list[datetime] | None = None, *, table: str) -> pl.LazyFrame:
        self.reads[table] += 1
        frame: pl.DataFrame = self._con.sql(sql, params=params or []).pl()
        return frame.lazy()
