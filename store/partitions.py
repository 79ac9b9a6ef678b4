"""Compacted request partitions on disk: staged batches of request rows merged into hourly
Parquet files, each span once.

A compaction stages the rows it decoded (one Parquet file per batch and hour, in a staging
folder), then merges each hour's staged rows into that hour's partition file: the stored rows
first, then the staged ones in the order they were read, the first copy of each
(trace_id, span_id) kept, as `store.requests` keeps the first. The merged rows are written in
a total order (end time, replica, trace and span id) to a temporary name beside the partition
and renamed over it, so a reader or an interrupted run sees the old file or the new one, never
half of one. An hour whose staged rows are all stored already is not rewritten: its bytes and
modification time, and so the rollups' fingerprint of it, stay as they were.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb
import polars as pl

from servewatch.pipeline.partitions import HOUR, PARTITION_FILE, partition_hour, partition_of
from servewatch.pipeline.tables import REQUESTS_SCHEMA
from servewatch.store.errors import StoreError
from servewatch.store.sql import check_schema, column_list, path_list, path_literal

# Rows per Parquet row group: DuckDB's default, fixed so the same rows give the same bytes.
ROW_GROUP_ROWS = 122_880
# What the merge's DuckDB may hold in memory before it spills to the staging folder.
MERGE_MEMORY_LIMIT = "2GB"
_ORDER = "end_ts, replica NULLS LAST, trace_id, span_id"
# Staged batches are Parquet too, but not named so: a reader globbing `**/*.parquet` below the
# partitions folder must not count rows that are not merged yet.
STAGED_SUFFIX = ".staged"
_SEQUENCE = "_staged_seq"


class PartitionError(StoreError):
    """A partition cannot be read or written: a folder that is a file, a damaged file."""


@dataclass(frozen=True)
class PartitionWritten:
    """One partition after a merge: how many rows it gained and holds, and its file's size.
    `rewritten` is false when every staged row was there already (the file is untouched)."""

    partition: str
    new_rows: int
    rows: int
    bytes: int
    rewritten: bool


class PartitionWriter:
    """Stages request rows and merges them into the hourly partitions below `folder`."""

    def __init__(self, folder: Path, *, staging: Path, threads: int | None = None) -> None:
        self.folder = folder
        self.staging = staging
        self._batches = 0
        self._con = duckdb.connect(":memory:")
        self._con.execute(f"SET memory_limit = '{MERGE_MEMORY_LIMIT}'")
        self._con.execute(f"SET temp_directory = {path_literal(staging / 'spill')}")
        if threads is not None:
            self._con.execute(f"SET threads = {int(threads)}")

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> PartitionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def staged_partitions(self) -> list[str]:
        """The partitions rows were staged for, in time order."""
        if not self.staging.is_dir():
            return []
        found = [
            f"{date.name}/{hour.name}"
            for date in self.staging.glob("date=*")
            for hour in date.glob("hour=*")
            if any(hour.glob(f"*{STAGED_SUFFIX}"))
        ]
        return sorted(found, key=partition_hour)

    def stage(self, frame: pl.DataFrame) -> int:
        """Write a batch of request rows (REQUESTS_SCHEMA, in the order read) to the staging
        folder, one file per hour of their end times. Returns the rows staged."""
        check_schema("partitions", frame, REQUESTS_SCHEMA)
        if frame.height == 0:
            return 0
        batch = self._batches
        self._batches += 1
        # The order read, across batches: the merge keeps the first copy of a span.
        numbered = frame.with_columns(
            pl.int_range(pl.len(), dtype=pl.Int64).add(batch << 32).alias(_SEQUENCE),
            pl.col("end_ts").dt.truncate("1h").alias("_hour"),
        )
        for (hour,), rows in numbered.partition_by("_hour", as_dict=True).items():
            assert isinstance(hour, datetime)
            folder = self.staging / partition_of(hour)
            folder.mkdir(parents=True, exist_ok=True)
            rows.drop("_hour").write_parquet(
                folder / f"batch-{batch:06d}{STAGED_SUFFIX}", compression="lz4", statistics=False
            )
        return frame.height

    def merge(self) -> Iterator[PartitionWritten]:
        """Merge every staged hour into its partition (see the module text), hour by hour,
        then empty the staging folder. Yields each partition as it is done."""
        for partition in self.staged_partitions():
            yield self._merge_one(partition)
            shutil.rmtree(self.staging / partition)
        self._batches = 0

    def _merge_one(self, partition: str) -> PartitionWritten:
        staged = sorted((self.staging / partition).glob(f"*{STAGED_SUFFIX}"))
        target = self.folder / partition / PARTITION_FILE
        start = partition_hour(partition)
        columns = column_list(REQUESTS_SCHEMA)
        incoming = (
            f"SELECT {columns}, 1 AS _rank, {_SEQUENCE} AS _seq FROM read_parquet("
            f"{path_list(staged)}) WHERE end_ts >= ? AND end_ts < ?"
        )
        params: list[object] = [start, start + HOUR]
        try:
            if target.exists():
                stored = f"read_parquet({path_literal(target)})"
                ((new_rows,),) = self._con.execute(
                    f"SELECT count(DISTINCT (i.trace_id, i.span_id)) FROM ({incoming}) i "
                    f"ANTI JOIN {stored} s USING (trace_id, span_id)",
                    params,
                ).fetchall()
                if new_rows == 0:
                    ((rows,),) = self._con.execute(f"SELECT count(*) FROM {stored}").fetchall()
                    return PartitionWritten(
                        partition, 0, int(rows), target.stat().st_size, rewritten=False
                    )
                union = (
                    f"SELECT {columns}, 0 AS _rank, 0 AS _seq FROM {stored} UNION ALL {incoming}"
                )
            else:
                union = incoming
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
            sql = (
                f"SELECT {columns} FROM ({union}) QUALIFY row_number() OVER "
                f"(PARTITION BY trace_id, span_id ORDER BY _rank, _seq) = 1 ORDER BY {_ORDER}"
            )
            try:
                ((rows,),) = self._con.execute(
                    f"COPY ({sql}) TO {path_literal(partial)} (FORMAT parquet, COMPRESSION zstd, "
                    f"ROW_GROUP_SIZE {ROW_GROUP_ROWS})",
                    params,
                ).fetchall()
                before = 0
                if target.exists():
                    ((before,),) = self._con.execute(
                        f"SELECT count(*) FROM read_parquet({path_literal(target)})"
                    ).fetchall()
                partial.replace(target)
            finally:
                partial.unlink(missing_ok=True)
        except duckdb.Error as exc:
            raise PartitionError(f"merging into partition {target} failed: {exc}") from exc
        except OSError as exc:
            raise PartitionError(f"cannot write partition {target}: {exc.strerror or exc}") from exc
        return PartitionWritten(
            partition,
            int(rows) - int(before),
            int(rows),
            target.stat().st_size,
            rewritten=True,
        )
