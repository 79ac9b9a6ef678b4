"""Parquet export: which tables leave the store as files, cut how, in which order, and the COPY
that writes them.

A table is exported as its readers see it: `points` through the read path of the `points` view
(series, time, value), never the blocks it is stored in (`points_head`, `point_instants`,
`point_rows`, `point_blocks`). Rows are ordered by a key that is unique in the table, so the
same store exported twice gives the same rows in the same order (and, with the same DuckDB, the
same bytes).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb

from servewatch.store.connection import StoreBase
from servewatch.store.errors import StoreError, damage_error
from servewatch.store.reads import points_query
from servewatch.store.sql import path_literal, window_clauses


class ExportError(StoreError):
    """The export cannot be written as asked: an unknown table, a file that is already there,
    or an --out that cannot be the file or folder asked for. Bad input, not a broken store."""


@dataclass(frozen=True)
class ExportTable:
    """One exportable table: the columns that order its rows (a key of the table, so the order
    is total) and the time column a window cuts it on, None for a table of state rather than
    events (exported whole whatever the window)."""

    name: str
    order: tuple[str, ...]
    time_column: str | None = None


# docs/schema.md's order. Event tables are cut on the time their row happened at (a request on
# its completion, as every window of the store selects requests); the rest describe the store or
# the fleet as it is and are exported whole.
EXPORT_TABLES: tuple[ExportTable, ...] = (
    ExportTable("schema_version", ("version",)),
    ExportTable("targets", ("target_id",)),
    ExportTable("scrapes", ("target_id", "ts"), "ts"),
    ExportTable("series", ("series_id",)),
    ExportTable("points", ("series_id", "ts"), "ts"),
    ExportTable("requests", ("end_ts", "trace_id", "span_id"), "end_ts"),
    ExportTable("ingest_errors", ("source", "location"), "recorded_ts"),
    ExportTable("request_minutes", ("minute_ts", "replica"), "minute_ts"),
    ExportTable(
        "slo_minutes",
        ("slo", "minute_ts", "replica", "pool", "model", "tenant", "adapter"),
        "minute_ts",
    ),
    ExportTable("rollup_watermarks", ("source",)),
    ExportTable("rollup_partitions", ("rollup", "partition")),
    ExportTable("unknown_families", ("target_id", "family")),
    ExportTable("alerts", ("changed_ts", "slo", "long_window_s", "short_window_s"), "changed_ts"),
    ExportTable("recommendations", ("created_ts", "name"), "created_ts"),
    ExportTable("recorded_points", ("source", "record", "labels", "ts"), "ts"),
)


# How points are stored: a storage matter (docs/schema.md), exported as `points`.
POINT_STORAGE_TABLES = ("points_head", "point_instants", "point_rows", "point_blocks")


_BY_NAME = {table.name: table for table in EXPORT_TABLES}


@dataclass(frozen=True)
class ExportedFile:
    """One table written: where, how many rows and bytes, and the column the window cut it on
    (None when the table was written whole)."""

    table: str
    path: Path
    rows: int
    bytes: int
    time_column: str | None


def export_table(name: str) -> ExportTable:
    """The exportable table `name`; an unknown name is an ExportError naming the allowed."""
    table = _BY_NAME.get(name)
    if table is not None:
        return table
    allowed = ", ".join(_BY_NAME)
    hint = (
        f"; {name} is part of how points are stored: export points"
        if name in POINT_STORAGE_TABLES
        else ""
    )
    raise ExportError(f"unknown table {name!r}: the tables are {allowed}{hint}")


class Exports(StoreBase):
    """Writes tables to Parquet files with DuckDB's COPY (zstd)."""

    def export_table(
        self,
        table: str,
        path: Path,
        *,
        from_ts: datetime | None = None,
        to_ts: datetime | None = None,
        overwrite: bool = False,
    ) -> ExportedFile:
        """Write `table`'s rows in [from_ts, to_ts) of its time column (naive UTC; the whole
        table when it has none) to the Parquet file `path`, in the table's order. An existing
        file is refused unless `overwrite`; a missing folder is made."""
        spec = export_table(table)
        _check_target(path, overwrite=overwrite)
        return self._write(spec, path, from_ts=from_ts, to_ts=to_ts)

    def export_all(
        self,
        folder: Path,
        *,
        from_ts: datetime | None = None,
        to_ts: datetime | None = None,
        overwrite: bool = False,
        written: Callable[[ExportedFile], None] | None = None,
    ) -> list[ExportedFile]:
        """Every exportable table to `folder`/<table>.parquet, as `export_table` writes one,
        calling `written` after each file. Every file is checked before the first is written,
        so a refusal writes nothing."""
        if folder.exists() and not folder.is_dir():
            raise ExportError(f"--out {folder}: is a file; --all writes a folder of files")
        paths = {spec.name: folder / f"{spec.name}.parquet" for spec in EXPORT_TABLES}
        if not overwrite:
            there = [path.name for path in paths.values() if path.exists()]
            if there:
                raise ExportError(
                    f"--out {folder}: already holds {', '.join(there)}; pass --force to "
                    "overwrite, or choose another folder"
                )
        for path in paths.values():
            _check_target(path, overwrite=True)
        files: list[ExportedFile] = []
        for spec in EXPORT_TABLES:
            files.append(self._write(spec, paths[spec.name], from_ts=from_ts, to_ts=to_ts))
            if written is not None:
                written(files[-1])
        return files

    def _write(
        self,
        spec: ExportTable,
        path: Path,
        *,
        from_ts: datetime | None,
        to_ts: datetime | None,
    ) -> ExportedFile:
        self._settle()
        sql, params = _select(spec, from_ts, to_ts)
        _make_folder(path.parent)
        # Written beside the target and renamed over it: a failed or interrupted COPY leaves
        # no half file under the name asked for, and --force replaces the old file whole.
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            target = path_literal(partial.resolve())
            rows = self._con.execute(
                f"COPY ({sql}) TO {target} (FORMAT parquet, COMPRESSION zstd)", params
            ).fetchall()
            partial.replace(path)
        except duckdb.Error as exc:
            damaged = damage_error(self.path, exc)
            if damaged is not None:
                raise damaged from exc
            raise StoreError(f"export of {spec.name} to {path} failed: {exc}") from exc
        except OSError as exc:
            raise ExportError(f"--out {path}: cannot write: {exc.strerror or exc}") from exc
        finally:
            partial.unlink(missing_ok=True)  # gone once renamed; left by a failure otherwise
        self.reads[spec.name] += 1
        return ExportedFile(
            table=spec.name,
            path=path,
            rows=int(rows[0][0]),
            bytes=path.stat().st_size,
            time_column=spec.time_column,
        )


def _select(
    spec: ExportTable, from_ts: datetime | None, to_ts: datetime | None
) -> tuple[str, list[datetime]]:
    """The query of `spec`'s rows in the window, in its order."""
    if spec.name == "points":
        return points_query(from_ts, to_ts)
    clauses, params = (
        ("", []) if spec.time_column is None else window_clauses(spec.time_column, from_ts, to_ts)
    )
    return f"SELECT * FROM {spec.name}{clauses} ORDER BY {', '.join(spec.order)}", params


def _check_target(path: Path, *, overwrite: bool) -> None:
    if path.is_dir():
        raise ExportError(f"--out {path}: is a folder; give the Parquet file's path")
    if path.exists() and not overwrite:
        raise ExportError(f"--out {path}: already exists; pass --force to overwrite it")


def _make_folder(folder: Path) -> None:
    for above in (folder, *folder.parents):
        if above.exists():
            if not above.is_dir():
                raise ExportError(f"--out: {above} is a file, not a folder")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"--out: cannot create {folder}: {exc.strerror or exc}") from exc
