"""The `servewatch` command line: a thin layer of argument parsing over the library.

Exit codes: 0 ok, 1 failure, 2 usage or bad input. Reporting commands take `--json` and then
print exactly one JSON document on stdout; progress and messages go to stderr.
"""

from __future__ import annotations

import gzip
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import polars as pl
import typer
from rich.markdown import Markdown
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from typer.core import TyperGroup

from servewatch import __version__
from servewatch.capacity.decision_record import drill_section_json
from servewatch.capacity.drill import DrillSpec
from servewatch.capacity.parallel import process_map
from servewatch.capacity.placement import FailureUnit
from servewatch.capacity.requirement import RequirementError, load_requirement
from servewatch.capacity.worksheet import size as size_worksheet
from servewatch.capacity.worksheet import size_from_file
from servewatch.collectors.exposition import page_text
from servewatch.collectors.fixture_folder import FixtureError
from servewatch.collectors.metric_ingest import MetricIngestReport, Page, ingest_pages
from servewatch.collectors.prometheus_api import PrometheusApiError
from servewatch.collectors.prometheus_reader import ImportWindow, Resolution
from servewatch.collectors.replay import fixture_page_count, replay_fixture
from servewatch.collectors.service_api import ServiceApiError, fetch_window
from servewatch.collectors.targets import Target, TargetKind
from servewatch.collectors.trace_ingest import IngestReport, ingest_trace_files, text_size
from servewatch.config import Config, ConfigError, load_config
from servewatch.dashboards.export import write_report
from servewatch.demo import DemoError, run_demo
from servewatch.drill_service import (
    DrillSetupError,
    StepSettings,
    StoreDrills,
    config_drill,
    config_warm_pool,
    store_drill,
)
from servewatch.emulation import record_emulated_fleet, serve_emulated_fleet
from servewatch.emulator.clients import RetryPolicy
from servewatch.emulator.fleet_config import FleetConfig, FleetConfigError, load_fleet_config
from servewatch.emulator.native import describe as emulator_implementation
from servewatch.emulator.workload import SpecError as EmulatorSpecError
from servewatch.health.rollout_comparison import VersionLabelError
from servewatch.health_service import (
    DEFAULT_VERSION_LABEL,
    finding_json,
    health_findings,
    health_window,
)
from servewatch.pipeline.instants import format_instant, parse_duration, parse_instant
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.sli_report import Grouping, SliSource, build_sli_report, points_window
from servewatch.pipeline.tables import RECOMMENDATIONS_SCHEMA
from servewatch.pipeline.window import Window, WindowQuery
from servewatch.prometheus_import import import_from_prometheus, import_json, import_summary
from servewatch.recommend_service import recommend_from_store
from servewatch.recording import RecordingError, RecordingProgress, planned_rounds
from servewatch.recording import record as record_live
from servewatch.render import (
    alerts_table,
    change_json,
    demo_summary,
    err_console,
    health_table,
    labelled,
    out_console,
    print_json,
    sli_histogram_tables,
    sli_series_table,
    sli_table,
    slo_status_table,
)
from servewatch.report_service import window_report
from servewatch.scraping import resolve_targets, scrape_round, scrape_until
from servewatch.service import Service
from servewatch.slo.alert_state import changes_from_frame
from servewatch.slo.alertmanager import AlertmanagerNotifier
from servewatch.slo.fields import SpecError
from servewatch.slo.prometheus_rules import prometheus_rules
from servewatch.slo.spec import SloSpec
from servewatch.slo_service import SloSetupError, evaluate, load_specs, status_at
from servewatch.store import (
    SchemaTooNewError,
    Store,
    StoreBusyError,
    StoreError,
    StoreMissingError,
    StorePathError,
    damage_error,
    roll_up_request_minutes,
    utc_now,
)

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
DEFAULT_DB = Path("servewatch.duckdb")


class _Commands(TyperGroup):
    """Lists each command with the whole first sentence of its help: click's own listing cuts
    it to fit the terminal and ends it with "...", which loses text."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [
            (name, command.get_short_help_str(limit=sys.maxsize))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    name="servewatch",
    cls=_Commands,
    help="Observability, SLOs and capacity for fleets of vLLM replicas.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help and usage errors: wrapped at word boundaries, never cropped to the terminal,
    # and `[slo]` in a help text stays text instead of being read as rich markup.
    rich_markup_mode=None,
)
ingest_app = typer.Typer(
    help="Read recorded telemetry files into the store.",
    cls=_Commands,
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(ingest_app, name="ingest")
slo_app = typer.Typer(
    help="SLOs: status, error budgets, burn rates and Prometheus rules.",
    cls=_Commands,
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(slo_app, name="slo")


class State:
    db: Path = DEFAULT_DB


state = State()

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
FromOption = Annotated[
    str | None, typer.Option("--from", help="Start (ISO 8601 or Unix s), inclusive.")
]
ToOption = Annotated[str | None, typer.Option("--to", help="End (ISO 8601 or Unix s), exclusive.")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"servewatch {__version__}")
        raise typer.Exit


@app.callback()
def main_options(
    db: Annotated[
        Path,
        typer.Option(
            "--db",
            help="DuckDB store file. Commands that store data (ingest, replay, scrape, run) "
            "create it when missing; the others refuse a missing one.",
            envvar="SERVEWATCH_DB",
        ),
    ] = DEFAULT_DB,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Observability, SLOs and capacity for fleets of vLLM replicas."""
    state.db = db


def fail(message: str, *, code: int = EXIT_FAILURE) -> typer.Exit:
    err_console.print(labelled("error:", message, style="bold red"))
    return typer.Exit(code)


def _store_failure(exc: StoreError) -> typer.Exit:
    """A store that cannot be opened: bad input when the path or version is wrong."""
    if isinstance(exc, StoreMissingError):
        message = f"{exc}; `servewatch ingest` or `servewatch run` creates one"
        return fail(message, code=EXIT_BAD_INPUT)
    if isinstance(exc, SchemaTooNewError | StorePathError):
        return fail(str(exc), code=EXIT_BAD_INPUT)
    return fail(str(exc))


@contextmanager
def open_store(*, create: bool = False, read_only: bool = False) -> Iterator[Store]:
    """The store at --db for one command. Only commands that store data create a missing one;
    reading commands open it `read_only` and write nothing; damage DuckDB finds while the
    command runs is one line and exit 1, as at open."""
    try:
        store = Store.open(state.db, create=create, read_only=read_only)
    except StoreError as exc:
        raise _store_failure(exc) from exc
    with _damage_is_one_line(store):
        yield store


@contextmanager
def _damage_is_one_line(store: Store) -> Iterator[None]:
    with store:
        try:
            yield
        except Exception as exc:
            damaged = damage_error(store.path, exc)
            if damaged is None:
                raise
            raise fail(str(damaged)) from exc


def read_window(query: WindowQuery) -> Window:
    """The window of the store at --db, opened read-only; while a `servewatch run` holds the
    store, the same window read by it, through its local API."""
    try:
        store = Store.open(state.db, create=False, read_only=True)
    except StoreBusyError as exc:
        holder = exc.holder
        if holder is None or holder.api_url is None:
            raise _store_failure(exc) from exc
        err_console.print(
            labelled(
                "note:",
                f"{state.db} is held by `{holder.command}` (PID {holder.pid}): reading it "
                f"through {holder.api_url}",
            )
        )
        try:
            return fetch_window(holder.api_url, query)
        except ServiceApiError as api_exc:
            raise fail(f"{exc}; asked instead, {api_exc}") from api_exc
    except StoreError as exc:
        raise _store_failure(exc) from exc
    with _damage_is_one_line(store):
        return store.read_query(query)


def _instant(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_instant(value)
    except ValueError as exc:
        raise fail(f"{option}: {exc}", code=EXIT_BAD_INPUT) from exc


def _ingest_json(report: IngestReport) -> dict[str, Any]:
    return {
        "files": report.files,
        "spans": report.spans,
        "request_spans": report.request_spans,
        "other_spans": report.other_spans,
        "new_requests": report.new_requests,
        "duplicate_requests": report.duplicate_requests,
        "rejected": len(report.rejects),
        "rejects": [asdict(r) for r in report.rejects],
    }


def run_trace_ingest(store: Store, files: list[Path]) -> IngestReport:
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
            files, store=store, on_progress=lambda n: progress.advance(task, n)
        )


@ingest_app.command("traces")
def ingest_traces(
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
    as_json: JsonOption = False,
) -> None:
    """Ingest vLLM `llm_request` spans from OTLP/JSON files into the `requests` table.

    Re-ingesting a file changes nothing. Malformed lines and spans are reported with file and
    line, recorded in `ingest_errors`, and the rest of the file is kept.
    """
    with open_store(create=True) as store:
        report = run_trace_ingest(store, files)
        roll_up_request_minutes(store)
    if as_json:
        print_json(_ingest_json(report))
    else:
        out_console.print(
            f"{report.files} file(s), {report.spans} spans: {report.new_requests} new requests, "
            f"{report.duplicate_requests} already stored, "
            f"{report.other_spans} other spans skipped, {len(report.rejects)} rejected",
            highlight=False,
        )
    for reject in report.rejects:
        err_console.print(labelled("rejected", str(reject)))


def _limit_s(value_ms: float | None, option: str) -> float | None:
    if value_ms is None:
        return None
    if not value_ms > 0:
        raise fail(f"{option} must be a positive number of milliseconds, got {value_ms}", code=2)
    return value_ms / 1000.0


def _metric_json(report: MetricIngestReport) -> dict[str, Any]:
    return {
        "pages": report.pages,
        "new_scrapes": report.new_scrapes,
        "new_points": report.new_points,
        "stored_samples": report.stored_samples,
        "unknown_samples": report.unknown_samples,
        "malformed_lines": [asdict(r) for r in report.line_errors],
        "failed_scrapes": [asdict(r) for r in report.failed_scrapes],
    }


@ingest_app.command("metrics")
def ingest_metrics(
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
    kind: Annotated[TargetKind, typer.Option(help="What serves the page.")] = TargetKind.VLLM,
    replica: Annotated[str | None, typer.Option(help="Replica the target speaks for.")] = None,
    host: Annotated[str | None, typer.Option(help="Host of the target.")] = None,
    zone: Annotated[str | None, typer.Option(help="Zone of the host.")] = None,
    keep_uncatalogued: Annotated[
        bool, typer.Option(help="Store families no catalogue knows too (default: count them).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Store one exposition page as one scrape of TARGET at the given time.

    Malformed lines are reported with their line numbers and left out; every other sample of
    the page is stored. Storing the same scrape again changes nothing.
    """
    scrape_ts = _instant(at, "--at")
    assert scrape_ts is not None
    raw = file.read_bytes()
    try:
        body = page_text(gzip.decompress(raw) if file.suffix == ".gz" else raw)
    except (OSError, EOFError) as exc:
        raise fail(f"{file}: cannot read the page: {exc}", code=EXIT_BAD_INPUT) from exc
    page_target = Target(
        target_id=target, kind=kind, url=f"file:{file}", replica=replica, host=host, zone=zone
    )
    with open_store(create=True) as store:
        report = ingest_pages(
            [Page(page_target, scrape_ts, body)], store=store, keep_uncatalogued=keep_uncatalogued
        )
    if as_json:
        print_json(_metric_json(report))
    else:
        out_console.print(
            f"{report.stored_samples} samples stored ({report.new_points} new points), "
            f"{report.unknown_samples} from uncatalogued families counted, "
            f"{len(report.line_errors)} malformed line(s)",
            highlight=False,
        )
    for reject in report.line_errors:
        err_console.print(labelled("malformed", str(reject)))


@app.command()
def replay(
    folder: Annotated[
        Path,
        typer.Argument(
            help="A fixture folder (manifest.json, pages/, spans) from the emulator or record.",
            exists=True,
            file_okay=False,
        ),
    ],
    keep_uncatalogued: Annotated[
        bool, typer.Option(help="Store families no catalogue knows too (default: count them).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Replay a recorded fixture into the store: its spans and every page, scrape by scrape.

    Replaying the same folder twice leaves the same tables. A target without a page at a scrape
    time is recorded as a failed scrape, as a live scrape of a dead target would be.
    """
    try:
        total = fixture_page_count(folder)
    except FixtureError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    with (
        open_store(create=True) as store,
        Progress(
            TextColumn("replay pages"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
        ) as progress,
    ):
        task = progress.add_task("replay", total=total)
        report = replay_fixture(
            folder,
            store=store,
            keep_uncatalogued=keep_uncatalogued,
            on_pages=lambda n: progress.advance(task, n),
        )
        roll_up_request_minutes(store)
    document = {
        "fixture": str(folder),
        "emulated": report.fixture.emulated,
        "traces": _ingest_json(report.traces),
        "metrics": _metric_json(report.metrics),
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
    config = _load_config(config_path)
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


def _write_file(path: Path, text: str, *, what: str) -> None:
    """Write an --out file; a folder or an unwritable path is a usage error."""
    if path.is_dir():
        raise fail(f"--out {path}: is a folder; give {what}'s path", code=EXIT_BAD_INPUT)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise fail(
            f"--out {path}: cannot write: {exc.strerror or exc}", code=EXIT_BAD_INPUT
        ) from exc


def _load_config(path: Path) -> Config:
    try:
        return load_config(path)
    except ConfigError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc


def _scrape_from_prometheus(
    url: str,
    *,
    config_path: Path,
    from_: str | None,
    to: str | None,
    step: str | None,
    raw: bool,
    keep_uncatalogued: bool,
    as_json: bool,
) -> None:
    # The config is optional here: it only lends the store path, step and keep option.
    config = _load_config(config_path) if config_path.exists() else None
    if config is not None and config.store_path != DEFAULT_DB and state.db == DEFAULT_DB:
        state.db = config.store_path
    from_ts, to_ts = _instant(from_, "--from"), _instant(to, "--to")
    if from_ts is None or to_ts is None:
        raise fail("--from-prometheus needs --from and --to", code=EXIT_BAD_INPUT)
    try:
        step_s = (
            parse_duration(step).total_seconds()
            if step is not None
            else (config.scrape.interval_s if config is not None else 15.0)
        )
        window = ImportWindow(
            start=from_ts,
            end=to_ts,
            step_s=step_s,
            resolution=Resolution.RAW if raw else Resolution.STEP,
        )
    except ValueError as exc:
        raise fail(f"--from/--to/--step: {exc}", code=EXIT_BAD_INPUT) from exc
    keep = keep_uncatalogued or (config is not None and config.scrape.keep_uncatalogued)
    with open_store(create=True) as store:
        try:
            report = import_from_prometheus(url, store=store, window=window, keep_uncatalogued=keep)
        except PrometheusApiError as exc:
            raise fail(f"{exc} (chunks imported before this are kept; rerun to resume)") from exc
    if as_json:
        print_json(import_json(report, window=window))
        return
    out_console.print(import_summary(report), highlight=False)
    for problem in report.problems:
        err_console.print(labelled("problem", str(problem)))


@app.command()
def scrape(
    config_path: Annotated[
        Path, typer.Option("--config", help="servewatch.toml with the targets to scrape.")
    ] = Path("servewatch.toml"),
    once: Annotated[bool, typer.Option(help="Scrape every target once and exit.")] = False,
    from_prometheus: Annotated[
        str | None,
        typer.Option(
            "--from-prometheus",
            metavar="URL",
            help="Instead of scraping, import --from..--to from this Prometheus (Thanos, "
            "Mimir) HTTP API root, e.g. http://prometheus:9090 (docs/prometheus-import.md).",
        ),
    ] = None,
    from_: FromOption = None,
    to: ToOption = None,
    step: Annotated[
        str | None,
        typer.Option(
            "--step",
            help="With --from-prometheus: step between imported instants (15s, 1m); default "
            "scrape.interval_s of --config, else 15s. With --raw it sizes the chunks only.",
        ),
    ] = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="With --from-prometheus: import the samples as Prometheus stored them, at "
            "their scrape times, instead of values at step instants.",
        ),
    ] = False,
    keep_uncatalogued: Annotated[
        bool,
        typer.Option(
            "--keep-uncatalogued",
            help="With --from-prometheus: import every other family of the same jobs too "
            "(as scrape.keep_uncatalogued does for scrapes).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Scrape every target's /metrics concurrently into the store, or import from Prometheus.

    Each target has its own timeout: a slow or dead one is recorded as a failed scrape and
    delays no other; --once exits 1 when no target answered. Without --once, each target is
    scraped on its own schedule (its interval, at a stable offset within it) until Ctrl-C or
    SIGTERM, and pages are stored in batches as they come (`servewatch run` does this together
    with the other jobs).

    With --from-prometheus URL --from T --to T, the catalogued families a Prometheus already
    holds for the range are read through its HTTP API into the same tables instead;
    importing a range twice changes nothing.
    """
    if from_prometheus is not None:
        _scrape_from_prometheus(
            from_prometheus,
            config_path=config_path,
            from_=from_,
            to=to,
            step=step,
            raw=raw,
            keep_uncatalogued=keep_uncatalogued,
            as_json=as_json,
        )
        return
    if from_ or to or step or raw or keep_uncatalogued:
        raise fail(
            "--from, --to, --step, --raw and --keep-uncatalogued need --from-prometheus URL; "
            "live scrapes use the config's settings",
            code=EXIT_BAD_INPUT,
        )
    config = _load_config(config_path)
    if config.store_path != DEFAULT_DB and state.db == DEFAULT_DB:
        state.db = config.store_path
    targets, problems = resolve_targets(config)
    for problem in problems:
        err_console.print(labelled("targets:", problem))
    if not targets:
        raise fail(f"{config_path}: no targets to scrape", code=EXIT_BAD_INPUT)
    rounds: list[MetricIngestReport] = []

    def show(report: MetricIngestReport) -> None:
        rounds.append(report)
        if as_json:
            return
        out_console.print(
            f"stored {report.pages} pages: {report.stored_samples} samples, "
            f"{len(report.failed_scrapes)} failed, {len(report.line_errors)} malformed lines",
            highlight=False,
        )
        for failed in report.failed_scrapes:
            err_console.print(labelled("failed", str(failed)))

    with open_store(create=True) as store:
        if once:
            show(scrape_round(targets, store=store, settings=config.scrape))
        else:
            stop = threading.Event()
            previous = {
                s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)
            }
            try:
                scrape_until(
                    config,
                    store=store,
                    stop=stop,
                    on_report=show,
                    on_problem=lambda p: err_console.print(labelled("targets:", p)),
                )
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)
    if as_json:
        print_json({"rounds": [_metric_json(r) for r in rounds]})
    if once and len(rounds[0].failed_scrapes) == rounds[0].pages:
        raise fail(f"no target answered: all {rounds[0].pages} scrapes failed")


@app.command()
def sli(
    from_: FromOption = None,
    to: ToOption = None,
    ttft_ms: Annotated[
        float | None, typer.Option("--ttft-ms", help="Goodput limit on TTFT (inclusive), ms.")
    ] = None,
    tpot_ms: Annotated[
        float | None, typer.Option("--tpot-ms", help="Goodput limit on TPOT (inclusive), ms.")
    ] = None,
    e2e_ms: Annotated[
        float | None, typer.Option("--e2e-ms", help="Goodput limit on e2e latency (inclusive), ms.")
    ] = None,
    by: Annotated[
        Grouping, typer.Option("--by", help="Group rows by replica, pool, model, or fleet only.")
    ] = Grouping.REPLICA,
    window: Annotated[
        str | None,
        typer.Option("--window", help="Also report consecutive windows of this length (5m, 1h)."),
    ] = None,
    source: Annotated[
        SliSource,
        typer.Option(
            "--source",
            help="traces (request spans), histograms (scraped vLLM and DCGM series) or both.",
        ),
    ] = SliSource.BOTH,
    as_json: JsonOption = False,
) -> None:
    """SLIs from traces and from scraped histograms, per replica, pool, model or fleet.

    Traces: TTFT, TPOT, e2e percentiles, attainment and goodput of requests selected by
    completion time; goodput counts requests that succeeded and met every given limit, per
    second of the window (not computed without limits). Histograms: TTFT, ITL, TPOT and e2e
    quantiles as PromQL's histogram_quantile over the window, KV-cache usage, prefix-cache hit
    rate, running and waiting requests, preemptions, token throughput, finish reasons and GPU
    utilisation and power, shown when scraped series exist in the window.
    """
    from_ts, to_ts = _instant(from_, "--from"), _instant(to, "--to")
    if from_ts and to_ts and to_ts <= from_ts:
        raise fail(
            f"--to ({format_instant(to_ts)}) must be after --from ({format_instant(from_ts)})",
            code=EXIT_BAD_INPUT,
        )
    limits = GoodputLimits(
        ttft_s=_limit_s(ttft_ms, "--ttft-ms"),
        tpot_s=_limit_s(tpot_ms, "--tpot-ms"),
        e2e_s=_limit_s(e2e_ms, "--e2e-ms"),
    )
    step = None
    if window is not None:
        try:
            step = parse_duration(window)
        except ValueError as exc:
            raise fail(f"--window: {exc}", code=EXIT_BAD_INPUT) from exc
    window_read = read_window(WindowQuery(from_ts, to_ts, **points_window(step)))
    report = build_sli_report(window_read, limits=limits, by=by, step=step, source=source)
    if as_json:
        print_json(report)
    else:
        if source.traces:
            out_console.print(sli_table(report))
            if step is not None:
                out_console.print(sli_series_table(report))
        if "histograms" in report:
            for table in sli_histogram_tables(report):
                out_console.print(table)
    if source.histograms and "histograms" not in report:
        err_console.print(
            f"no scraped series in {state.db} for this window: scrape or replay first"
        )
    if source.traces and report["overall"]["requests"] == 0:
        err_console.print(f"no requests in {state.db} for this window: ingest traces first")


@app.command()
def size(
    demand_req_per_min: Annotated[
        float | None, typer.Option(help="Peak demand the fleet must carry, requests/min.")
    ] = None,
    capacity_req_per_min: Annotated[
        float | None, typer.Option(help="One replica's capacity at the SLO, requests/min.")
    ] = None,
    failure_unit: Annotated[
        str, typer.Option(help="What the fleet must survive losing: replica, host or zone.")
    ] = "host",
    replicas_per_host: Annotated[int, typer.Option(help="Replicas placed on each host.")] = 1,
    zones: Annotated[int, typer.Option(help="Zones the hosts are spread over.")] = 1,
    headroom: Annotated[float, typer.Option(help="Headroom on top of demand, e.g. 0.2.")] = 0.0,
    gpus_per_replica: Annotated[int, typer.Option(help="GPUs one replica uses.")] = 1,
    usd_per_gpu_hour: Annotated[float | None, typer.Option(help="Price of a GPU-hour.")] = None,
    hours_per_month: Annotated[float | None, typer.Option(help="Hours billed a month.")] = None,
    recovery_interval_s: Annotated[
        float | None, typer.Option(help="Time after a failure when no replacement counts.")
    ] = None,
    backlog_requests: Annotated[
        float | None, typer.Option(help="Requests queued when the failure hits.")
    ] = None,
    replacement_startup_s: Annotated[
        float | None, typer.Option(help="Cold start of a replacement replica, seconds.")
    ] = None,
    startup_dependency: Annotated[
        list[str] | None,
        typer.Option(help="A service a replacement needs to start (repeatable)."),
    ] = None,
    hosts: Annotated[
        list[int] | None, typer.Option(help="Candidate host counts to tabulate (repeatable).")
    ] = None,
    requirement: Annotated[
        Path | None,
        typer.Option(help="A requirement TOML file instead of the options (docs/capacity.md)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Fleet size from stated assumptions: the sizing chain, failure table, cost and risk.

    Arithmetic only, no data: the same decision record `recommend` writes from measurements.
    Reproduces the seeds' worked examples, e.g. `--demand-req-per-min 120
    --capacity-req-per-min 40 --replicas-per-host 2 --failure-unit host`.
    """
    now = datetime.now(UTC)
    try:
        if requirement is not None:
            record = size_from_file(requirement, now=now)
        else:
            if demand_req_per_min is None or capacity_req_per_min is None:
                raise fail(
                    "give --demand-req-per-min and --capacity-req-per-min, or --requirement FILE",
                    code=EXIT_BAD_INPUT,
                )
            record = size_worksheet(
                now=now,
                demand_req_per_min=demand_req_per_min,
                capacity_req_per_min=capacity_req_per_min,
                failure_unit=failure_unit,
                replicas_per_host=replicas_per_host,
                zones=zones,
                headroom_ratio=headroom,
                gpus_per_replica=gpus_per_replica,
                usd_per_gpu_hour=usd_per_gpu_hour,
                hours_per_month=hours_per_month,
                recovery_interval_s=recovery_interval_s,
                backlog_requests=backlog_requests,
                replacement_startup_s=replacement_startup_s,
                startup_dependencies=startup_dependency or (),
                hosts=hosts or (),
            )
    except RequirementError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    if as_json:
        print_json(record.to_json())
    else:
        out_console.print(Markdown(record.to_markdown()))


SloOption = Annotated[
    list[Path] | None,
    typer.Option("--slo", help="SLO spec file (servewatch, Sloth or OpenSLO); repeatable."),
]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="servewatch.toml ([slo] files, store path).")
]


def _slo_specs(slo_files: list[Path] | None, config_path: Path | None) -> tuple[SloSpec, ...]:
    paths = list(slo_files or [])
    if not paths and config_path is not None:
        config = _load_config(config_path)
        paths = list(config.slo.files)
        if state.db == DEFAULT_DB:
            state.db = config.store_path
    try:
        specs, notes = load_specs(paths)
    except (SloSetupError, SpecError) as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    for note in notes:
        err_console.print(labelled("note:", note))
    return specs


@slo_app.command("status")
def slo_status_command(
    slo: SloOption = None,
    config: ConfigOption = None,
    at: Annotated[str | None, typer.Option(help="Evaluate at this time (default: now).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Budget remaining and consumed, burn rate per alert window, time to exhaustion and alert
    state of every SLO, exact from per-minute good and total counts."""
    specs = _slo_specs(slo, config)
    moment = _instant(at, "--at") or utc_now()
    with open_store(read_only=True) as store:
        statuses = status_at(store, specs=specs, at=moment)
    if as_json:
        print_json({"at": format_instant(moment), "slos": [s.to_json() for s in statuses]})
        return
    out_console.print(slo_status_table(statuses, at=moment))


@slo_app.command("rules")
def slo_rules_command(
    slo: SloOption = None,
    config: ConfigOption = None,
    out: Annotated[Path, typer.Option(help="Where to write the Prometheus rule file.")] = Path(
        "rules.yml"
    ),
    as_json: JsonOption = False,
) -> None:
    """Write Prometheus recording and alerting rules equivalent to servewatch's evaluation
    (error ratios per window from vLLM's histograms and counters; promtool-valid)."""
    specs = _slo_specs(slo, config)
    rules = prometheus_rules(specs)
    _write_file(out, rules.to_yaml(), what="the rule file")
    if as_json:
        print_json({"out": str(out), "skipped": list(rules.skipped)})
        return
    out_console.print(f"wrote {out}", highlight=False)
    for reason in rules.skipped:
        err_console.print(labelled("not expressible in PromQL:", reason))


@slo_app.command("evaluate")
def slo_evaluate_command(
    slo: SloOption = None,
    config: ConfigOption = None,
    at: Annotated[str | None, typer.Option(help="Evaluate at this time (default: now).")] = None,
    alertmanager: Annotated[
        str | None, typer.Option(help="Alertmanager base URL to notify (v2 API).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """One alert evaluation (what `servewatch run` does every minute): state changes are
    recorded in the store and sent to Alertmanager when a URL is given."""
    specs = _slo_specs(slo, config)
    moment = _instant(at, "--at") or utc_now()
    url = alertmanager
    if url is None and config is not None:
        url = _load_config(config).slo.alertmanager_url
    with open_store() as store, httpx.Client(timeout=10) as client:
        notifier = AlertmanagerNotifier(client, url=url) if url else None
        evaluation = evaluate(store, specs=specs, at=moment, notifier=notifier)
    document = {
        "at": format_instant(evaluation.at),
        "changes": [change_json(c) for c in evaluation.changes],
        "firing": [change_json(c) for c in evaluation.firing],
        "notification_error": evaluation.notification_error,
    }
    if as_json:
        print_json(document)
    else:
        out_console.print(
            f"{len(evaluation.changes)} state change(s), {len(evaluation.firing)} firing",
            highlight=False,
        )
    if evaluation.notification_error:
        err_console.print(
            labelled("notification failed:", evaluation.notification_error, style="red")
        )


@app.command()
def alerts(as_json: JsonOption = False) -> None:
    """The alert state history recorded by SLO evaluations (pending, firing, resolved)."""
    with open_store(read_only=True) as store:
        changes = changes_from_frame(store.read_alert_changes().collect())
    if as_json:
        print_json({"alerts": [change_json(c) for c in changes]})
        return
    out_console.print(alerts_table(changes))


VersionLabelOption = Annotated[
    str,
    typer.Option(
        "--version-label",
        help="What tells rollout versions apart: model (the served model name), or a target "
        "or series label such as pool or image.",
    ),
]


@app.command()
def health(
    from_: FromOption = None,
    to: ToOption = None,
    version_label: VersionLabelOption = DEFAULT_VERSION_LABEL,
    zone_loss: Annotated[
        bool,
        typer.Option(help="Whether losing a zone is in scope (flags pools in a single zone)."),
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Which failure mode the data shows, where, since when and how sure: slow replicas, KV
    pool pressure, affinity loss, traffic steps, regressing rollouts and shared failure domains
    (host loss, replicas without host or zone, all capacity in one zone).

    The window defaults to everything stored; an empty end (null in JSON) means ongoing.
    """
    from_ts, to_ts = _instant(from_, "--from"), _instant(to, "--to")
    if from_ts and to_ts and to_ts <= from_ts:
        raise fail(
            f"--to ({format_instant(to_ts)}) must be after --from ({format_instant(from_ts)})",
            code=EXIT_BAD_INPUT,
        )
    stored = read_window(WindowQuery(from_ts, to_ts))
    try:
        window = health_window(stored)
        findings = health_findings(
            stored, version_label=version_label, zone_loss_in_scope=zone_loss
        )
    except ValueError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    if as_json:
        print_json(
            {
                "from": format_instant(window[0]) if window else None,
                "to": format_instant(window[1]) if window else None,
                "version_label": version_label,
                "findings": [finding_json(f) for f in findings],
            }
        )
    else:
        out_console.print(health_table(findings, start=window[0] if window else None))
    if window is None:
        err_console.print(f"nothing stored in {state.db} to examine: scrape or replay first")


@app.command()
def recommend(
    requirement: Annotated[
        Path,
        typer.Option(
            help="Requirement TOML: SLO (TTFT/TPOT limits and target ratio, or a latency "
            "limit), demand, failure unit, costs."
        ),
    ],
    from_: FromOption = None,
    to: ToOption = None,
    out: Annotated[
        Path | None, typer.Option(help="Also write the decision record as Markdown here.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The fleet size for the requirement, from what the fleet did: per-replica capacity refit
    from the store per pool (SLO attainment against load, with its bootstrap interval; marked
    extrapolated when the knee lies beyond the load seen), the failure table for where replicas
    actually sit, the cost of the reserve, and the riskiest assumption with a plan to measure
    it."""
    try:
        spec = load_requirement(requirement)
    except RequirementError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    from_ts, to_ts = _instant(from_, "--from"), _instant(to, "--to")
    with open_store() as store:
        roll_up_request_minutes(store)
        try:
            with process_map() as mapper:
                record, measured = recommend_from_store(
                    store, requirement=spec, from_ts=from_ts, to_ts=to_ts, mapper=mapper
                )
        except RequirementError as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
        document = record.to_json()
        store.write_recommendation(
            pl.DataFrame(
                [(utc_now(), spec.name, record.verdict(), json.dumps(document))],
                schema=RECOMMENDATIONS_SCHEMA,
                orient="row",
            )
        )
    for note in measured.notes:
        err_console.print(labelled("note:", note))
    markdown = record.to_markdown()
    if out is not None:
        _write_file(out, markdown, what="the decision record")
    if as_json:
        print_json(document)
    else:
        out_console.print(Markdown(markdown))


@app.command()
def drill(
    requirement: Annotated[
        Path | None,
        typer.Option(
            help="Requirement TOML: drill what `recommend` sizes from the store, with the "
            "engine fitted from its traced requests."
        ),
    ] = None,
    fleet: Annotated[
        Path | None,
        typer.Option(
            help="Fleet TOML (docs/fleet.example.toml) instead: drill that emulated fleet "
            "(needs --req-per-min or uses its workload's rate)."
        ),
    ] = None,
    hosts: Annotated[
        int | None,
        typer.Option(help="With --requirement: also drill this many hosts.", min=1),
    ] = None,
    req_per_min: Annotated[
        float | None, typer.Option(help="With --fleet: the demand, requests per minute.")
    ] = None,
    failure: Annotated[
        FailureUnit, typer.Option(help="With --fleet: the unit lost (the worst one).")
    ] = FailureUnit.HOST,
    recovery_s: Annotated[
        float, typer.Option(help="With --fleet: seconds with no replacement counted.")
    ] = 180.0,
    startup_s: Annotated[
        float | None,
        typer.Option(help="With --fleet: replacement start-up, s (default: the cold start)."),
    ] = None,
    retries: Annotated[
        int, typer.Option(help="With --fleet: client retries per request.", min=0)
    ] = 0,
    backoff_s: Annotated[float, typer.Option(help="With --fleet: first retry backoff, s.")] = 1.0,
    admission_req_per_min: Annotated[
        float | None,
        typer.Option(help="With --fleet: the gateway sheds above this rate (retry-after 1 s)."),
    ] = None,
    backlog: Annotated[
        int, typer.Option(help="With --fleet: requests queued at the failure.", min=0)
    ] = 0,
    startup_blocked: Annotated[
        bool,
        typer.Option(help="With --fleet: a startup dependency is out, no replacement starts."),
    ] = False,
    traffic_step: Annotated[
        str | None,
        typer.Option(
            help="With --fleet: also drill a traffic step, demand times this (2x), and size "
            "the warm pool that keeps the SLO until autoscaled replicas serve."
        ),
    ] = None,
    over: Annotated[str, typer.Option(help="With --traffic-step: the ramp's length.")] = "5m",
    autoscaler_lag_s: Annotated[
        float, typer.Option(help="With --traffic-step: until the autoscaler starts replicas.")
    ] = 60.0,
    replica_req_per_min: Annotated[
        float | None,
        typer.Option(
            help="With --traffic-step: what the autoscaler counts a replica for (default: "
            "the fleet's capacity at its SLO, searched)."
        ),
    ] = None,
    steady_s: Annotated[
        float, typer.Option(help="With --fleet: seconds of steady state before the failure.")
    ] = 300.0,
    after_s: Annotated[
        float, typer.Option(help="With --fleet: seconds judged once replacements serve.")
    ] = 300.0,
    seed: Annotated[int, typer.Option(help="Seed of the simulation.")] = 1,
    from_: FromOption = None,
    to: ToOption = None,
    as_json: JsonOption = False,
) -> None:
    """Drill a fleet through its named failure in simulation: steady state, the worst replica,
    host or zone lost with no replacement for the recovery interval, replacements cold-starting,
    recovered; clients retrying, the gateway shedding. Per phase: SLO attainment, p95 TTFT and
    TPOT, ready replicas, routing skew, retries, queue depth and age, useful completions
    against demand; the verdict says whether the fleet holds and where it first fails."""
    if (requirement is None) == (fleet is None):
        raise fail("give one of --requirement (with the store) or --fleet", code=EXIT_BAD_INPUT)
    if fleet is not None:
        try:
            config = load_fleet_config(fleet)
        except (FleetConfigError, OSError) as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
        demand_rps = config.workload.arrival.rate_rps if req_per_min is None else req_per_min / 60
        try:
            spec = DrillSpec(
                demand_rps=demand_rps,
                failure_unit=failure,
                ttft_limit_s=config.slo.ttft_s,
                tpot_limit_s=config.slo.tpot_s,
                target_ratio=config.slo.target_ratio,
                recovery_interval_s=recovery_s,
                replacement_startup_s=config.engine.cold_start_s
                if startup_s is None
                else startup_s,
                steady_s=steady_s,
                after_s=after_s,
                retries=RetryPolicy(max_retries=retries, backoff_s=backoff_s),
                admission_rps=None if admission_req_per_min is None else admission_req_per_min / 60,
                replacement_blocked=startup_blocked,
                backlog_requests=backlog,
                seed=seed,
            )
        except (ValueError, EmulatorSpecError) as exc:
            raise fail(f"drill: {exc}", code=EXIT_BAD_INPUT) from exc
        step = (
            None
            if traffic_step is None
            else _step_settings(traffic_step, over, autoscaler_lag_s, replica_req_per_min)
        )
        with err_console.status(f"drilling {config.topology.hosts} hosts, {failure.value} lost"):
            result = config_drill(config, spec)
            pool = None if step is None else config_warm_pool(config, spec, step)
        if as_json:
            print_json(
                {
                    "drill": result.to_json(),
                    "traffic_step": None if pool is None else pool.to_json(),
                }
            )
        else:
            lines = result.markdown_lines("Drill")
            if pool is not None:
                lines += ["", f"Traffic step: {pool.summary()}."]
            out_console.print(Markdown("\n".join(lines)))
        return
    assert requirement is not None
    try:
        spec_requirement = load_requirement(requirement)
    except RequirementError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    from_ts, to_ts = _instant(from_, "--from"), _instant(to, "--to")
    with open_store(read_only=True) as store, err_console.status("fitting the engine and drilling"):
        try:
            found = store_drill(
                store, requirement=spec_requirement, hosts=hosts, from_ts=from_ts, to_ts=to_ts
            )
        except (RequirementError, DrillSetupError) as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    for note in found.notes:
        err_console.print(labelled("note:", note))
    _print_store_drills(found, as_json=as_json)


def _step_settings(
    ratio_text: str, over: str, lag_s: float, replica_req_per_min: float | None
) -> StepSettings:
    try:
        ratio = float(ratio_text.strip().removesuffix("x"))
    except ValueError as exc:
        raise fail(
            f"--traffic-step {ratio_text!r}: give the demand's multiple, such as 2x",
            code=EXIT_BAD_INPUT,
        ) from exc
    if not ratio >= 1.0 or not lag_s >= 0:
        raise fail(
            f"--traffic-step must be at least 1x (got {ratio_text!r}) and --autoscaler-lag-s "
            f">= 0 (got {lag_s:g})",
            code=EXIT_BAD_INPUT,
        )
    try:
        over_s = parse_duration(over).total_seconds()
    except ValueError as exc:
        raise fail(f"--over: {exc}", code=EXIT_BAD_INPUT) from exc
    return StepSettings(
        ratio=ratio,
        over_s=over_s,
        lag_s=lag_s,
        replica_rps=None if replica_req_per_min is None else replica_req_per_min / 60,
    )


def _print_store_drills(found: StoreDrills, *, as_json: bool) -> None:
    drills = found.drills
    if as_json:
        print_json(
            {
                "verdict": found.verdict,
                "drills": drill_section_json(drills),
                "stated": None if found.stated is None else found.stated.drill.to_json(),
            }
        )
        return
    lines = [found.verdict]
    if drills is not None:
        lines += drills.markdown_lines()
    if found.stated is not None:
        lines += ["", *found.stated.drill.markdown_lines(f"{found.stated.row.hosts} hosts")]
    out_console.print(Markdown("\n".join(lines)))


@app.command()
def report(
    out: Annotated[Path, typer.Option(help="Folder for report.html and charts/.")] = Path("report"),
    from_: FromOption = None,
    to: ToOption = None,
    ttft_ms: Annotated[float | None, typer.Option("--ttft-ms", help="TTFT limit, ms.")] = None,
    tpot_ms: Annotated[float | None, typer.Option("--tpot-ms", help="TPOT limit, ms.")] = None,
    images: Annotated[bool, typer.Option(help="Also write a PNG and an SVG per chart.")] = True,
    version_label: VersionLabelOption = DEFAULT_VERSION_LABEL,
    as_json: JsonOption = False,
) -> None:
    """Write an offline report: report.html (scripts inlined, nothing fetched) with every chart
    the store's data supports and the fleet-health findings, plus a PNG, an SVG and the
    Vega-Lite JSON per chart."""
    from_ts, to_ts = _instant(from_, "--from"), _instant(to, "--to")
    limits = GoodputLimits(
        ttft_s=_limit_s(ttft_ms, "--ttft-ms"), tpot_s=_limit_s(tpot_ms, "--tpot-ms")
    )
    if out.exists() and not out.is_dir():
        raise fail(
            f"--out {out}: is a file; the report is a folder (report.html and charts/)",
            code=EXIT_BAD_INPUT,
        )
    stored = read_window(WindowQuery(from_ts, to_ts))
    try:
        built = window_report(stored, limits=limits, version_label=version_label)
    except VersionLabelError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    with err_console.status("rendering charts"):
        files = write_report(built, out, images=images)
    document = {"html": str(files.html), "html_bytes": files.html_bytes, "out": str(out)}
    if as_json:
        print_json(document)
    else:
        out_console.print(f"wrote {files.html} ({files.html_bytes:,} bytes)", highlight=False)


@app.command()
def run(
    config_path: Annotated[
        Path, typer.Option("--config", help="servewatch.toml: targets, OTLP listener, SLOs.")
    ] = Path("servewatch.toml"),
    health_port: Annotated[
        int, typer.Option(help="Port on 127.0.0.1 for the service's /metrics and /healthz.")
    ] = 9464,
) -> None:
    """Run the service: scrape, receive OTLP, roll up, evaluate SLOs and alert, on schedule.

    SIGTERM or Ctrl-C finishes the running jobs, writes what is pending and exits 0. A config
    file that turns invalid while running is reported and the last good one stays in use. A
    target failing scrape.failing_after scrapes in a row is warned about on stderr; /healthz
    says degraded while some targets fail and answers 503 while all do.
    """
    try:
        service = Service(config_path, store_path=None if state.db == DEFAULT_DB else state.db)
    except (ConfigError, SloSetupError, SpecError) as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    except StoreError as exc:
        raise _store_failure(exc) from exc
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    err_console.print(
        f"servewatch run: store {service.store.path}, OTLP {service.receiver.endpoint}, "
        f"health http://127.0.0.1:{health_port}/healthz"
    )
    try:
        service.run_until(stop, health_port=health_port)
    except OSError as exc:
        raise fail(f"cannot start: {exc}") from exc


@app.command()
def emulate(
    config_path: Annotated[
        Path | None,
        typer.Option(
            "--config", help="Fleet TOML (docs/fleet.example.toml); default fleet if absent."
        ),
    ] = None,
    record: Annotated[
        Path | None, typer.Option(help="Write a fixture folder here instead of serving live.")
    ] = None,
    hours: Annotated[float, typer.Option(help="Length of a recording (with --record).")] = 1.0,
    scrape_interval_s: Annotated[
        float, typer.Option(help="Seconds between recorded pages (with --record).")
    ] = 60.0,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(help="Live: send spans here (e.g. http://127.0.0.1:4318/v1/traces)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the simulation.")] = 1,
    as_json: JsonOption = False,
) -> None:
    """An emulated vLLM fleet speaking the real wire formats; everything it emits says it is
    emulated. Live (default): each replica serves /metrics and each host a DCGM page on
    127.0.0.1 until interrupted, spans go to --otlp-endpoint. With --record DIR: the same
    simulation in virtual time, written as a fixture folder for `servewatch replay`."""
    try:
        fleet = load_fleet_config(config_path) if config_path else FleetConfig.default()
    except (FleetConfigError, OSError) as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    if record is not None:
        if not hours > 0:
            raise fail(f"--hours must be positive, got {hours}", code=EXIT_BAD_INPUT)
        start_s = float(int(time.time() // 3600 * 3600) - int(hours * 3600))
        err_console.print(emulator_implementation())
        with err_console.status(f"recording {hours:g} h of the emulated fleet"):
            manifest = record_emulated_fleet(
                fleet,
                folder=record,
                start_s=start_s,
                hours=hours,
                scrape_interval_s=scrape_interval_s,
                seed=seed,
            )
        summary = {
            "fixture": str(record),
            "requests": manifest["spans"]["count"],
            "pages": manifest["pages"]["count"],
            "ground_truth": manifest["ground_truth"],
        }
        if as_json:
            print_json(summary)
        else:
            out_console.print(
                f"wrote {record}: {summary['requests']:,} requests, {summary['pages']:,} pages "
                f"(emulated); replay with `servewatch replay {record}`",
                highlight=False,
            )
        return
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    serve_emulated_fleet(
        fleet,
        seed=seed,
        otlp_endpoint=otlp_endpoint,
        stop=stop,
        announce=lambda targets: (
            print_json({"targets": targets})
            if as_json
            else out_console.print(
                "\n".join(f"{t['kind']:5} {t['url']}  {t['labels']}" for t in targets),
                highlight=False,
            )
        ),
    )


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Folder for everything the demo writes.")] = Path(
        "demo-out"
    ),
    hours: Annotated[float, typer.Option(help="Length of the emulated recording.")] = 24.0,
    rate: Annotated[float, typer.Option(help="Mean requests/s of the emulated traffic.")] = 3.0,
    live_seconds: Annotated[
        float, typer.Option(help="Length of the live phase on 127.0.0.1 (0 skips it).")
    ] = 30.0,
    as_json: JsonOption = False,
) -> None:
    """An emulated day of a 12-replica fleet with a host loss and a TPOT regression: recorded,
    replayed, SLOs evaluated and alerted, report and decision record written; then a live
    phase where the `run` service scrapes and receives. Offline; everything says it is emulated.
    """
    with err_console.status("demo") as status:

        def progress(message: str) -> None:
            status.update(message)
            err_console.print(labelled("-", message, style="dim"))

        try:
            result = run_demo(
                out=out, hours=hours, rate_rps=rate, live_seconds=live_seconds, progress=progress
            )
        except DemoError as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    summary = result.summary
    if as_json:
        print_json(summary)
        return
    # Sentences as lines: a log or terminal wraps them itself, never mid-sentence by us.
    out_console.print(demo_summary(summary), soft_wrap=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
