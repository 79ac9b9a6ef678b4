"""Small SQL builders the store's modules share: column lists, identifiers, window clauses.

Table and column names come from the modules' own constants, never from input.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from servewatch.store.errors import StoreError


def column_list(schema: pl.Schema) -> str:
    return ", ".join(schema.names())


def check_schema(what: str, frame: pl.DataFrame, schema: pl.Schema) -> None:
    if frame.schema != schema:
        raise StoreError(
            f"frame for {what} has columns {dict(frame.schema)}, expected {dict(schema)}"
        )


def path_literal(path: Path) -> str:
    """A file path as a SQL string literal (COPY TO, read_parquet): quotes doubled."""
    return "'" + str(path).replace("'", "''") + "'"


def path_list(paths: Sequence[Path]) -> str:
    """Paths as a SQL list literal, for `read_parquet([...])`."""
    return "[" + ", ".join(path_literal(p) for p in paths) + "]"


def identifier(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise StoreError(f"not a table name: {name!r}")
    return name


def window_clauses(
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


def ms_ceiling(ts: datetime) -> datetime:
    """`ts` rounded up to a whole millisecond: for stored millisecond times t,
    `t >= ts` and `t >= ms_ceiling(ts)` agree (and so do `<`)."""
    extra_us = ts.microsecond % 1000
    return ts if extra_us == 0 else ts + timedelta(microseconds=1000 - extra_us)
