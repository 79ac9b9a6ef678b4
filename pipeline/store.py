"""The DuckDB store: the one module that holds SQL connections and owns the schema.

The schema grows only through numbered migrations (`MIGRATIONS`); a file is brought up to date
when it is opened, and a file written by a newer servewatch is refused rather than misread.
Writes are idempotent: re-writing a row that is already there changes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

import duckdb
import polars as pl

from servewatch.pipeline.tables import (
    ALERTS_SCHEMA,
    INGEST_ERRORS_SCHEMA,
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


class StorePathError(StoreError):
    """The path cannot hold a store file: a folder, or below a regular file."""


class StoreMissingError(StorePathError):
    """No store at the path, and the caller asked not to create one."""


class StoreDamagedError(StoreError):
    """The file is not a DuckDB store, or parts of it cannot be read back."""


# What DuckDB says of a file that is not a database, cut short, or overwritten in places.
_DAMAGE_MARKERS = ("not a valid duckdb database", "could not read enough bytes", "corrupt")
# A DuckDB file starts with three 4 KiB headers; its blocks follow.
_FILE_HEADER_BYTES = 3 * 4096
_DAMAGED_ADVICE = "restore it from a backup, or pass another --db"


def damage_error(location: str, exc: BaseException) -> StoreDamagedError | None:
    """The error to show when `exc` is DuckDB saying the store file is damaged; None for
    anything else, so callers outside the store need not know DuckDB's exceptions."""
    if not isinstance(exc, duckdb.Error):
        return None
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not any(marker in detail.lower() for marker in _DAMAGE_MARKERS):
        return None
    return StoreDamagedError(
        f"store {location} is damaged or not a DuckDB store ({detail}); {_DAMAGED_ADVICE}"
    )


def _check_location(path: Path, *, create: bool) -> None:
    """Refuse a path that cannot be a store file; make its folders when creating."""
    if path.is_dir():
        raise StorePathError(f"store {path}: is a folder, not a store file")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise StorePathError(f"store {path}: {parent} is a file, not a folder")
            break
    if path.exists():
        return
    if not create:
        raise StoreMissingError(f"no store at {path}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorePathError(
            f"store {path}: cannot create {path.parent}: {exc.strerror or exc}"
        ) from exc


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

# Migration 6 (superseded by 7 below): points stored in `points_ms` (millisecond timestamps, as
# Prometheus keeps them) and rewritten block by block in (series_id, ts) order once a 2 h block
# was closed; `points` stays the documented (series_id, ts TIMESTAMP, value) relation as a view.
# Its SQL keeps its own 2 h literal: a released migration never changes.
_V6_POINT_BLOCK_SQL = "INTERVAL 2 HOUR"

MIGRATIONS += (
    Migration(
        version=6,
        description="points stored as points_ms (TIMESTAMP_MS) in compacted 2 h blocks; "
        "points is a view; point_blocks tracks blocks awaiting compaction",
        statements=(
            """
            CREATE TABLE points_ms (
                series_id INTEGER NOT NULL,
                ts        TIMESTAMP_MS NOT NULL,
                value     DOUBLE
            )
            """,
            f"""
            INSERT INTO points_ms
            SELECT series_id, ts, value FROM points
            ORDER BY time_bucket({_V6_POINT_BLOCK_SQL}, ts), series_id, ts
            """,
            "DROP TABLE points",
            (
                "CREATE VIEW points AS "
                "SELECT series_id, CAST(ts AS TIMESTAMP) AS ts, value FROM points_ms"
            ),
            """
            CREATE TABLE point_blocks (
                block_ts  TIMESTAMP PRIMARY KEY,
                compacted BOOLEAN NOT NULL
            )
            """,
            f"""
            INSERT INTO point_blocks
            SELECT DISTINCT CAST(time_bucket({_V6_POINT_BLOCK_SQL}, ts) AS TIMESTAMP), true
            FROM points_ms
            """,
        ),
    ),
)

# Migration 7 splits points into three tables, because DuckDB bit-packs a column in groups of
# 2,048 values whose width is set by the group's widest delta, and in series order every series
# boundary jumps a timestamp back by a whole block (23 bits a value in a 2 h block):
# - `points_head`: points as written (series_id, ts TIMESTAMP_MS, value), until their block
#   closes; small, and its deleted rows free blocks that the next head reuses.
# - `point_instants`: each distinct (target, sample time) of a compacted block once, numbered
#   consecutively per target within the block (all series of a target share its scrapes).
# - `point_rows`: (series_id, instant, value) of compacted blocks, ordered by target, series,
#   and time, alternating direction from one series to the next, so the instant column moves by
#   +-1 along a series and by about 0 across a boundary: ~0.3 B a sample instead of ~3.1 B.
# Blocks are 1 h: a block is compacted half a block after its end, so the head peaks at 1.5 h of
# points, whose blocks are left free in the file when it empties; 2 h blocks compress ~0.1 B a
# sample better but double that slack. docs/design-notes.md ("Points storage") has the
# measurements.
POINT_BLOCK = timedelta(hours=1)
_POINT_BLOCK_SQL = "INTERVAL 1 HOUR"
_POINT_BLOCK_TRUNCATE = "1h"

# The statements below (re)write the rows of the temp table `compacting` (series_id, ts,
# value), which the caller has already removed from wherever they were; they are shared by
# `Store.compact_points` and migration 7. Instant ids continue after the highest in use, so a
# block's instants are always one contiguous id range (reads and deletes use it).
_COMPACT_STATEMENTS: tuple[str, ...] = (
    f"""
    CREATE OR REPLACE TEMP TABLE compacting_instants AS
    SELECT (SELECT coalesce(max(instant), 0) FROM point_instants)
               + row_number() OVER (ORDER BY block_ts, target_id, ts) AS instant,
           block_ts, target_id, ts
    FROM (
        SELECT DISTINCT time_bucket({_POINT_BLOCK_SQL}, c.ts) AS block_ts, s.target_id, c.ts
        FROM compacting c LEFT JOIN series s USING (series_id)
    )
    """,
    "INSERT INTO point_instants SELECT instant, ts FROM compacting_instants ORDER BY instant",
    """
    INSERT INTO point_rows
    SELECT series_id, instant, value FROM (
        SELECT c.series_id, i.instant, c.value, i.block_ts, i.target_id,
               dense_rank() OVER (PARTITION BY i.block_ts ORDER BY i.target_id, c.series_id)
                   AS nth_series
        FROM compacting c
        LEFT JOIN series s USING (series_id)
        JOIN compacting_instants i
            ON i.target_id IS NOT DISTINCT FROM s.target_id AND i.ts = c.ts
    )
    ORDER BY block_ts, target_id, series_id,
             CASE WHEN nth_series % 2 = 0 THEN -instant ELSE instant END
    """,
    "DROP TABLE compacting_instants",
    "DROP TABLE compacting",
)

_POINTS_VIEW_SQL = """
    CREATE VIEW points AS
    SELECT p.series_id, CAST(i.ts AS TIMESTAMP) AS ts, p.value
    FROM point_rows p JOIN point_instants i USING (instant)
    UNION ALL
    SELECT series_id, CAST(ts AS TIMESTAMP) AS ts, value FROM points_head
"""

MIGRATIONS += (
    Migration(
        version=7,
        description="points split into points_head (open blocks), point_instants (shared "
        "sample times) and point_rows (compacted blocks); points is a view over them",
        statements=(
            """
            CREATE TABLE points_head (
                series_id INTEGER NOT NULL,
                ts        TIMESTAMP_MS NOT NULL,
                value     DOUBLE
            )
            """,
            """
            CREATE TABLE point_instants (
                instant BIGINT NOT NULL,
                ts      TIMESTAMP_MS NOT NULL
            )
            """,
            """
            CREATE TABLE point_rows (
                series_id INTEGER NOT NULL,
                instant   BIGINT NOT NULL,
                value     DOUBLE
            )
            """,
            # Every stored point is compacted now, the open block too: a later point for it
            # reopens the block (`Store._compact_block` merges both).
            "CREATE TEMP TABLE compacting AS SELECT series_id, ts, value FROM points_ms",
            *_COMPACT_STATEMENTS,
            # point_blocks listed 2 h blocks; now 1 h ones, all compacted.
            "DELETE FROM point_blocks",
            f"""
            INSERT INTO point_blocks
            SELECT DISTINCT CAST(time_bucket({_POINT_BLOCK_SQL}, ts) AS TIMESTAMP), true
            FROM point_instants
            """,
            "DROP VIEW points",
            "DROP TABLE points_ms",
            _POINTS_VIEW_SQL,
        ),
    ),
)

# Migration 8 drops the primary key of `requests`: DuckDB keeps such a key in an index over
# every row, which each insert updates and each checkpoint writes out; storing a million spans
# took three times the CPU of an unkeyed table, and the index twice the table's own space.
# `Store.write_requests` deduplicates instead. DuckDB cannot drop a key in place: the rows are
# copied, in their stored order.
MIGRATIONS += (
    Migration(
        version=8,
        description="requests without a primary key index: the write path deduplicates on "
        "(trace_id, span_id) among the stored rows of the batch's completion times",
        statements=(
            """
            CREATE TABLE requests_unkeyed (
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
                ingested_ts       TIMESTAMP
            )
            """,
            "INSERT INTO requests_unkeyed SELECT * FROM requests",
            "DROP TABLE requests",
            "ALTER TABLE requests_unkeyed RENAME TO requests",
        ),
    ),
)

MIGRATIONS += (
    Migration(
        version=9,
        description="requests.conversation_id: the conversation a request belongs to, when "
        "its span names one (gen_ai.conversation.id), for replaying conversations",
        statements=("ALTER TABLE requests ADD COLUMN conversation_id VARCHAR",),
    ),
)

LATEST_VERSION = MIGRATIONS[-1].version
CHECKPOINT_THRESHOLD = "64MB"

# TPOT as `pipeline.request_sli.with_tpot` defines it: decode time per output token after the
# first (e2e - TTFT where the span lacks the decode time); null for single-token outputs.
_TPOT_SQL = (
    "(CASE WHEN completion_tokens > 1 "
    "THEN coalesce(decode_s, e2e_s - ttft_s) / (completion_tokens - 1) END)"
)


class GoodEventLimits(Protocol):
    """What the store needs of an SLO's good-event criterion
    (`pipeline.request_minutes.EventCriterion`): inclusive limits, None when unconstrained."""

    @property
    def name(self) -> str: ...
    @property
    def ttft_limit_s(self) -> float | None: ...
    @property
    def tpot_limit_s(self) -> float | None: ...
    @property
    def e2e_limit_s(self) -> float | None: ...


_ROLLUP_SCHEMAS = {"request_minutes": REQUEST_MINUTES_SCHEMA, "slo_minutes": SLO_MINUTES_SCHEMA}


@dataclass(frozen=True)
class MinuteRollupSwap:
    """What one swap of a minute rollup put in place: the distinct minutes its new rows cover
    and the requests they count."""

    minutes: int
    requests: int


_SERIES_KEY = ["target_id", "metric", "labels"]
# The stored form of points in `points_head`; reads give `POINTS_SCHEMA` (microsecond
# timestamps).
_POINTS_HEAD_SCHEMA = pl.Schema(
    {"series_id": pl.Int32(), "ts": pl.Datetime("ms"), "value": pl.Float64()}
)
_SERIES_IDS_SCHEMA = pl.Schema(
    {
        "target_id": pl.String(),
        "metric": pl.String(),
        "labels": pl.String(),
        "series_id": pl.Int32(),
    }
)


@dataclass
class _WrittenKeys:
    """What the write path knows of the keys stored, so that a steady batch need not ask
    the tables: targets as stored, each target's latest scrape time, each target's series
    ids (and the highest id), the blocks awaiting compaction. None: not read yet; each is
    read from its table when first needed. Changed only after a commit, so a rolled-back
    batch leaves it as the tables are. Valid while this Store is the only writer of its file
    (DuckDB locks a file to one process; within one, `write_scrapes` is the only writer of
    scrapes and series); should another connection write anyway, the tables' keys still
    refuse a duplicate, and `write_scrapes` then reads them again and retries once."""

    targets: dict[str, tuple[object, ...]] | None = None
    latest_scrape: dict[str, datetime] | None = None
    series: dict[str, pl.DataFrame] | None = None
    max_series_id: int = 0
    open_blocks: set[datetime] | None = None

    def committed(self, scrapes: pl.DataFrame, series: pl.DataFrame, blocks: set[datetime]) -> None:
        if self.latest_scrape is not None:
            # A row a page: few enough for Python, which costs less here than a group-by.
            for target, ts in _scrape_keys(scrapes):
                known = self.latest_scrape.get(target)
                self.latest_scrape[target] = ts if known is None else max(known, ts)
        if self.series is not None and series.height:
            ids = series.select(_SERIES_IDS_SCHEMA.names())
            for (target,), part in ids.partition_by("target_id", as_dict=True).items():
                known_ids = self.series.get(str(target))
                self.series[str(target)] = (
                    part if known_ids is None else pl.concat([known_ids, part], rechunk=True)
                )
            self.max_series_id = max(self.max_series_id, _max_id(ids))
        if self.open_blocks is not None:
            self.open_blocks |= blocks

    def compacted(self, block_ts: datetime) -> None:
        if self.open_blocks is not None:
            self.open_blocks.discard(block_ts)


def _scrape_keys(scrapes: pl.DataFrame) -> list[tuple[str, datetime]]:
    """(target, time) of each scrape: a row a page, few enough for Python lists, which cost
    less here than a Polars select."""
    targets: list[str] = scrapes.get_column("target_id").to_list()
    times: list[datetime] = scrapes.get_column("ts").to_list()
    return list(zip(targets, times, strict=True))


def _points(keyed: pl.LazyFrame) -> pl.LazyFrame:
    """Points as `points_head` stores them, in series and time order."""
    return keyed.select("series_id", ts=pl.col("ts").dt.cast_time_unit("ms"), value="value").sort(
        "series_id", "ts"
    )


_EPOCH = datetime(1970, 1, 1)


def _block_of(ts: datetime) -> datetime:
    """The start of the block `ts` falls in: blocks are counted from the epoch, as
    `dt.truncate` counts them."""
    return _EPOCH + (ts - _EPOCH) // POINT_BLOCK * POINT_BLOCK


def _blocks_of(ts: pl.Series) -> set[datetime]:
    """The blocks (start times) that points at `ts` fall in."""
    first, last = ts.min(), ts.max()
    if first is None:
        return set()
    assert isinstance(first, datetime)
    assert isinstance(last, datetime)
    if _block_of(first) == _block_of(last):  # the common batch: one block, without a unique()
        return {_block_of(first)}
    ends = ts.dt.truncate(_POINT_BLOCK_TRUNCATE).dt.cast_time_unit("us")
    return set(ends.unique().to_list())


def _max_id(ids: pl.DataFrame) -> int:
    return int(ids.select(pl.col("series_id").max().fill_null(0)).item())


def _merged(
    stored: object, incoming: object, pick: Callable[[datetime, datetime], datetime]
) -> object:
    """A seen time merged as the targets upsert does (least / greatest, ignoring nulls)."""
    if isinstance(stored, datetime) and isinstance(incoming, datetime):
        return pick(stored, incoming)
    return incoming if stored is None else stored


@dataclass(frozen=True)
class CompactionReport:
    """Blocks of points rewritten in series order, and the points they held."""

    blocks: int = 0
    points: int = 0

    def plus(self, other: CompactionReport) -> CompactionReport:
        return CompactionReport(self.blocks + other.blocks, self.points + other.points)


def _column_list(schema: pl.Schema) -> str:
    return ", ".join(schema.names())


class Store:
    """An open store file. Use as a context manager, or call `close()`."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: str, clock: Clock) -> None:
        self._con = connection
        self.path = path
        self._clock = clock
        self._written = _WrittenKeys()

    @classmethod
    def open(cls, path: Path | str, *, create: bool = True, clock: Clock = utc_now) -> Self:
        """Open the store at `path` and migrate it to the latest schema. A missing store is
        created with its folders, unless `create` is false (StoreMissingError then); a path
        that cannot be a file raises StorePathError, a damaged file StoreDamagedError."""
        location = str(path)
        logged = False
        if location != IN_MEMORY:
            _check_location(Path(location), create=create)
            logged = Path(f"{location}.wal").exists()
        try:
            connection = duckdb.connect(location)
        except duckdb.Error as exc:
            if "lock" in str(exc).lower():
                raise StoreError(
                    f"store {location} is in use by another process (one process writes a "
                    f"store; is a `servewatch run` using it?): {exc}"
                ) from exc
            damaged = damage_error(location, exc)
            if damaged is not None:
                raise damaged from exc
            raise StoreError(f"cannot open store {location}: {exc}") from exc
        store = cls(connection, location, clock)
        try:
            if location != IN_MEMORY and not logged:
                store._check_length()
            store._use_allowed_cpus()
            # DuckDB checkpoints (moves the write-ahead log into the file) once the log passes
            # 16 MB by default: about every 40,000 stored spans or a few seconds of scrapes, and
            # each checkpoint rewrites the row groups the log touched. A larger log is replayed
            # at the next open after a crash (a second or so), and halves that rework: 11 % more
            # spans stored per second on a million spans. Closing the store still checkpoints.
            connection.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
            store._migrate(now=clock())
        except duckdb.Error as exc:
            connection.close()
            damaged = damage_error(location, exc)
            if damaged is None:
                raise
            raise damaged from exc
        except BaseException:
            connection.close()
            raise
        return store

    def _check_length(self) -> None:
        """Refuse a file shorter than the blocks its header counts (a copy or disk cut short):
        DuckDB opens it and fails only on the first query that reads a missing block. Not
        checked with a write-ahead log pending, whose replay may count blocks not yet written."""
        row = self._con.execute("PRAGMA database_size").fetchone()
        assert row is not None
        block_size, total_blocks = int(row[2]), int(row[3])
        expected = _FILE_HEADER_BYTES + block_size * total_blocks
        length = Path(self.path).stat().st_size
        if length < expected:
            raise StoreDamagedError(
                f"store {self.path} is damaged: {length:,} bytes, but its header counts "
                f"{total_blocks} blocks ({expected:,} bytes; cut short?); {_DAMAGED_ADVICE}"
            )

    def _use_allowed_cpus(self) -> None:
        # DuckDB starts a thread per core of the machine, also when this process may run on
        # fewer (taskset, a container's cpuset): the extra threads then only take turns with
        # the others, which cost a sixth of the requests insert time on one core.
        allowed = getattr(os, "sched_getaffinity", None)
        if allowed is None:  # not every platform tells
            return
        cpus = len(allowed(0))
        if cpus < self._scalar("SELECT current_setting('threads')"):
            self._con.execute(f"SET threads = {cpus}")

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
        """Insert request rows, ignoring ones already stored (same trace and span id) and
        repeats within the frame (the first is kept).

        A stored row counts when its end time or its arrival time lies in the batch's ranges of
        those times (any delay, the same end or the same start), or it was ingested within
        `RETRY_HORIZON` (any other fields): see docs/design-notes.md. Rows are stamped with
        `ingested_ts` (now) unless they carry one; rollups use it to find what arrived since
        they last ran. Returns how many rows were new.
        """
        _check_schema("requests", frame, REQUESTS_SCHEMA)
        if frame.height == 0:
            return 0
        # Span ids alone are 64 random bits: when they are all distinct, so are the keys, and
        # that check hashes one column instead of two.
        if frame["span_id"].n_unique() < frame.height:
            frame = frame.unique(["trace_id", "span_id"], keep="first", maintain_order=True)
        now = self._clock()
        # A stored copy of a span ends when the span ends, so it lies among the stored rows of
        # the batch's completion times; a copy re-emitted with another end time still starts
        # when the request arrived, and any copy sent again lies among the rows ingested lately.
        # Those are the only rows compared: requests are stored roughly in completion (and so
        # arrival) order and exactly in ingest order, so DuckDB skips every other row group by
        # its min/max and the check costs what the batch overlaps plus the last
        # RETRY_HORIZON's rows, not what the table holds.
        ranges = time_ranges(frame["end_ts"])
        starts = time_ranges(frame["arrival_ts"])
        within = " OR ".join(
            ["(r.end_ts >= ? AND r.end_ts <= ?)"] * len(ranges)
            + ["(r.arrival_ts >= ? AND r.arrival_ts <= ?)"] * len(starts)
        )
        keys = frame.select("trace_id", "span_id")
        self._con.register("incoming_keys", keys.to_arrow())
        try:
            stored: pl.DataFrame = self._con.sql(
                "SELECT trace_id, span_id FROM incoming_keys i WHERE EXISTS (SELECT 1 FROM "
                f"requests r WHERE ({within} OR r.ingested_ts >= ?) AND r.trace_id = i.trace_id "
                "AND r.span_id = i.span_id)",
                params=[*(t for r in (*ranges, *starts) for t in r), now - RETRY_HORIZON],
            ).pl()
        finally:
            self._con.unregister("incoming_keys")
        if stored.height:
            # A filter, not a join: the rows keep their order, which is the order stored.
            key = pl.struct("trace_id", "span_id")
            frame = frame.filter(~key.is_in(stored.select(key).to_series().implode()))
            if frame.height == 0:
                return 0
        stamped = frame.with_columns(
            pl.col("ingested_ts").fill_null(pl.lit(now, dtype=pl.Datetime("us")))
        ).to_arrow()
        columns = _column_list(REQUESTS_SCHEMA)
        self._con.register("incoming_requests", stamped)
        try:
            inserted = self._con.execute(
                f"INSERT INTO requests ({columns}) SELECT {columns} FROM incoming_requests"
            ).fetchall()
        finally:
            self._con.unregister("incoming_requests")
        # An INSERT answers with the number of rows it stored.
        return int(inserted[0][0])

    def read_requests(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        """Requests that finished in [from_ts, to_ts) (naive UTC), oldest first."""
        clauses, params = _window_clauses("end_ts", from_ts, to_ts)
        sql = f"SELECT {_column_list(REQUESTS_SCHEMA)} FROM requests{clauses} ORDER BY end_ts"
        return self._read(sql, params)

    # -- targets, scrapes and samples ---------------------------------------------------------

    def write_targets(self, frame: pl.DataFrame) -> None:
        """Insert or update targets; first_seen_ts keeps the earliest, last_seen_ts the latest.

        A scrape round re-sends every target it scraped; targets whose row would not change
        are not written again, and targets known with the same attributes only get their
        seen times moved (an UPDATE, cheaper in DuckDB than an upsert)."""
        _check_schema("targets", frame, TARGETS_SCHEMA)
        self._write_targets(frame)

    def _write_targets(self, frame: pl.DataFrame) -> None:
        if frame.height == 0:
            return
        stored = self._stored_targets()
        moved: list[tuple[object, ...]] = []
        upserted: list[tuple[object, ...]] = []
        for row in frame.iter_rows():
            known = stored.get(row[0])
            if known is None or known[:-2] != row[:-2]:
                upserted.append(row)
                continue
            first = _merged(known[-2], row[-2], min)
            last = _merged(known[-1], row[-1], max)
            if (first, last) != known[-2:]:
                moved.append((*known[:-2], first, last))
        if upserted:
            self._con.register(
                "incoming_targets", pl.DataFrame(upserted, TARGETS_SCHEMA, orient="row").to_arrow()
            )
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
        if moved:
            # The few moved rows go as list parameters: cheaper than scanning an Arrow table.
            self._con.execute(
                "UPDATE targets SET first_seen_ts = m.first_seen_ts, "
                "last_seen_ts = m.last_seen_ts FROM (SELECT unnest(?) AS target_id, "
                "unnest(?) AS first_seen_ts, unnest(?) AS last_seen_ts) m "
                "WHERE targets.target_id = m.target_id",
                [[row[0] for row in moved], [row[-2] for row in moved], [row[-1] for row in moved]],
            )
        if upserted:
            self._written.targets = None  # the upsert merged rows in SQL: read them when needed
        else:
            stored.update((str(row[0]), row) for row in moved)

    def _stored_targets(self) -> dict[str, tuple[object, ...]]:
        if self._written.targets is None:
            rows = self._con.execute(
                f"SELECT {_column_list(TARGETS_SCHEMA)} FROM targets"
            ).fetchall()
            self._written.targets = {row[0]: tuple(row) for row in rows}
        return self._written.targets

    def write_scrapes(
        self,
        scrapes: pl.DataFrame,
        samples: pl.DataFrame,
        *,
        targets: pl.DataFrame | None = None,
    ) -> tuple[int, int]:
        """Record scrapes and their samples; a scrape already stored (same target and time) is
        skipped with its samples, so replaying a recording twice changes nothing. `targets`,
        if given, are written as `write_targets` does, in the same transaction.

        New (target, metric, labels) combinations get the next integer series ids. Points
        arrive in DuckDB as plain integer and float columns, ordered by series and time;
        blocks that closed meanwhile are then compacted (`compact_points`). Returns (new
        scrapes, new points).

        Cost: a batch in the steady state (known targets and series, scrapes newer than any
        stored for their target, blocks already awaiting compaction) is one transaction of
        an UPDATE of the targets' seen times and two INSERTs, scrapes and points: which
        scrapes are new, the series ids and the open blocks are answered from what this
        store has written (`_WrittenKeys`), and only a batch that those cannot vouch for (a
        replayed or late scrape) asks the tables.
        """
        _check_schema("scrapes", scrapes, SCRAPES_SCHEMA)
        _check_schema("samples", samples, SAMPLES_SCHEMA)
        if targets is None:
            targets = pl.DataFrame(schema=TARGETS_SCHEMA)
        _check_schema("targets", targets, TARGETS_SCHEMA)
        if scrapes.height == 0:
            self._write_targets(targets)
            return (0, 0)
        return self._write_scrapes(scrapes, samples, targets, retry=True)

    def _write_scrapes(
        self, scrapes: pl.DataFrame, samples: pl.DataFrame, targets: pl.DataFrame, *, retry: bool
    ) -> tuple[int, int]:
        new_scrapes = self._new_scrapes(scrapes)
        known = self._known_series(sorted(set(new_scrapes.get_column("target_id"))))
        keyed = samples.lazy().join(
            new_scrapes.lazy().select("target_id", scrape_ts="ts"),
            on=["target_id", "scrape_ts"],
            how="semi",
        )
        keyed = keyed.join(known.lazy(), on=_SERIES_KEY, how="left")
        # A steady batch knows every series: its points are one query; only a batch with new
        # series collects the keyed samples to number them, then points again.
        points = _points(keyed).collect()
        new_series = pl.DataFrame(schema=SERIES_SCHEMA)
        if points.get_column("series_id").null_count():
            known_keyed = keyed.collect()
            new_series = self._new_series(known_keyed)
            points = _points(
                pl.concat(
                    [
                        known_keyed.filter(pl.col("series_id").is_not_null()),
                        known_keyed.filter(pl.col("series_id").is_null())
                        .drop("series_id")
                        .join(new_series.select(*_SERIES_KEY, "series_id"), on=_SERIES_KEY),
                    ]
                ).lazy()
            ).collect()
        if self._may_repeat_points(new_scrapes, samples):
            points = self._unstored_points(points)
        blocks = _blocks_of(points.get_column("ts")) - self._open_blocks()
        self._con.execute("BEGIN TRANSACTION")
        try:
            self._write_targets(targets)
            self._append_few("scrapes", new_scrapes, SCRAPES_SCHEMA)
            self._append("series", new_series, SERIES_SCHEMA)
            self._append("points_head", points, _POINTS_HEAD_SCHEMA)
            self._mark_blocks(blocks)
            self._con.execute("COMMIT")
        except duckdb.Error as exc:
            self._con.execute("ROLLBACK")
            self._written = _WrittenKeys()  # some of it may have been learnt in the transaction
            if retry and isinstance(exc, duckdb.ConstraintException):
                # Keys written by another connection: what was known is read again.
                return self._write_scrapes(scrapes, samples, targets, retry=False)
            raise StoreError(
                f"writing {scrapes.height} scrapes to {self.path} failed: {exc}"
            ) from exc
        self._written.committed(new_scrapes, new_series, blocks)
        if points.height:
            latest = points.get_column("ts").max()
            assert isinstance(latest, datetime)
            before = latest - POINT_BLOCK / 2
            if any(block + POINT_BLOCK <= before for block in self._open_blocks()):
                self.compact_points(before=before)
        return (new_scrapes.height, points.height)

    def _new_scrapes(self, scrapes: pl.DataFrame) -> pl.DataFrame:
        """The scrapes of the batch not stored yet, each (target, time) once. A scrape later
        than any stored for its target is new; only the others are looked up."""
        keys = _scrape_keys(scrapes)
        unique = scrapes
        if len(set(keys)) < len(keys):
            unique = scrapes.unique(["target_id", "ts"], keep="first", maintain_order=True)
            keys = _scrape_keys(unique)
        latest = self._latest_scrapes()
        later = [ts > latest[target] if target in latest else True for target, ts in keys]
        if all(later):
            return unique
        doubtful = unique.filter(~pl.Series(later)).select("target_id", "ts")
        self._con.register("incoming_scrapes", doubtful.to_arrow())
        try:
            stored: pl.DataFrame = self._con.sql(
                "SELECT s.target_id, s.ts FROM incoming_scrapes s "
                "JOIN scrapes e ON e.target_id = s.target_id AND e.ts = s.ts"
            ).pl()
        finally:
            self._con.unregister("incoming_scrapes")
        if stored.height == 0:
            return unique
        return unique.join(stored, on=["target_id", "ts"], how="anti", maintain_order="left")

    def _may_repeat_points(self, new_scrapes: pl.DataFrame, samples: pl.DataFrame) -> bool:
        """Whether a point of the batch may already be stored. Not when every sample is at its
        scrape's time and every scrape is later than any stored for its target: the steady
        batch, decided without asking the tables. Samples with their own timestamps (a page
        ingested again under another scrape time) and late scrapes are looked up."""
        latest = self._latest_scrapes()
        if any(
            target in latest and ts <= latest[target] for target, ts in _scrape_keys(new_scrapes)
        ):
            return True
        return bool((samples.get_column("ts") != samples.get_column("scrape_ts")).any())

    def _unstored_points(self, points: pl.DataFrame) -> pl.DataFrame:
        """`points` less those whose (series, time) is stored, or comes earlier in the batch:
        a sample is stored once however often its page is ingested."""
        points = points.unique(["series_id", "ts"], keep="first", maintain_order=True)
        if points.height == 0:
            return points
        first, last = points.get_column("ts").min(), points.get_column("ts").max()
        incoming_points = points.select("series_id", "ts").to_arrow()  # noqa: F841 (read below)
        stored: pl.DataFrame = self._con.sql(
            "SELECT p.series_id, CAST(p.ts AS TIMESTAMP_MS) AS ts FROM points p "
            "JOIN incoming_points i ON p.series_id = i.series_id "
            "AND p.ts = CAST(i.ts AS TIMESTAMP) WHERE p.ts BETWEEN ? AND ?",
            params=[first, last],
        ).pl()
        if stored.height == 0:
            return points
        return points.join(
            stored.cast({"series_id": pl.Int32(), "ts": pl.Datetime("ms")}),
            on=["series_id", "ts"],
            how="anti",
            maintain_order="left",
        )

    def _latest_scrapes(self) -> dict[str, datetime]:
        if self._written.latest_scrape is None:
            rows = self._con.execute(
                "SELECT target_id, max(ts) FROM scrapes GROUP BY target_id"
            ).fetchall()
            self._written.latest_scrape = dict(rows)
        return self._written.latest_scrape

    def _known_series(self, targets: list[str]) -> pl.DataFrame:
        """(target_id, metric, labels, series_id) of the stored series of `targets`."""
        if self._written.series is None:
            stored: pl.DataFrame = self._con.sql(
                "SELECT target_id, metric, labels, series_id FROM series"
            ).pl()
            self._written.series = {
                str(key[0]): part.rechunk()
                for key, part in stored.partition_by(
                    "target_id", as_dict=True, maintain_order=False
                ).items()
            }
            self._written.max_series_id = _max_id(stored)
        parts = [self._written.series[t] for t in targets if t in self._written.series]
        if not parts:
            return pl.DataFrame(schema=_SERIES_IDS_SCHEMA)
        return pl.concat(parts, rechunk=False)

    def _new_series(self, keyed: pl.DataFrame) -> pl.DataFrame:
        """Series rows for the keys of `keyed` without a series id, numbered after the
        highest id in use in (target, metric, labels) order."""
        if keyed.get_column("series_id").null_count() == 0:
            return pl.DataFrame(schema=SERIES_SCHEMA)
        return (
            keyed.filter(pl.col("series_id").is_null())
            .group_by(_SERIES_KEY)
            .agg(pl.col("signal").first(), pl.col("source").first())
            .sort(_SERIES_KEY)
            .with_row_index("series_id", offset=self._written.max_series_id + 1)
            .select(SERIES_SCHEMA.names())
            .cast(SERIES_SCHEMA)
        )

    def _append(self, table: str, frame: pl.DataFrame, schema: pl.Schema) -> None:
        if frame.height == 0:
            return
        self._from_frame(
            f"INSERT INTO {table} ({_column_list(schema)}) "
            f"SELECT {_column_list(schema)} FROM incoming_frame",
            frame.select(schema.names()),
        )

    def _append_few(self, table: str, frame: pl.DataFrame, schema: pl.Schema) -> None:
        """`_append` for a frame of a few rows (a row a page): its columns go as list
        parameters, which costs DuckDB less than scanning an Arrow table."""
        if frame.height == 0:
            return
        self._con.execute(
            f"INSERT INTO {table} ({_column_list(schema)}) "
            f"SELECT {', '.join(['unnest(?)'] * len(schema))}",
            [frame.get_column(name).to_list() for name in schema.names()],
        )

    def _from_frame(self, sql: str, frame: pl.DataFrame) -> None:
        """Run `sql`, which reads `frame` as `incoming_frame`: DuckDB finds this local Arrow
        table by its name (a replacement scan), which spares the catalogue change, and its
        cost of about a millisecond a statement, that registering a view makes."""
        incoming_frame = frame.to_arrow()  # noqa: F841 (read by name in `sql`)
        self._con.execute(sql)

    def _open_blocks(self) -> set[datetime]:
        """Blocks awaiting compaction (start times)."""
        if self._written.open_blocks is None:
            rows = self._con.execute(
                "SELECT block_ts FROM point_blocks WHERE NOT compacted"
            ).fetchall()
            self._written.open_blocks = {row[0] for row in rows}
        return self._written.open_blocks

    def _mark_blocks(self, blocks: set[datetime]) -> None:
        """Flag blocks that received points as awaiting compaction."""
        if not blocks:
            return
        touched = pl.DataFrame({"block_ts": sorted(blocks)}, schema={"block_ts": pl.Datetime("us")})
        self._con.register("touched_blocks", touched.to_arrow())
        try:
            self._con.execute(
                "INSERT INTO point_blocks SELECT block_ts, false FROM touched_blocks "
                "ON CONFLICT (block_ts) DO UPDATE SET compacted = false"
            )
        finally:
            self._con.unregister("touched_blocks")

    def compact_points(self, *, before: datetime) -> CompactionReport:
        """Move every block of points that received writes and ends at or before `before` from
        `points_head` into `point_instants` and `point_rows` (see `_COMPACT_STATEMENTS`), as
        Prometheus compacts its head into blocks: a series' instants then form a +-1 run and
        its values a run DuckDB's codecs compress well. One transaction a block, so a crash
        leaves each block either as it was or compacted. Called by `write_scrapes` for blocks
        half a block behind the newest point; call it with a later `before` to compact the head
        too (e.g. before a backup)."""
        rows = self._con.execute(
            "SELECT block_ts FROM point_blocks WHERE NOT compacted AND block_ts + "
            f"{_POINT_BLOCK_SQL} <= ? ORDER BY block_ts",
            [before],
        ).fetchall()
        report = CompactionReport()
        for (block_ts,) in rows:
            report = report.plus(self._compact_block(block_ts))
        return report

    def _compact_block(self, block_ts: datetime) -> CompactionReport:
        bounds = [block_ts, block_ts + POINT_BLOCK]
        where = "ts >= CAST(? AS TIMESTAMP_MS) AND ts < CAST(? AS TIMESTAMP_MS)"
        self._con.execute("BEGIN TRANSACTION")
        try:
            self._con.execute(
                "CREATE OR REPLACE TEMP TABLE compacting AS "
                f"SELECT series_id, ts, value FROM points_head WHERE {where}",
                bounds,
            )
            # A block compacted before and reopened by late points: its compacted rows are
            # merged with the late ones and the block is written again.
            first, last = self._con.execute(
                f"SELECT min(instant), max(instant) FROM point_instants WHERE {where}", bounds
            ).fetchall()[0]
            if first is not None:
                self._con.execute(
                    "INSERT INTO compacting "
                    "SELECT p.series_id, i.ts, p.value FROM point_rows p "
                    "JOIN point_instants i USING (instant) WHERE p.instant BETWEEN ? AND ?",
                    [first, last],
                )
                self._con.execute(
                    "DELETE FROM point_rows WHERE instant BETWEEN ? AND ?", [first, last]
                )
                self._con.execute(
                    "DELETE FROM point_instants WHERE instant BETWEEN ? AND ?", [first, last]
                )
            moved = self._scalar("SELECT count(*) FROM compacting")
            self._con.execute(f"DELETE FROM points_head WHERE {where}", bounds)
            for statement in _COMPACT_STATEMENTS:
                self._con.execute(statement)
            self._con.execute(
                "UPDATE point_blocks SET compacted = true WHERE block_ts = ?", [block_ts]
            )
            self._con.execute("COMMIT")
            self._written.compacted(block_ts)
        except duckdb.Error as exc:
            self._con.execute("ROLLBACK")
            raise StoreError(
                f"compacting the points of {block_ts.isoformat()}Z (+{POINT_BLOCK}) in "
                f"{self.path} failed: {exc}"
            ) from exc
        return CompactionReport(blocks=1, points=moved)

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
        rows = self._con.execute(
            "SELECT CAST(min(ts) AS TIMESTAMP), CAST(max(ts) AS TIMESTAMP) FROM ("
            "SELECT ts FROM point_instants UNION ALL SELECT ts FROM points_head)"
        ).fetchall()
        first, last = rows[0]
        return None if first is None else (first, last)

    def drop_points_before(self, cutoff: datetime) -> int:
        """Retention: delete raw points older than `cutoff`; rollups are kept. Returns rows
        deleted."""
        before = self.count("points")
        older = "ts < CAST(? AS TIMESTAMP_MS)"
        at = [_ms_ceiling(cutoff)]
        self._con.execute("BEGIN TRANSACTION")
        try:
            self._con.execute(f"DELETE FROM points_head WHERE {older}", at)
            self._con.execute(
                "DELETE FROM point_rows WHERE instant IN "
                f"(SELECT instant FROM point_instants WHERE {older})",
                at,
            )
            self._con.execute(f"DELETE FROM point_instants WHERE {older}", at)
            self._con.execute(
                f"DELETE FROM point_blocks WHERE block_ts + {_POINT_BLOCK_SQL} <= ?", [cutoff]
            )
            self._con.execute("COMMIT")
            self._written.open_blocks = None  # read again when next needed
        except duckdb.Error as exc:
            self._con.execute("ROLLBACK")
            raise StoreError(
                f"dropping points before {cutoff} in {self.path} failed: {exc}"
            ) from exc
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
        # Stored times are whole milliseconds, so `ts >= t` is `ts >= t rounded up to a
        # millisecond`; comparing in the stored type lets DuckDB skip blocks by min/max.
        clauses, params = _window_clauses(
            "ts",
            None if from_ts is None else _ms_ceiling(from_ts),
            None if to_ts is None else _ms_ceiling(to_ts),
            cast="TIMESTAMP_MS",
        )
        # The window picks instants first; a compacted block's instants are one contiguous id
        # range, so bounding point_rows by the picked ids lets DuckDB skip other blocks' row
        # groups by their min/max.
        sql = f"""
            WITH picked AS (SELECT instant, ts FROM point_instants{clauses})
            SELECT p.series_id, CAST(i.ts AS TIMESTAMP) AS ts, p.value
            FROM point_rows p JOIN picked i USING (instant)
            WHERE p.instant BETWEEN (SELECT min(instant) FROM picked)
                                AND (SELECT max(instant) FROM picked)
            UNION ALL
            SELECT series_id, CAST(ts AS TIMESTAMP) AS ts, value FROM points_head{clauses}
            ORDER BY series_id, ts
        """
        return self._read(sql, params + params)

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

    def recompute_request_minutes(
        self, minutes: Sequence[datetime] | None, *, watermark_ts: datetime, fingerprint: str
    ) -> MinuteRollupSwap:
        """Recompute `request_minutes` (`pipeline.request_minutes.request_minutes`) for the
        requests that finished in `minutes` (all minutes when None) and swap them in with the
        new watermark (see `_swap_minute_rollup`)."""
        latency = ", ".join(
            f"quantile_cont({column}, [0.5, 0.95, 0.99]) AS {stem}_q"
            for column, stem in (("ttft_s", "ttft"), (_TPOT_SQL, "tpot"), ("e2e_s", "e2e"))
        )
        picked = ", ".join(
            f"{stem}_q[{i}] AS {stem}_p{p}_s"
            for stem in ("ttft", "tpot", "e2e")
            for i, p in enumerate((50, 95, 99), start=1)
        )
        with self._wanted_minutes(minutes) as (where, params):
            # Successful and failed requests (`ok` is never null) in two passes joined per
            # replica-minute: per-aggregate FILTERs on one pass cost more than the failed
            # requests' own small pass (~4 % of the full day's rollup).
            scoped = f"{where} AND" if where else " WHERE"
            sql = f"""
                WITH succeeded AS (
                    SELECT replica, date_trunc('minute', end_ts) AS minute_ts,
                           count(*) AS requests, sum(prompt_tokens) AS prompt_tokens,
                           sum(completion_tokens) AS completion_tokens, {latency}
                    FROM requests{scoped} ok
                    GROUP BY ALL
                ),
                failed AS (
                    SELECT replica, date_trunc('minute', end_ts) AS minute_ts,
                           count(*) AS requests
                    FROM requests{scoped} NOT ok
                    GROUP BY ALL
                )
                SELECT coalesce(s.replica, f.replica) AS replica,
                       coalesce(s.minute_ts, f.minute_ts) AS minute_ts,
                       coalesce(s.requests, 0) + coalesce(f.requests, 0) AS requests,
                       coalesce(f.requests, 0) AS failed_requests,
                       coalesce(s.prompt_tokens, 0)::BIGINT AS prompt_tokens,
                       coalesce(s.completion_tokens, 0)::BIGINT AS completion_tokens, {picked}
                FROM succeeded AS s FULL JOIN failed AS f
                    ON s.minute_ts = f.minute_ts AND s.replica IS NOT DISTINCT FROM f.replica
                ORDER BY minute_ts, replica NULLS LAST
            """
            return self._swap_minute_rollup(
                "request_minutes",
                minutes,
                select=(sql, [*params, *params]),
                requests=("sum(requests)", []),
                watermark_ts=watermark_ts,
                fingerprint=fingerprint,
            )

    def recompute_slo_minutes(
        self,
        minutes: Sequence[datetime] | None,
        *,
        criteria: Sequence[GoodEventLimits],
        watermark_ts: datetime,
        fingerprint: str,
    ) -> MinuteRollupSwap:
        """Recompute `slo_minutes` (`pipeline.request_minutes.slo_minutes`) for `criteria`, for
        the requests that finished in `minutes` (all minutes when None), in one pass for every
        criterion, and swap them in with the new watermark (see `_swap_minute_rollup`). Rows go
        in minute order (what the table's zone maps want)."""
        select: tuple[str, list[object]] | None = None
        with self._wanted_minutes(minutes) as (where, params):
            if criteria:
                goods: list[str] = []
                limit_params: list[object] = []
                for index, criterion in enumerate(criteria):
                    condition = "ok"
                    for column, limit in (
                        ("ttft_s", criterion.ttft_limit_s),
                        (f"coalesce({_TPOT_SQL}, 0)", criterion.tpot_limit_s),
                        ("e2e_s", criterion.e2e_limit_s),
                    ):
                        if limit is not None:
                            condition += f" AND {column} <= ?"
                            limit_params.append(float(limit))
                    goods.append(f"count(*) FILTER (WHERE {condition}) AS good_{index}")
                per_slo = " UNION ALL ".join(
                    f"SELECT minute_ts, ?::VARCHAR AS slo, replica, good_{index} AS good, total, "
                    "pool, model, tenant FROM grouped"
                    for index in range(len(criteria))
                )
                sql = f"""
                    WITH grouped AS (
                        SELECT date_trunc('minute', end_ts) AS minute_ts, replica, pool, model,
                               tenant, count(*) AS total, {", ".join(goods)}
                        FROM requests{where}
                        GROUP BY ALL
                    )
                    SELECT * FROM ({per_slo})
                    ORDER BY minute_ts
                """
                names = [criterion.name for criterion in criteria]
                select = (sql, [*limit_params, *params, *names])
            # Every criterion counts every request; the first one's totals are the requests.
            first = criteria[0].name if criteria else None
            return self._swap_minute_rollup(
                "slo_minutes",
                minutes,
                select=select,
                requests=("sum(total) FILTER (WHERE slo = ?)", [first]),
                watermark_ts=watermark_ts,
                fingerprint=fingerprint,
            )

    @contextmanager
    def _wanted_minutes(
        self, minutes: Sequence[datetime] | None
    ) -> Iterator[tuple[str, list[object]]]:
        """A WHERE clause selecting requests that finished in `minutes` (all when None). The
        range on end_ts lets DuckDB skip row groups by their min/max (requests are stored
        roughly in completion order), so recomputing a few minutes does not scan history.
        Registers `wanted_minutes` (one column, `m`) while open, for the swap's delete."""
        if minutes is None:
            yield "", []
            return
        if not minutes:
            yield " WHERE false", []
            return
        wanted = pl.DataFrame({"m": list(minutes)}, schema={"m": pl.Datetime("us")})
        self._con.register("wanted_minutes", wanted.to_arrow())
        try:
            where = (
                " WHERE end_ts >= ? AND end_ts < ? "
                "AND date_trunc('minute', end_ts) IN (SELECT m FROM wanted_minutes)"
            )
            yield (where, [min(minutes), max(minutes) + timedelta(minutes=1)])
        finally:
            self._con.unregister("wanted_minutes")

    def _swap_minute_rollup(
        self,
        table: str,
        minutes: Sequence[datetime] | None,
        *,
        select: tuple[str, list[object]] | None,
        requests: tuple[str, list[object]],
        watermark_ts: datetime,
        fingerprint: str,
    ) -> MinuteRollupSwap:
        """Replace a minute rollup's rows for `minutes` (all rows when None) by those `select`
        computes (none when None) and move its watermark, in one transaction, so a crash leaves
        either the old or the new state. `wanted_minutes` must be registered when `minutes` is
        given. The rows go from the query straight into the table: a day's worth of them never
        crosses into Python. `requests` is the aggregate over the new rows that counts the
        requests they hold."""
        schema = _ROLLUP_SCHEMAS.get(table)
        if schema is None:
            raise StoreError(f"not a minute rollup: {table!r}; allowed: {sorted(_ROLLUP_SCHEMAS)}")
        if minutes is None:
            scope, scope_params = "", []
        elif minutes:
            # The range lets DuckDB skip row groups of history by their min/max.
            scope = (
                " WHERE minute_ts BETWEEN ? AND ? AND minute_ts IN (SELECT m FROM wanted_minutes)"
            )
            scope_params = [min(minutes), max(minutes)]
        else:
            scope, scope_params = " WHERE false", []
        columns = _column_list(schema)
        self._con.execute("BEGIN TRANSACTION")
        try:
            self._con.execute(f"DELETE FROM {table}{scope}", scope_params)
            if select is not None:
                sql, params = select
                self._con.execute(
                    f"INSERT INTO {table} ({columns}) SELECT {columns} FROM ({sql})", params
                )
            requests_sql, requests_params = requests
            # An aggregate without GROUP BY: exactly one row.
            ((minutes_count, requests_count),) = self._con.execute(
                f"SELECT count(DISTINCT minute_ts), coalesce({requests_sql}, 0) "
                f"FROM {table}{scope}",
                [*requests_params, *scope_params],
            ).fetchall()
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
        return MinuteRollupSwap(minutes=int(minutes_count), requests=int(requests_count))

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

    def setting(self, name: str) -> str:
        """The current value of one of DuckDB's settings for this store, as DuckDB prints it
        (`threads` -> '2', `checkpoint_threshold` -> '61.0 MiB')."""
        rows = self._con.execute("SELECT current_setting(?)", [name]).fetchall()
        return str(rows[0][0])

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


# Ranges of end times a requests batch is checked against at most.
MAX_TIME_RANGES = 8
# How long after a span is stored a copy of it with other fields (another end time) is still
# recognised: longer than exporters retry (the Collector's exporters give up after 5 minutes).
RETRY_HORIZON = timedelta(minutes=15)


def time_ranges(times: pl.Series) -> list[tuple[datetime, datetime]]:
    """A batch's end (or arrival) times as at most `MAX_TIME_RANGES` inclusive ranges, split at
    the widest gaps between them: a few late spans (or a client whose clock is off) then add
    their own row groups to the deduplication check, not all the hours between them and the
    rest."""
    ends = times.unique().sort()
    cuts = ends.diff().arg_sort(descending=True, nulls_last=True).head(MAX_TIME_RANGES - 1)
    starts = [0, *sorted(int(c) for c in cuts if c > 0)]
    return [
        (ends[start], ends[stop - 1])
        for start, stop in zip(starts, [*starts[1:], ends.len()], strict=True)
    ]


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
    column: str, from_ts: datetime | None, to_ts: datetime | None, *, cast: str | None = None
) -> tuple[str, list[datetime]]:
    conditions: list[str] = []
    params: list[datetime] = []
    placeholder = f"CAST(? AS {cast})" if cast else "?"
    if from_ts is not None:
        conditions.append(f"{column} >= {placeholder}")
        params.append(from_ts)
    if to_ts is not None:
        conditions.append(f"{column} < {placeholder}")
        params.append(to_ts)
    return (" WHERE " + " AND ".join(conditions) if conditions else "", params)


def _ms_ceiling(ts: datetime) -> datetime:
    """`ts` rounded up to a whole millisecond: for stored millisecond times t,
    `t >= ts` and `t >= _ms_ceiling(ts)` agree (and so do `<`)."""
    extra_us = ts.microsecond % 1000
    return ts if extra_us == 0 else ts + timedelta(microseconds=1000 - extra_us)
