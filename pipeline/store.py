"""The DuckDB store: the one module that holds SQL connections and owns the schema.

The schema grows only through numbered migrations (`MIGRATIONS`); a file is brought up to date
when it is opened, and a file written by a newer servewatch is refused rather than misread.
Writes are idempotent: re-writing a row that is already there changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Self

import duckdb
import polars as pl

from pipeline.tables import INGEST_ERRORS_SCHEMA, REQUESTS_SCHEMA

IN_MEMORY = ":memory:"


class StoreError(Exception):
    """The store file cannot be used as asked."""


class SchemaTooNewError(StoreError):
    """The file was written by a newer servewatch whose schema this version does not know."""


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


# Append only: a released migration never changes, a new need gets a new number.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        description="raw layer: targets, scrapes, series, points, requests, ingest_errors",
        statements=(
            """
            CREATE TABLE targets (
                target_id    VARCHAR PRIMARY KEY,
                kind         VARCHAR NOT NULL,
                url          VARCHAR,
                replica      VARCHAR,
                host         VARCHAR,
                zone         VARCHAR,
                model        VARCHAR,
                pool         VARCHAR,
                gpus         INTEGER,
                first_seen_ts TIMESTAMP,
                last_seen_ts  TIMESTAMP
            )
            """,
            """
            CREATE TABLE scrapes (
                target_id  VARCHAR NOT NULL,
                ts         TIMESTAMP NOT NULL,
                ok         BOOLEAN NOT NULL,
                duration_s DOUBLE,
                samples    INTEGER,
                error      VARCHAR,
                PRIMARY KEY (target_id, ts)
            )
            """,
            """
            CREATE TABLE series (
                series_id  INTEGER PRIMARY KEY,
                target_id  VARCHAR NOT NULL,
                signal     VARCHAR,
                metric     VARCHAR NOT NULL,
                labels     VARCHAR NOT NULL,
                UNIQUE (target_id, metric, labels)
            )
            """,
            """
            CREATE TABLE points (
                series_id INTEGER NOT NULL,
                ts        TIMESTAMP NOT NULL,
                value     DOUBLE
            )
            """,
            """
            CREATE TABLE requests (
                trace_id          VARCHAR NOT NULL,
                span_id           VARCHAR NOT NULL,
                request_id        VARCHAR,
                replica           VARCHAR,
                host              VARCHAR,
                zone              VARCHAR,
                model             VARCHAR,
                pool              VARCHAR,
                tenant            VARCHAR,
                arrival_ts        TIMESTAMP NOT NULL,
                end_ts            TIMESTAMP NOT NULL,
                ok                BOOLEAN NOT NULL,
                error_type        VARCHAR,
                prompt_tokens     BIGINT,
                completion_tokens BIGINT,
                ttft_s            DOUBLE,
                e2e_s             DOUBLE,
                queue_s           DOUBLE,
                prefill_s         DOUBLE,
                decode_s          DOUBLE,
                inference_s       DOUBLE,
                max_tokens        BIGINT,
                emulated          BOOLEAN NOT NULL,
                source            VARCHAR,
                PRIMARY KEY (trace_id, span_id)
            )
            """,
            """
            CREATE TABLE ingest_errors (
                source      VARCHAR NOT NULL,
                location    VARCHAR NOT NULL,
                message     VARCHAR NOT NULL,
                recorded_ts TIMESTAMP NOT NULL,
                PRIMARY KEY (source, location)
            )
            """,
        ),
    ),
)

LATEST_VERSION = MIGRATIONS[-1].version


def _column_list(schema: pl.Schema) -> str:
    return ", ".join(schema.names())


class Store:
    """An open store file. Use as a context manager, or call `close()`."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: str) -> None:
        self._con = connection
        self.path = path

    @classmethod
    def open(cls, path: Path | str, *, now: datetime | None = None) -> Self:
        """Open (creating if needed) the store at `path` and migrate it to the latest schema."""
        location = str(path)
        if location != IN_MEMORY:
            Path(location).parent.mkdir(parents=True, exist_ok=True)
        try:
            connection = duckdb.connect(location)
        except duckdb.Error as exc:
            raise StoreError(f"cannot open store {location}: {exc}") from exc
        store = cls(connection, location)
        try:
            store._migrate(now=now or datetime.now(UTC))
        except BaseException:
            connection.close()
            raise
        return store

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._con.close()

    # -- schema -------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        return self._scalar("SELECT coalesce(max(version), 0) FROM schema_version")

    def _migrate(self, *, now: datetime) -> None:
        self._con.execute(
            """
            CREATE TABLE IF NOT EXISTS schema_version (
                version     INTEGER PRIMARY KEY,
                description VARCHAR NOT NULL,
                applied_ts  TIMESTAMP NOT NULL
            )
            """
        )
        current = self.schema_version
        if current > LATEST_VERSION:
            raise SchemaTooNewError(
                f"store {self.path} has schema version {current}, but this servewatch knows "
                f"versions up to {LATEST_VERSION}: upgrade servewatch, or pass another --db"
            )
        applied_ts = now.astimezone(UTC).replace(tzinfo=None)
        for migration in MIGRATIONS:
            if migration.version <= current:
                continue
            self._con.execute("BEGIN TRANSACTION")
            try:
                for statement in migration.statements:
                    self._con.execute(statement)
                self._con.execute(
                    "INSERT INTO schema_version VALUES (?, ?, ?)",
                    [migration.version, migration.description, applied_ts],
                )
                self._con.execute("COMMIT")
            except duckdb.Error as exc:
                self._con.execute("ROLLBACK")
                raise StoreError(
                    f"migration {migration.version} ({migration.description}) failed on "
                    f"{self.path}: {exc}"
                ) from exc

    def table_schema(self, table: str) -> pl.Schema:
        """The Polars schema of an existing table (for checks against `pipeline.tables`)."""
        empty: pl.DataFrame = self._con.sql(f"SELECT * FROM {_identifier(table)} LIMIT 0").pl()
        return empty.schema

    def count(self, table: str) -> int:
        return self._scalar(f"SELECT count(*) FROM {_identifier(table)}")

    # -- requests -----------------------------------------------------------------------------

    def write_requests(self, frame: pl.DataFrame) -> int:
        """Insert request rows, ignoring ones already stored (same trace and span id).

        Returns how many rows were new.
        """
        return self._insert_new("requests", frame, REQUESTS_SCHEMA)

    def read_requests(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        """Requests that finished in [from_ts, to_ts) (naive UTC), oldest first."""
        clauses, params = _window_clauses("end_ts", from_ts, to_ts)
        sql = f"SELECT {_column_list(REQUESTS_SCHEMA)} FROM requests{clauses} ORDER BY end_ts"
        frame: pl.DataFrame = self._con.sql(sql, params=params).pl()
        return frame.lazy()

    # -- ingest errors ------------------------------------------------------------------------

    def write_ingest_errors(self, frame: pl.DataFrame) -> int:
        """Record rejected input; one row per (source, location), so re-ingest adds nothing."""
        return self._insert_new("ingest_errors", frame, INGEST_ERRORS_SCHEMA)

    def read_ingest_errors(self) -> pl.LazyFrame:
        sql = f"SELECT {_column_list(INGEST_ERRORS_SCHEMA)} FROM ingest_errors ORDER BY source"
        frame: pl.DataFrame = self._con.sql(sql).pl()
        return frame.lazy()

    # -- helpers ------------------------------------------------------------------------------

    def _scalar(self, sql: str) -> int:
        # fetchall, not fetchone: DuckDB 2 keeps a partly fetched result open on the connection.
        rows = self._con.execute(sql).fetchall()
        return int(rows[0][0])

    def _insert_new(self, table: str, frame: pl.DataFrame, schema: pl.Schema) -> int:
        if frame.schema != schema:
            raise StoreError(
                f"frame for table {table} has columns {dict(frame.schema)}, expected {dict(schema)}"
            )
        if frame.height == 0:
            return 0
        before = self.count(table)
        incoming = frame.to_arrow()
        self._con.register("incoming", incoming)
        try:
            self._con.execute(
                f"INSERT INTO {table} ({_column_list(schema)}) "
                f"SELECT {_column_list(schema)} FROM incoming ON CONFLICT DO NOTHING"
            )
        finally:
            self._con.unregister("incoming")
        return self.count(table) - before


def _identifier(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise StoreError(f"not a table name: {name!r}")
    return name


def _window_clauses(
    column: str, from_ts: datetime | None, to_ts: datetime | None
) -> tuple[str, list[datetime]]:
    conditions: list[str] = []
    params: list[datetime] = []
    if from_ts is not None:
        conditions.append(f"{column} >= ?")
        params.append(from_ts)
    if to_ts is not None:
        conditions.append(f"{column} < ?")
        params.append(to_ts)
    return (" WHERE " + " AND ".join(conditions) if conditions else "", params)
