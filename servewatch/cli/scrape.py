"""`servewatch scrape`: every target's /metrics into the store, once or on schedule."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from servewatch.cli.app import (
    DEFAULT_DB,
    EXIT_BAD_INPUT,
    CliState,
    FromOption,
    JsonOption,
    ShardOption,
    ToOption,
    app,
    fail,
    load_config_or_fail,
    metric_json,
    open_store,
    shard_or_fail,
)
from servewatch.cli.imports import import_prometheus_range
from servewatch.collectors.metrics.ingest import MetricIngestReport
from servewatch.collectors.scrape.shards import ShardSelection
from servewatch.render import (
    err_console,
    labelled,
    out_console,
    print_json,
)
from servewatch.scraping import resolve_targets, scrape_round, scrape_until, shard_targets


@app.command()
def scrape(
    ctx: typer.Context,
    config_path: Annotated[
        Path, typer.Option("--config", help="servewatch.toml with the targets to scrape.")
    ] = Path("servewatch.toml"),
    once: Annotated[bool, typer.Option(help="Scrape every target once and exit.")] = False,
    shard: ShardOption = None,
    from_prometheus: Annotated[
        str | None,
        typer.Option(
            "--from-prometheus",
            metavar="URL",
            help="Deprecated spelling of `servewatch import prometheus URL`: import --from..--to "
            "from this Prometheus (Thanos, Mimir) HTTP API root instead of scraping.",
        ),
    ] = None,
    from_: FromOption = None,
    to: ToOption = None,
    step: Annotated[
        str | None,
        typer.Option(
            "--step",
            help="With --from-prometheus: the scrape interval to expect (15s, 1m), which sizes "
            "the chunks; default scrape.interval_s of --config, else 15s.",
        ),
    ] = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="With --from-prometheus: import the samples as Prometheus stored them, at "
            "their scrape times (now the default; `import prometheus --resolution step` reads "
            "values at step instants).",
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
    """Scrape every target's /metrics concurrently into the store.

    Each target has its own timeout: a slow or dead one is recorded as a failed scrape and
    delays no other; --once exits 1 when no target answered. With --shard I/N (or
    scrape.shard) only the targets of shard I are scraped, and --json says how many of the
    listed targets that is. Without --once, each target is
    scraped on its own schedule (its interval, at a stable offset within it) until Ctrl-C or
    SIGTERM, and pages are stored in batches as they come (`servewatch run` does this together
    with the other jobs).

    `servewatch import prometheus` reads what a Prometheus already holds instead (the old
    spelling `scrape --from-prometheus URL` still works).
    """
    state = ctx.ensure_object(CliState)
    if from_prometheus is not None:
        err_console.print(
            labelled(
                "note:",
                "`scrape --from-prometheus URL` is now `servewatch import prometheus URL`; "
                "this spelling keeps working for now",
            )
        )
        import_prometheus_range(
            state,
            from_prometheus,
            config_path=config_path,
            from_=from_,
            to=to,
            step=step,
            raw=raw,
            keep_uncatalogued=True if keep_uncatalogued else None,
            as_json=as_json,
        )
        return
    if from_ or to or step or raw or keep_uncatalogued:
        raise fail(
            "--from, --to, --step, --raw and --keep-uncatalogued are options of "
            "`servewatch import prometheus URL`; live scrapes use the config's settings",
            code=EXIT_BAD_INPUT,
        )
    config = load_config_or_fail(config_path, shard=shard_or_fail(shard))
    if config.store_path != DEFAULT_DB and state.db == DEFAULT_DB:
        state.db = config.store_path
    targets, problems = resolve_targets(config)
    for problem in problems:
        err_console.print(labelled("targets:", problem))
    if not targets:
        raise fail(f"{config_path}: no targets to scrape", code=EXIT_BAD_INPUT)
    rounds: list[MetricIngestReport] = []
    selections = [shard_targets(targets, config.scrape)]
    sharded = config.scrape.shard.count > 1

    def note(selection: ShardSelection) -> None:
        # Said once, and again only when a file_sd change moves the counts.
        if sharded and not as_json and selection != selections[-1]:
            err_console.print(labelled("shard:", selection.summary()))
        selections.append(selection)

    if sharded and not as_json:
        err_console.print(labelled("shard:", selections[0].summary()))

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

    with open_store(state, create=True) as store:
        if once:
            kept = selections[0].kept
            show(scrape_round(kept, store=store, settings=config.scrape))
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
                    on_targets=note,
                )
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)
    if as_json:
        print_json({"shard": selections[-1].to_json(), "rounds": [metric_json(r) for r in rounds]})
    # A shard that holds none of the listed targets has nothing to answer: not a failure.
    if once and rounds[0].pages and len(rounds[0].failed_scrapes) == rounds[0].pages:
        raise fail(f"no target answered: all {rounds[0].pages} scrapes failed")
