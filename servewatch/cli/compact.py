"""`servewatch compact` and `servewatch rollup`: a Collector's OTLP/JSON files into hourly
Parquet partitions of requests, and the minute rollups read from those partitions."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from servewatch.cli.app import (
    EXIT_BAD_INPUT,
    CliState,
    JsonOption,
    SloOption,
    app,
    fail,
    load_config_or_fail,
    open_store,
    store_failure,
)
from servewatch.cli.slo_files import slo_specs
from servewatch.collectors.traces.compact import CompactError, CompactReport, compact_traces
from servewatch.collectors.traces.span_identity import TargetDirectory
from servewatch.render import counting_progress, err_console, labelled, out_console, print_json
from servewatch.store import PartitionError, PartitionRollupReport, Store, StoreError, utc_now
from servewatch.store.partition_rollups import partition_files


@app.command()
def compact(
    source: Annotated[
        Path,
        typer.Argument(
            help="The Collector's output folder: OTLP/JSON lines (.json, .jsonl, optionally "
            ".gz) anywhere below it, e.g. in year=YYYY/month=MM/day=DD/hour=HH/ folders.",
            show_default=False,
        ),
    ],
    *,
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="The partitions folder: date=YYYY-MM-DD/hour=HH/requests.parquet."
        ),
    ],
    config_path: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="servewatch.toml: its [otlp.mapping] says where replica, model, ... are "
            "found, and its listed targets are what spans are matched to.",
        ),
    ] = None,
    store_path: Annotated[
        Path | None,
        typer.Option(
            "--store",
            help="A store whose scraped targets spans are matched to (opened read-only); "
            "without it or --config, a span's replica is what its resource names.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Compact OTLP/JSON trace files into hourly Parquet partitions of the `requests` table.

    One file per UTC hour of request completion, in Hive layout
    (date=YYYY-MM-DD/hour=HH/requests.parquet), zstd, the same columns as the store's
    `requests`, rows ordered by end time and replica. Each (trace_id, span_id) is stored once,
    also when it arrives twice or in a later input hour: late spans are merged into the hour
    they ended in by rewriting that partition. A manifest (_manifest.json in --out) records the
    input files compacted with their size and modification time, so a second run reads only
    new or changed files and an interrupted run is finished by the next. Malformed lines and
    spans are reported with file and line and skipped; the rest is kept.

    --json prints {files_found, files_read, spans, request_spans, other_spans, new_rows,
    partitions: [{partition, new_rows, rows, bytes, rewritten}], rejected, rejects}.
    """
    mapping = None
    targets: TargetDirectory | None = None
    if config_path is not None:
        config = load_config_or_fail(config_path)
        mapping = config.otlp.mapping
        if config.targets:
            targets = TargetDirectory.from_targets(config.targets)
    if store_path is not None:
        try:
            with Store.open(store_path, create=False, read_only=True) as store:
                targets = TargetDirectory.from_frame(store.read_targets().collect())
        except StoreError as exc:
            raise store_failure(exc) from exc
    with Progress(
        TextColumn("compact traces"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        task = progress.add_task("compact", total=None)
        try:
            report = compact_traces(
                source,
                out,
                now=utc_now(),
                mapping=mapping,
                targets=targets,
                on_files=lambda total: progress.update(task, total=total),
                on_progress=lambda n: progress.advance(task, n),
            )
        except CompactError as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
        except PartitionError as exc:
            raise fail(str(exc)) from exc
    if as_json:
        print_json(compact_json(report))
    else:
        rewritten = sum(p.rewritten for p in report.partitions)
        out_console.print(
            f"{report.files_read} of {report.files_found} file(s) read, {report.spans} spans: "
            f"{report.new_rows} new requests in {rewritten} partition(s), "
            f"{report.other_spans} other spans skipped, {len(report.rejects)} rejected",
            highlight=False,
        )
    for reject in report.rejects:
        err_console.print(labelled("rejected", str(reject)))


def compact_json(report: CompactReport) -> dict[str, Any]:
    return {
        "files_found": report.files_found,
        "files_read": report.files_read,
        "spans": report.spans,
        "request_spans": report.request_spans,
        "other_spans": report.other_spans,
        "new_rows": report.new_rows,
        "partitions": [asdict(p) for p in report.partitions],
        "rejected": len(report.rejects),
        "rejects": [asdict(r) for r in report.rejects],
    }


@app.command()
def rollup(
    ctx: typer.Context,
    *,
    partitions: Annotated[
        Path,
        typer.Option(
            "--partitions", help="A folder `servewatch compact` wrote (date=.../hour=...)."
        ),
    ],
    slo: SloOption = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="servewatch.toml ([slo] files, store path).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Roll up request_minutes and slo_minutes into the store from compacted partitions.

    Only partitions whose files changed since they were last rolled up are read (new hours,
    hours a late span rewrote, all of them after a change of SLOs); each hour's 60 minutes are
    recomputed from its partition and swapped in with its fingerprint (rollup_partitions).
    `servewatch slo status` then reads the minutes as usual, given the same SLOs. Creates the
    store when missing.

    --json prints {partitions_found, partitions_read, read: {rollup: [partition, ...]},
    removed, requests: {rollup: n}}.
    """
    state = ctx.ensure_object(CliState)
    specs = slo_specs(state, slo, config)
    criteria = [c for s in specs if (c := s.event_criterion()) is not None]
    try:
        total = len(partition_files(partitions))
    except PartitionError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    with (
        open_store(state, create=True) as store,
        counting_progress("roll up partitions") as progress,
    ):
        task = progress.add_task("rollup", total=total)
        try:
            report = store.roll_up_partitions(
                partitions, criteria=criteria, on_partition=lambda _: progress.advance(task)
            )
        except PartitionError as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    if as_json:
        print_json(rollup_json(report))
        return
    out_console.print(
        f"{report.partitions_read} of {report.partitions_found} partition(s) read, "
        f"{len(report.removed)} removed; {report.requests['request_minutes']} requests "
        "rolled up",
        highlight=False,
    )


def rollup_json(report: PartitionRollupReport) -> dict[str, Any]:
    return {
        "partitions_found": report.partitions_found,
        "partitions_read": report.partitions_read,
        "read": {rollup: list(p) for rollup, p in report.read.items()},
        "removed": list(report.removed),
        "requests": report.requests,
    }
