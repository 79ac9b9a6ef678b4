"""The DuckDB store: the one package that holds SQL connections and owns the schema.

`Store.open` brings a file up to the latest schema (`servewatch.store.migrations`); writes are
idempotent: re-writing a row that is already there changes nothing. The class is assembled from
one part per concept (points, requests, rollups, partition rollups, results, reads,
export), each in its own
module.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Self

import duckdb

from servewatch.store.connection import Clock, utc_now
from servewatch.store.errors import (
    DAMAGED_ADVICE,
    FILE_HEADER_BYTES,
    SchemaTooNewError,
    StoreBusyError,
    StoreDamagedError,
    StoreError,
    check_location,
    damage_error,
)
from servewatch.store.export import Exports
from servewatch.store.holder import read_holder
from servewatch.store.migrations import LATEST_VERSION, MIGRATIONS
from servewatch.store.partition_rollups import PartitionRollups
from servewatch.store.points import PointWrites
from servewatch.store.recorded import RecordedPoints
from servewatch.store.requests import RequestWrites
from servewatch.store.results import Results
from servewatch.store.status import StatusReads
from servewatch.store.window import WindowReads

IN_MEMORY = ":memory:"


CHECKPOINT_THRESHOLD = "64MB"


class Store(
    WindowReads,
    PartitionRollups,
    Results,
    RecordedPoints,
    RequestWrites,
    PointWrites,
    Exports,
    StatusReads,
):
    """An open store file. Use as a context manager, or call `close()`."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: str, clock: Clock) -> None:
        super().__init__(connection, path, clock)
        self.read_only = False

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        create: bool = True,
        read_only: bool = False,
        clock: Clock = utc_now,
    ) -> Self:
        """Open the store at `path` and migrate it to the latest schema. A missing store is
        created with its folders, unless `create` is false (StoreMissingError then); a path
        that cannot be a file raises StorePathError, a damaged file StoreDamagedError, a file
        another process holds StoreBusyError.

        `read_only` opens an existing store for reading only: nothing is migrated or written,
        and several readers may share the file (but not with a writer). A store whose schema
        is older than this servewatch's is refused then: a writing command migrates it."""
        location = str(path)
        if read_only and location == IN_MEMORY:
            raise StoreError("an in-memory store cannot be opened read-only: it starts empty")
        logged = False
        if location != IN_MEMORY:
            check_location(Path(location), create=create and not read_only)
            logged = Path(f"{location}.wal").exists()
        try:
            connection = duckdb.connect(location, read_only=read_only)
        except duckdb.Error as exc:
            if "lock" in str(exc).lower():
                raise _busy(location, exc) from exc
            damaged = damage_error(location, exc)
            if damaged is not None:
                raise damaged from exc
            raise StoreError(f"cannot open store {location}: {exc}") from exc
        store = cls(connection, location, clock)
        store.read_only = read_only
        try:
            if location != IN_MEMORY and not logged:
                store._check_length()
            store._use_allowed_cpus()
            if read_only:
                store._check_readable_version()
            else:
                # DuckDB checkpoints (moves the write-ahead log into the file) once the log
                # passes 16 MB by default: about every 40,000 stored spans or a few seconds of
                # scrapes, and each checkpoint rewrites the row groups the log touched. A larger
                # log is replayed at the next open after a crash (a second or so), and halves
                # that rework: 11 % more spans stored per second on a million spans. Closing
                # the store still checkpoints.
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

    def _check_readable_version(self) -> None:
        known = self._scalar(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'schema_version'"
        )
        current = self.schema_version if known else 0
        if current > LATEST_VERSION:
            raise SchemaTooNewError(
                f"store {self.path} has schema version {current}, but this servewatch knows "
                f"versions up to {LATEST_VERSION}: upgrade servewatch, or pass another --db"
            )
        if current < LATEST_VERSION:
            raise StoreError(
                f"store {self.path} has schema version {current} and this servewatch reads "
                f"version {LATEST_VERSION}; a writing command (`servewatch ingest`, `replay` "
                "or `run`) migrates it"
            )

    def _check_length(self) -> None:
        """Refuse a file shorter than the blocks in use its header counts (a copy or disk cut
        short): DuckDB opens it and fails only on the first query that reads a missing block.
        Blocks in use, not all blocks: DuckDB truncates free blocks at the end of the file, so
        a sound file may hold fewer blocks than its header's total. Not checked with a
        write-ahead log pending, whose replay may count blocks not yet written."""
        row = self._con.execute("PRAGMA database_size").fetchone()
        assert row is not None
        block_size, used_blocks = int(row[2]), int(row[4])
        expected = FILE_HEADER_BYTES + block_size * used_blocks
        length = Path(self.path).stat().st_size
        if length < expected:
            raise StoreDamagedError(
                f"store {self.path} is damaged: {length:,} bytes, but its header counts "
                f"{used_blocks} blocks in use ({expected:,} bytes; cut short?); {DAMAGED_ADVICE}"
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
        try:
            if not self.read_only:
                self._settle()  # seen times held back (`TargetWrites`)
        finally:
            self._con.close()

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


def _busy(location: str, exc: duckdb.Error) -> StoreBusyError:
    holder = None if location == IN_MEMORY else read_holder(location)
    if holder is None:
        return StoreBusyError(
            f"store {location} is in use by another process (one process writes a store, or "
            f"several read it; is a `servewatch run` using it?): {exc}",
            holder=None,
        )
    where = f", its API at {holder.api_url}" if holder.api_url else ""
    return StoreBusyError(
        f"store {location} is held by `{holder.command}` (PID {holder.pid}{where}): one "
        "process writes a store; stop it, or ask it",
        holder=holder,
    )
