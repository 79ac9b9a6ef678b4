"""The DuckDB store: the one module that holds SQL connections and owns the schema.

The schema grows only through numbered migrations (`MIGRATIONS`); a file is brought up to date
when it is opened, and a file written by a newer servewatch is refused rather than misread.
Writes are idempotent: re-writing a row that is already there changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Self

import duckdb
import polars as pl

from pipeline.tables import (
    ALERTS_SCHEMA,
    INGEST_ERRORS_SCHEMA,
    POINTS_SCHEMA,
    RECOMMENDATIONS_SCHEMA,
    REQUEST_MINUTES_SCHEMA,
    REQUESTS_SCHEMA,
    SAMPLES_SCHEMA,
    SCRAPES_SCHEMA,
    SERIES_SCHEMA,
    SLO_MINUTES_SCHEMA,
    TARGETS_SCHEMA,
    UNKNOWN_FAMILIES_SCHEMA,
)

IN_MEMORY = ":memory:"

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """Naive UTC now: the store's time convention."""
    return datetime.now(UTC).replace(tzinfo=None)


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

MIGRATIONS += (
    Migration(
        version=2,
        description="rollup layer: request_minutes, slo_minutes, rollup_watermarks; "
        "requests.ingested_ts for incremental rollups",
        statements=(
            "ALTER TABLE requests ADD COLUMN ingested_ts TIMESTAMP",
            """
            CREATE TABLE request_minutes (
                replica           VARCHAR,
                minute_ts         TIMESTAMP NOT NULL,
                requests          BIGINT NOT NULL,
                failed_requests   BIGINT NOT NULL,
                prompt_tokens     BIGINT,
                completion_tokens BIGINT,
                ttft_p50_s DOUBLE, ttft_p95_s DOUBLE, ttft_p99_s DOUBLE,
                tpot_p50_s DOUBLE, tpot_p95_s DOUBLE, tpot_p99_s DOUBLE,
                e2e_p50_s  DOUBLE, e2e_p95_s  DOUBLE, e2e_p99_s  DOUBLE
            )
            """,
            """
            CREATE TABLE slo_minutes (
                minute_ts TIMESTAMP NOT NULL,
                slo       VARCHAR NOT NULL,
                replica   VARCHAR,
                good      BIGINT NOT NULL,
                total     BIGINT NOT NULL
            )
            """,
            """
            CREATE TABLE rollup_watermarks (
                source       VARCHAR PRIMARY KEY,
                watermark_ts TIMESTAMP,
                fingerprint  VARCHAR NOT NULL,
                updated_ts   TIMESTAMP NOT NULL
            )
            """,
        ),
    ),
)

MIGRATIONS += (
    Migration(
        version=3,
        description="series.source (engine, router, dcgm) and unknown_families",
        statements=(
            "ALTER TABLE series ADD COLUMN source VARCHAR",
            """
            CREATE TABLE unknown_families (
                target_id    VARCHAR NOT NULL,
                family       VARCHAR NOT NULL,
                samples      BIGINT NOT NULL,
                first_seen_ts TIMESTAMP NOT NULL,
                last_seen_ts  TIMESTAMP NOT NULL,
                PRIMARY KEY (target_id, family)
            )
            """,
        ),
    ),
)

MIGRATIONS += (
    Migration(
        version=4,
        description="results layer: alerts (state history), recommendations (decision records)",
        statements=(
            """
            CREATE TABLE alerts (
                slo                   VARCHAR NOT NULL,
                severity              VARCHAR NOT NULL,
                long_window_s         BIGINT NOT NULL,
                short_window_s        BIGINT NOT NULL,
                state                 VARCHAR NOT NULL,
                changed_ts            TIMESTAMP NOT NULL,
                active_since_ts       TIMESTAMP,
                long_burn_rate        DOUBLE,
                short_burn_rate       DOUBLE,
                burn_threshold        DOUBLE NOT NULL,
                budget_consumed_ratio DOUBLE,
                labels                VARCHAR NOT NULL,
                PRIMARY KEY (slo, long_window_s, short_window_s, changed_ts)
            )
            """,
            """
            CREATE TABLE recommendations (
                created_ts TIMESTAMP NOT NULL,
                name       VARCHAR NOT NULL,
                verdict    VARCHAR NOT NULL,
                record     VARCHAR NOT NULL,
                PRIMARY KEY (name, created_ts)
            )
            """,
        ),
    ),
)

MIGRATIONS += (
    Migration(
        version=5,
        description="slo_minutes by pool, model and tenant too, so SLO scopes can select them",
        statements=(
            "ALTER TABLE slo_minutes ADD COLUMN pool VARCHAR",
            "ALTER TABLE slo_minutes ADD COLUMN model VARCHAR",
            "ALTER TABLE slo_minutes ADD COLUMN tenant VARCHAR",
            # Recomputed by the next rollup, now with the new columns filled.
            "DELETE FROM rollup_watermarks WHERE source = 'requests'",
        ),
    ),
)

LATEST_VERSION = MIGRATIONS[-1].version

_ROLLUP_SCHEMAS = {"request_minutes": REQUEST_MINUTES_SCHEMA, "slo_minutes": SLO_MINUTES_SCHEMA}


def _column_list(schema: pl.Schema) -> str:
    return ", ".join(schema.names())


class Store:
    """An open store file. Use as a context manager, or call `close()`."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: str, clock: Clock) -> None:
        self._con = connection
        self.path = path
        self._clock = clock

    @classmethod
    def open(cls, path: Path | str, *, clock: Clock = utc_now) -> Self:
        """Open (creating if needed) the store at `path` and migrate it to the latest schema."""
        location = str(path)
        if location != IN_MEMORY:
            Path(location).parent.mkdir(parents=True, exist_ok=True)
        try:
            connection = duckdb.connect(location)
        except duckdb.Error as exc:
            if "lock" in str(exc).lower():
                raise StoreError(
                    f"store {location} is in use by another process (one process writes a "
                    f"store; is a `servewatch run` using it?): {exc}"
                ) from exc
            raise StoreError(f"cannot open store {location}: {exc}") from exc
        store = cls(connection, location, clock)
        try:
            store._migrate(now=clock())
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

    def now(self) -> datetime:
        """The store's clock (naive UTC), injected at open for tests."""
        return self._clock()

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
        applied_ts = now.astimezone(UTC).replace(tzinfo=None) if now.tzinfo else now
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

        Rows are stamped with `ingested_ts` (now) unless they carry one; rollups use it to find
        what arrived since they last ran. Returns how many rows were new.
        """
        _check_schema("requests", frame, REQUESTS_SCHEMA)
        stamped = frame.with_columns(
            pl.col("ingested_ts").fill_null(pl.lit(self._clock(), dtype=pl.Datetime("us")))
        )
        return self._insert_new("requests", stamped, REQUESTS_SCHEMA)

    def read_requests(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        """Requests that finished in [from_ts, to_ts) (naive UTC), oldest first."""
        clauses, params = _window_clauses("end_ts", from_ts, to_ts)
        sql = f"SELECT {_column_list(REQUESTS_SCHEMA)} FROM requests{clauses} ORDER BY end_ts"
        return self._read(sql, params)

    # -- targets, scrapes and samples ---------------------------------------------------------

    def write_targets(self, frame: pl.DataFrame) -> None:
        """Insert or update targets; first_seen_ts keeps the earliest, last_seen_ts the latest."""
        _check_schema("targets", frame, TARGETS_SCHEMA)
        if frame.height == 0:
            return
        self._con.register("incoming_targets", frame.to_arrow())
        try:
            self._con.execute(
                f"""
                INSERT INTO targets ({_column_list(TARGETS_SCHEMA)})
                SELECT {_column_list(TARGETS_SCHEMA)} FROM incoming_targets
                ON CONFLICT (target_id) DO UPDATE SET
                    kind = excluded.kind, url = excluded.url, replica = excluded.replica,
                    host = excluded.host, zone = excluded.zone, model = excluded.model,
                    pool = excluded.pool, gpus = excluded.gpus,
                    first_seen_ts = least(targets.first_seen_ts, excluded.first_seen_ts),
                    last_seen_ts = greatest(targets.last_seen_ts, excluded.last_seen_ts)
                """
            )
        finally:
            self._con.unregister("incoming_targets")

    def write_scrapes(self, scrapes: pl.DataFrame, samples: pl.DataFrame) -> tuple[int, int]:
        """Record scrapes and their samples; a scrape already stored (same target and time) is
        skipped with its samples, so replaying a recording twice changes nothing.

        New (target, metric, labels) combinations get the next integer series ids. Points are
        written ordered by series and time, which is what DuckDB compresses best.
        Returns (new scrapes, new points).
        """
        _check_schema("scrapes", scrapes, SCRAPES_SCHEMA)
        _check_schema("samples", samples, SAMPLES_SCHEMA)
        if scrapes.height == 0:
            return (0, 0)
        scrapes_before, points_before = self.count("scrapes"), self.count("points")
        self._con.register("incoming_scrapes", scrapes.to_arrow())
        self._con.register("incoming_samples", samples.to_arrow())
        self._con.execute("BEGIN TRANSACTION")
        try:
            self._con.execute(
                """
                CREATE OR REPLACE TEMP TABLE new_scrapes AS
                SELECT DISTINCT ON (target_id, ts) * FROM incoming_scrapes s
                WHERE NOT EXISTS (
                    SELECT 1 FROM scrapes e WHERE e.target_id = s.target_id AND e.ts = s.ts
                )
                """
            )
            self._con.execute(
                f"INSERT INTO scrapes SELECT {_column_list(SCRAPES_SCHEMA)} FROM new_scrapes"
            )
            self._con.execute(
                """
                CREATE OR REPLACE TEMP TABLE new_samples AS
                SELECT i.* FROM incoming_samples i
                JOIN new_scrapes n ON i.target_id = n.target_id AND i.scrape_ts = n.ts
                """
            )
            self._con.execute(
                """
                INSERT INTO series (series_id, target_id, signal, metric, labels, source)
                SELECT (SELECT coalesce(max(series_id), 0) FROM series)
                           + row_number() OVER (ORDER BY target_id, metric, labels),
                       target_id, signal, metric, labels, source
                FROM (
                    SELECT target_id, metric, labels, any_value(signal) AS signal,
                           any_value(source) AS source
                    FROM new_samples n
                    WHERE NOT EXISTS (
                        SELECT 1 FROM series s WHERE s.target_id = n.target_id
                        AND s.metric = n.metric AND s.labels = n.labels
                    )
                    GROUP BY target_id, metric, labels
                )
                """
            )
            self._con.execute(
                """
                INSERT INTO points (series_id, ts, value)
                SELECT s.series_id, n.ts, n.value
                FROM new_samples n
                JOIN series s ON s.target_id = n.target_id AND s.metric = n.metric
                    AND s.labels = n.labels
                ORDER BY s.series_id, n.ts
                """
            )
            self._con.execute("DROP TABLE new_samples")
            self._con.execute("DROP TABLE new_scrapes")
            self._con.execute("COMMIT")
        except duckdb.Error as exc:
            self._con.execute("ROLLBACK")
            raise StoreError(
                f"writing {scrapes.height} scrapes to {self.path} failed: {exc}"
            ) from exc
        finally:
            self._con.unregister("incoming_scrapes")
            self._con.unregister("incoming_samples")
        return (self.count("scrapes") - scrapes_before, self.count("points") - points_before)

    def count_unknown_families(self, frame: pl.DataFrame) -> None:
        """Add to the per-target tally of sample families no catalogue knows."""
        _check_schema("unknown_families", frame, UNKNOWN_FAMILIES_SCHEMA)
        if frame.height == 0:
            return
        self._con.register("incoming_unknown", frame.to_arrow())
        try:
            self._con.execute(
                f"""
                INSERT INTO unknown_families ({_column_list(UNKNOWN_FAMILIES_SCHEMA)})
                SELECT {_column_list(UNKNOWN_FAMILIES_SCHEMA)} FROM incoming_unknown
                ON CONFLICT (target_id, family) DO UPDATE SET
                    samples = unknown_families.samples + excluded.samples,
                    first_seen_ts = least(unknown_families.first_seen_ts, excluded.first_seen_ts),
                    last_seen_ts = greatest(unknown_families.last_seen_ts, excluded.last_seen_ts)
                """
            )
        finally:
            self._con.unregister("incoming_unknown")

    def read_unknown_families(self) -> pl.LazyFrame:
        return self._read(
            f"SELECT {_column_list(UNKNOWN_FAMILIES_SCHEMA)} FROM unknown_families "
            "ORDER BY target_id, family"
        )

    def points_range(self) -> tuple[datetime, datetime] | None:
        """First and last sample time stored, or None without points."""
        rows = self._con.execute("SELECT min(ts), max(ts) FROM points").fetchall()
        first, last = rows[0]
        return None if first is None else (first, last)

    def drop_points_before(self, cutoff: datetime) -> int:
        """Retention: delete raw points older than `cutoff`; rollups are kept. Returns rows
        deleted."""
        before = self.count("points")
        self._con.execute("DELETE FROM points WHERE ts < ?", [cutoff])
        return before - self.count("points")

    def read_targets(self) -> pl.LazyFrame:
        return self._read(f"SELECT {_column_list(TARGETS_SCHEMA)} FROM targets ORDER BY target_id")

    def read_scrapes(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        clauses, params = _window_clauses("ts", from_ts, to_ts)
        sql = f"SELECT {_column_list(SCRAPES_SCHEMA)} FROM scrapes{clauses} ORDER BY target_id, ts"
        return self._read(sql, params)

    def read_series(self) -> pl.LazyFrame:
        return self._read(f"SELECT {_column_list(SERIES_SCHEMA)} FROM series ORDER BY series_id")

    def read_points(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        """Points in [from_ts, to_ts), ordered by series and time."""
        clauses, params = _window_clauses("ts", from_ts, to_ts)
        sql = f"SELECT {_column_list(POINTS_SCHEMA)} FROM points{clauses} ORDER BY series_id, ts"
        return self._read(sql, params)

    # -- rollups ------------------------------------------------------------------------------

    def watermark(self, source: str) -> tuple[datetime | None, str | None]:
        """(watermark_ts, fingerprint) of a rollup source; (None, None) before its first run."""
        rows = self._con.execute(
            "SELECT watermark_ts, fingerprint FROM rollup_watermarks WHERE source = ?", [source]
        ).fetchall()
        return (rows[0][0], rows[0][1]) if rows else (None, None)

    def minutes_ingested_since(self, since_ts: datetime | None) -> list[datetime]:
        """Minutes (of completion) touched by requests ingested at or after `since_ts` (all
        minutes when None)."""
        clause, params = ("WHERE ingested_ts >= ?", [since_ts]) if since_ts else ("", [])
        rows = self._con.execute(
            f"SELECT DISTINCT date_trunc('minute', end_ts) AS m FROM requests {clause} ORDER BY m",
            params,
        ).fetchall()
        return [row[0] for row in rows]

    def read_requests_in_minutes(self, minutes: Sequence[datetime]) -> pl.LazyFrame:
        """All requests that finished in any of the given minutes."""
        wanted = pl.DataFrame({"m": list(minutes)}, schema={"m": pl.Datetime("us")})
        self._con.register("wanted_minutes", wanted.to_arrow())
        try:
            return self._read(
                f"SELECT {_column_list(REQUESTS_SCHEMA)} FROM requests "
                "WHERE date_trunc('minute', end_ts) IN (SELECT m FROM wanted_minutes) "
                "ORDER BY end_ts"
            )
        finally:
            self._con.unregister("wanted_minutes")

    def replace_minute_rollup(
        self,
        table: str,
        *,
        minutes: Sequence[datetime],
        frame: pl.DataFrame,
        watermark_ts: datetime | None,
        fingerprint: str,
        full: bool = False,
    ) -> None:
        """Swap in recomputed rows of a minute rollup (`request_minutes` or `slo_minutes`) for
        `minutes` (all minutes when `full`) and move its watermark, in one transaction, so a
        crash leaves either the old or the new state."""
        schema = _ROLLUP_SCHEMAS.get(table)
        if schema is None:
            raise StoreError(f"not a minute rollup: {table!r}; allowed: {sorted(_ROLLUP_SCHEMAS)}")
        _check_schema(table, frame, schema)
        wanted = pl.DataFrame({"m": list(minutes)}, schema={"m": pl.Datetime("us")})
        self._con.register("wanted_minutes", wanted.to_arrow())
        self._con.register("new_rollup_rows", frame.to_arrow())
        self._con.execute("BEGIN TRANSACTION")
        try:
            if full:
                self._con.execute(f"DELETE FROM {table}")
            else:
                self._con.execute(
                    f"DELETE FROM {table} WHERE minute_ts IN (SELECT m FROM wanted_minutes)"
                )
            self._con.execute(
                f"INSERT INTO {table} ({_column_list(schema)}) "
                f"SELECT {_column_list(schema)} FROM new_rollup_rows"
            )
            self._con.execute(
                """
                INSERT INTO rollup_watermarks VALUES (?, ?, ?, ?)
                ON CONFLICT (source) DO UPDATE SET watermark_ts = excluded.watermark_ts,
                    fingerprint = excluded.fingerprint, updated_ts = excluded.updated_ts
                """,
                [table, watermark_ts, fingerprint, self._clock()],
            )
            self._con.execute("COMMIT")
        except duckdb.Error as exc:
            self._con.execute("ROLLBACK")
            raise StoreError(f"replacing {table} in {self.path} failed: {exc}") from exc
        finally:
            for name in ("wanted_minutes", "new_rollup_rows"):
                self._con.unregister(name)

    def read_request_minutes(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        clauses, params = _window_clauses("minute_ts", from_ts, to_ts)
        return self._read(
            f"SELECT {_column_list(REQUEST_MINUTES_SCHEMA)} FROM request_minutes{clauses} "
            "ORDER BY minute_ts, replica",
            params,
        )

    def read_slo_minutes(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        clauses, params = _window_clauses("minute_ts", from_ts, to_ts)
        return self._read(
            f"SELECT {_column_list(SLO_MINUTES_SCHEMA)} FROM slo_minutes{clauses} "
            "ORDER BY slo, minute_ts, replica",
            params,
        )

    # -- results ------------------------------------------------------------------------------

    def write_alert_changes(self, frame: pl.DataFrame) -> int:
        """Append alert state changes (pending, firing, resolved); a change already stored is
        kept once. Returns how many were new."""
        return self._insert_new("alerts", frame, ALERTS_SCHEMA)

    def read_alert_changes(self) -> pl.LazyFrame:
        return self._read(
            f"SELECT {_column_list(ALERTS_SCHEMA)} FROM alerts ORDER BY changed_ts, slo"
        )

    def write_recommendation(self, frame: pl.DataFrame) -> int:
        return self._insert_new("recommendations", frame, RECOMMENDATIONS_SCHEMA)

    def read_recommendations(self) -> pl.LazyFrame:
        return self._read(
            f"SELECT {_column_list(RECOMMENDATIONS_SCHEMA)} FROM recommendations "
            "ORDER BY created_ts"
        )

    # -- ingest errors ------------------------------------------------------------------------

    def write_ingest_errors(self, frame: pl.DataFrame) -> int:
        """Record rejected input; one row per (source, location), so re-ingest adds nothing."""
        return self._insert_new("ingest_errors", frame, INGEST_ERRORS_SCHEMA)

    def read_ingest_errors(self) -> pl.LazyFrame:
        sql = f"SELECT {_column_list(INGEST_ERRORS_SCHEMA)} FROM ingest_errors ORDER BY source"
        return self._read(sql)

    # -- helpers ------------------------------------------------------------------------------

    def _scalar(self, sql: str) -> int:
        # fetchall, not fetchone: DuckDB 2 keeps a partly fetched result open on the connection.
        rows = self._con.execute(sql).fetchall()
        return int(rows[0][0])

    def _read(self, sql: str, params: list[datetime] | None = None) -> pl.LazyFrame:
        frame: pl.DataFrame = self._con.sql(sql, params=params or []).pl()
        return frame.lazy()

    def _insert_new(self, table: str, frame: pl.DataFrame, schema: pl.Schema) -> int:
        _check_schema(table, frame, schema)
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


def _check_schema(what: str, frame: pl.DataFrame, schema: pl.Schema) -> None:
    if frame.schema != schema:
        raise StoreError(
            f"frame for {what} has columns {dict(frame.schema)}, expected {dict(schema)}"
        )


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
