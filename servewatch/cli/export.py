"""`servewatch export`: the store's tables written out as Parquet files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servewatch.cli.app import (
    EXIT_BAD_INPUT,
    CliState,
    FromOption,
    JsonOption,
    ToOption,
    app,
    fail,
    instant,
    open_store,
)
from servewatch.pipeline.instants import format_instant
from servewatch.render import err_console, print_json
from servewatch.store import EXPORT_TABLES, ExportedFile, ExportError, StoreError

_TABLES = ", ".join(table.name for table in EXPORT_TABLES)


@app.command()
def export(
    ctx: typer.Context,
    table: Annotated[
        str | None,
        typer.Argument(help=f"The table to write: {_TABLES}.", show_default=False),
    ] = None,
    *,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="The Parquet file to write; with --all, the folder (one TABLE.parquet each).",
        ),
    ],
    every: Annotated[
        bool, typer.Option("--all", help="Write every table, one file each, into --out.")
    ] = False,
    from_: FromOption = None,
    to: ToOption = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite files already there.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Write a table of the store (or every table, --all) to Parquet, zstd-compressed.

    Rows come in a fixed order (a key of each table), so a store exported twice gives the same
    files. --from/--to cut event tables on their time: points and scrapes on ts, requests on
    end_ts (completion), request_minutes and slo_minutes on minute_ts, alerts on changed_ts,
    recommendations on created_ts, ingest_errors on recorded_ts; the other tables (targets,
    series, schema_version, rollup_watermarks, rollup_partitions, unknown_families) are
    written whole. Points are written as the points view gives them (series_id, ts, value). An
    existing file is refused unless --force. The store is opened read-only; while `servewatch
    run` holds it, stop the service or export a copy of the file.

    --json prints {"files": [{table, path, rows, bytes}, ...]}.
    """
    state = ctx.ensure_object(CliState)
    if every == (table is not None):
        raise fail(
            "give one TABLE or --all" if every else f"give a TABLE ({_TABLES}) or --all",
            code=EXIT_BAD_INPUT,
        )
    from_ts, to_ts = instant(from_, "--from"), instant(to, "--to")
    if from_ts and to_ts and to_ts <= from_ts:
        raise fail(
            f"--to ({format_instant(to_ts)}) must be after --from ({format_instant(from_ts)})",
            code=EXIT_BAD_INPUT,
        )
    windowed = from_ts is not None or to_ts is not None

    def written(file: ExportedFile) -> None:
        err_console.print(_written(file, windowed=windowed))

    with open_store(state, read_only=True) as store:
        try:
            if table is None:
                files = store.export_all(
                    out, from_ts=from_ts, to_ts=to_ts, overwrite=force, written=written
                )
            else:
                files = [
                    store.export_table(table, out, from_ts=from_ts, to_ts=to_ts, overwrite=force)
                ]
                written(files[0])
        except ExportError as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
        except StoreError as exc:  # DuckDB could not write the file: not the input's fault
            raise fail(str(exc)) from exc
    if as_json:
        print_json({"files": [_file_json(file) for file in files]})


def _written(file: ExportedFile, *, windowed: bool) -> str:
    whole = " (no time column: written whole)" if windowed and file.time_column is None else ""
    rows = f"{file.rows:,} row{'' if file.rows == 1 else 's'}"
    return f"{file.table}: {rows}, {file.bytes:,} bytes -> {file.path}{whole}"


def _file_json(file: ExportedFile) -> dict[str, object]:
    return {"table": file.table, "path": str(file.path), "rows": file.rows, "bytes": file.bytes}
