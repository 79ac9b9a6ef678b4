"""`servewatch ingest traces|metrics`, `replay` and `record`: telemetry into the store."""

from __future__ import annotations

import gzip
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from servewatch.cli.app import (
    EXIT_BAD_INPUT,
    CliState,
    JsonOption,
    app,
    fail,
    ingest_app,
    ingest_json,
    instant,
    load_config_or_fail,
    metric_json,
    open_store,
)
from servewatch.collectors.fixture.folder import FixtureError
from servewatch.collectors.fixture.replay import fixture_page_count, replay_fixture
from servewatch.collectors.metrics.drop_rules import DropRuleError, DropRules
from servewatch.collectors.metrics.exposition import page_text
from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.collectors.traces.ingest import IngestReport, ingest_trace_files, text_size
from servewatch.collectors.traces.request_spans import SpanMapping
from servewatch.recording import RecordingError, RecordingProgress, planned_rounds
from servewatch.recording import record as record_live
from servewatch.render import (
    counting_progress,
    err_console,
    labelled,
    out_console,
    print_json,
)
from servewatch.store import (
    Store,
    roll_up_request_minutes,
)


def run_trace_ingest(
    store: Store, files: list[Path], *, mapping: SpanMapping | None = None
) -> IngestReport:
    """Ingest with a progress bar on stderr (hidden when stderr is not a terminal)."""
    total = sum(text_size(f) for f in files)
    with Progress(
        TextColumn("ingest traces"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        task = progress.add_task("ingest", total=total)
        return ingest_trace_files(
            files, store=store, mapping=mapping, on_progress=lambda n: progress.advance(task, n)
        )


@ingest_app.command("traces")
def ingest_traces(
    ctx: typer.Context,
    files: Annotated[
        list[Path],
        typer.Argument(
            help="OTLP/JSON trace files: JSON lines (Collector file exporter) or one "
            "ExportTraceServiceRequest document; .gz is read transparently.",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
    config_path: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="servewatch.toml whose [otlp.mapping] says where replica, model, ... are found.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Ingest vLLM `llm_request` spans from OTLP/JSON files into the `requests` table.

    Spans are matched to the targets the store has scraped (docs/traces.md). Re-ingesting a
    file changes nothing. Malformed lines and spans are reported with file and line, recorded
    in `ingest_errors`, and the rest of the file is kept.
    """
    state = ctx.ensure_object(CliState)
    mapping = None if config_path is None else load_config_or_fail(config_path).otlp.mapping
    with open_store(state, create=True) as store:
        report = run_trace_ingest(store, files, mapping=mapping)
        roll_up_request_minutes(store)
    if as_json:
        print_json(ingest_json(report))
    else:
        out_console.print(
            f"{report.files} file(s), {report.spans} spans: {report.new_requests} new requests, "
            f"{report.duplicate_requests} already stored, "
            f"{report.other_spans} other spans skipped, {len(report.rejects)} rejected",
            highlight=False,
        )
    for reject in report.rejects:
        err_console.print(labelled("rejected", str(reject)))


KeepOption = Annotated[
    bool,
    typer.Option(
        "--keep-uncatalogued/--catalogued-only",
        help="Store families no catalogue knows under their own names (default), or only count "
        "them.",
    ),
]
DropOption = Annotated[
    list[str] | None,
    typer.Option(
        "--drop",
        metavar="PATTERN",
        help="Do not store families whose name matches (a regular expression, anchored, as "
        "Prometheus relabelling; repeatable). Adds to scrape.drop.",
    ),
]


def drop_rules(patterns: list[str] | None) -> DropRules:
    try:
        return DropRules.parse(patterns or [], where="--drop")
    except DropRuleError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc


@ingest_app.command("metrics")
def ingest_metrics(
    ctx: typer.Context,
    file: Annotated[
        Path,
        typer.Argument(
            help="One exposition page (Prometheus text 0.0.4 or OpenMetrics); .gz is read as is.",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
    target: Annotated[str, typer.Option(help="Name of the target the page came from.")],
    at: Annotated[str, typer.Option(help="When it was scraped (ISO 8601 or Unix s).")],
    kind: Annotated[
        TargetKind,
        typer.Option(help="What serves the page; auto: told from the page's family prefixes."),
    ] = TargetKind.AUTO,
    replica: Annotated[str | None, typer.Option(help="Replica the target speaks for.")] = None,
    host: Annotated[str | None, typer.Option(help="Host of the target.")] = None,
    zone: Annotated[str | None, typer.Option(help="Zone of the host.")] = None,
    keep_uncatalogued: KeepOption = True,
    drop: DropOption = None,
    as_json: JsonOption = False,
) -> None:
    """Store one exposition page as one scrape of TARGET at the given time.

    Malformed lines are reported with their line numbers and left out; every other sample of
    the page is stored. Storing the same scrape again changes nothing.
    """
    state = ctx.ensure_object(CliState)
    scrape_ts = instant(at, "--at")
    assert scrape_ts is not None
    raw = file.read_bytes()
    try:
        body = page_text(gzip.decompress(raw) if file.suffix == ".gz" else raw)
    except (OSError, EOFError) as exc:
        raise fail(f"{file}: cannot read the page: {exc}", code=EXIT_BAD_INPUT) from exc
    page_target = Target(
        target_id=target, kind=kind, url=f"file:{file}", replica=replica, host=host, zone=zone
    )
    with open_store(state, create=True) as store:
        report = ingest_pages(
            [Page(page_target, scrape_ts, body)],
            store=store,
            keep_uncatalogued=keep_uncatalogued,
            drop=drop_rules(drop),
        )
    if as_json:
        print_json(metric_json(report))
    else:
        out_console.print(
            f"{report.stored_samples} samples stored ({report.new_points} new points), "
            f"{report.unknown_samples} of them from uncatalogued families, "
            f"{report.dropped_samples} dropped by rule, "
            f"{len(report.line_errors)} malformed line(s)",
            highlight=False,
        )
    for reject in report.line_errors:
        err_console.print(labelled("malformed", str(reject)))


@app.command()
def replay(
    ctx: typer.Context,
    folder: Annotated[
        Path,
        typer.Argument(
            help="A fixture folder (manifest.json, pages/, spans) from the emulator or record.",
            exists=True,
            file_okay=False,
        ),
    ],
    keep_uncatalogued: KeepOption = True,
    drop: DropOption = None,
    as_json: JsonOption = False,
) -> None:
    """Replay a recorded fixture into the store: its spans and every page, scrape by scrape.

    Replaying the same folder twice leaves the same tables. A target without a page at a scrape
    time is recorded as a failed scrape, as a live scrape of a dead target would be.
    """
    state = ctx.ensure_object(CliState)
    try:
        total = fixture_page_count(folder)
    except FixtureError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    with (
        open_store(state, create=True) as store,
        counting_progress("replay pages") as progress,
    ):
        task = progress.add_task("replay", total=total)
        report = replay_fixture(
            folder,
            store=store,
            keep_uncatalogued=keep_uncatalogued,
            drop=drop_rules(drop),
            on_pages=lambda n: progress.advance(task, n),
        )
        roll_up_request_minutes(store)
    document = {
        "fixture": str(folder),
        "emulated": report.fixture.emulated,
        "traces": ingest_json(report.traces),
        "metrics": metric_json(report.metrics),
    }
    if as_json:
        print_json(document)
        return
    metrics = report.metrics
    out_console.print(
        f"{folder}{' (emulated)' if report.fixture.emulated else ''}: "
        f"{report.traces.new_requests} new requests from {report.traces.spans} spans; "
        f"{metrics.new_scrapes} new scrapes of {metrics.pages} pages, {metrics.new_points} new "
        f"points, {len(metrics.failed_scrapes)} failed scrapes, "
        f"{len(metrics.line_errors)} malformed lines",
        highlight=False,
    )


@app.command("record")
def record_command(
    config_path: Annotated[
        Path, typer.Option("--config", help="servewatch.toml: targets and the OTLP listener.")
    ] = Path("servewatch.toml"),
    out: Annotated[
        Path, typer.Option("--out", help="New (or empty) folder for the fixture.")
    ] = Path("recording"),
    minutes: Annotated[float, typer.Option(help="How long to record (fractions allowed).")] = 5.0,
    as_json: JsonOption = False,
) -> None:
    """Record live scrapes and received OTLP spans as a fixture folder for `servewatch replay`.

    Targets are scraped every scrape.interval_s and spans received on the configured OTLP
    address; nothing is written to the store (replay the folder for that). Ctrl-C or SIGTERM
    ends the recording early and still leaves a valid fixture.
    """
    config = load_config_or_fail(config_path)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    with Progress(
        TextColumn("record rounds"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        console=err_console,
        transient=True,
    ) as progress:
        total = planned_rounds(minutes=minutes, interval_s=config.scrape.interval_s)
        task = progress.add_task("record", total=total, detail="")

        def show(p: RecordingProgress) -> None:
            detail = f"{p.pages} pages, {p.failed_scrapes} failed, {p.spans} spans"
            progress.update(task, completed=p.rounds, detail=detail)

        try:
            manifest = record_live(config, out=out, minutes=minutes, stop=stop, on_progress=show)
        except (RecordingError, FixtureError) as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    summary = {
        "fixture": str(out),
        "time_range": manifest["time_range"],
        "rounds": manifest["pages"]["scrapes"],
        "pages": manifest["pages"]["count"],
        "failed_scrapes": manifest["pages"]["failed"],
        "spans": manifest["spans"]["count"],
        "targets": len(manifest["targets"]),
        "stopped_early": stop.is_set(),
    }
    if as_json:
        print_json(summary)
        return
    out_console.print(
        f"wrote {out}: {summary['rounds']} rounds of {summary['targets']} targets "
        f"({summary['pages']} pages, {summary['failed_scrapes']} failed), "
        f"{summary['spans']} spans; replay with `servewatch replay {out}`",
        highlight=False,
    )
