"""`servewatch import prometheus`: a fleet's history read from the Prometheus it already has."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servewatch.cli.app import (
    DEFAULT_DB,
    EXIT_BAD_INPUT,
    CliState,
    FromOption,
    JsonOption,
    ToOption,
    fail,
    import_app,
    instant,
    load_config_or_fail,
    open_store,
)
from servewatch.collectors.prometheus.api import PrometheusApiError
from servewatch.collectors.prometheus.reader import ImportWindow, Resolution
from servewatch.pipeline.instants import parse_duration
from servewatch.prometheus_import import (
    import_from_prometheus,
    import_json,
    import_recorded_from_prometheus,
    import_summary,
    recorded_import_json,
    recorded_import_summary,
)
from servewatch.render import err_console, labelled, out_console, print_json

StepOption = Annotated[
    str | None,
    typer.Option(
        "--step",
        help="The scrape interval to expect (15s, 1m), which sizes the chunks; with --resolution "
        "step, the step between imported instants. Default scrape.interval_s of --config, "
        "else 15s.",
    ),
]
ResolutionOption = Annotated[
    Resolution | None,
    typer.Option(
        "--resolution",
        help="raw (default): the samples as Prometheus stored them, at their scrape times, so "
        "rates, quantiles and means equal PromQL's. step: values at step instants "
        "(query_range), which drift from PromQL (docs/prometheus-import.md).",
        case_sensitive=False,
    ),
]
RawOption = Annotated[
    bool,
    typer.Option(
        "--raw",
        help="Same as --resolution raw, the default; kept for scripts written before it was.",
    ),
]
KeepUncataloguedOption = Annotated[
    bool | None,
    typer.Option(
        "--keep-uncatalogued/--catalogued-only",
        help="Import every other family of the same jobs too, under its own name, or only the "
        "catalogued ones; default: the config's scrape.keep_uncatalogued (true).",
        show_default=False,
    ),
]
RecordedOption = Annotated[
    bool,
    typer.Option(
        "--recorded",
        help="Import only the SLI series `servewatch rules sli` has the server record "
        "(replica:, pool:, pool_model: names), as evaluated, for `servewatch sli --recorded`; "
        "no raw series. Works with Prometheus, Thanos, Mimir and VictoriaMetrics (vmalert).",
    ),
]


@import_app.command("prometheus")
def import_prometheus(
    ctx: typer.Context,
    url: Annotated[
        str,
        typer.Argument(
            metavar="URL",
            help="The HTTP API root of a Prometheus, Thanos or Mimir, e.g. http://prometheus:9090.",
        ),
    ],
    from_: FromOption = None,
    to: ToOption = None,
    step: StepOption = None,
    resolution: ResolutionOption = None,
    raw: RawOption = False,
    keep_uncatalogued: KeepUncataloguedOption = None,
    recorded: RecordedOption = False,
    config_path: Annotated[
        Path,
        typer.Option(
            "--config",
            help="servewatch.toml, when it exists: lends the store path, step and keep option.",
        ),
    ] = Path("servewatch.toml"),
    as_json: JsonOption = False,
) -> None:
    """Import --from..--to of what a Prometheus holds into the store (docs/prometheus-import.md).

    The catalogued families a Prometheus (Thanos, Mimir) already holds for the range are read
    through its HTTP API into the tables a scrape fills, as stored (raw samples at their scrape
    times) unless --resolution step; importing a range twice changes nothing, and an import cut
    short resumes where it stopped. --recorded reads the recorded SLI series instead.
    """
    state = ctx.ensure_object(CliState)
    import_prometheus_range(
        state,
        url,
        config_path=config_path,
        from_=from_,
        to=to,
        step=step,
        resolution=resolution,
        raw=raw,
        keep_uncatalogued=keep_uncatalogued,
        as_json=as_json,
        recorded=recorded,
    )


def chosen_resolution(resolution: Resolution | None, *, raw: bool, step: str | None) -> Resolution:
    """The resolution the options ask for: raw unless --resolution step; `--raw` (raw's old
    spelling) with --resolution step is a contradiction."""
    if raw and resolution is Resolution.STEP:
        raise fail(
            "--raw and --resolution step contradict each other; raw is the default, give "
            "--resolution step alone for values at step instants",
            code=EXIT_BAD_INPUT,
        )
    if resolution is None and step is not None and not raw:
        # Before raw was the default, --step alone meant values at step instants.
        err_console.print(
            labelled(
                "note:",
                "the import reads raw samples (the default); --step sizes its chunks. "
                "Give --resolution step for values at step instants",
            )
        )
    return resolution or Resolution.RAW


def import_prometheus_range(
    state: CliState,
    url: str,
    *,
    config_path: Path,
    from_: str | None,
    to: str | None,
    step: str | None,
    raw: bool,
    keep_uncatalogued: bool | None,
    as_json: bool,
    resolution: Resolution | None = None,
    recorded: bool = False,
) -> None:
    """Import [--from, --to) of the catalogued families the Prometheus at `url` holds, or with
    `recorded` the SLI series its rules recorded."""
    # The config is optional here: it only lends the store path, step and keep option.
    config = load_config_or_fail(config_path) if config_path.exists() else None
    if config is not None and config.store_path != DEFAULT_DB and state.db == DEFAULT_DB:
        state.db = config.store_path
    from_ts, to_ts = instant(from_, "--from"), instant(to, "--to")
    if from_ts is None or to_ts is None:
        raise fail("a Prometheus import needs --from and --to", code=EXIT_BAD_INPUT)
    if recorded:
        _check_recorded_options(resolution=resolution, keep_uncatalogued=keep_uncatalogued)
        resolution = Resolution.RAW
    chosen = chosen_resolution(resolution, raw=raw, step=step)
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
            resolution=chosen,
        )
    except ValueError as exc:
        raise fail(f"--from/--to/--step: {exc}", code=EXIT_BAD_INPUT) from exc
    if recorded:
        _import_recorded(state, url, window=window, as_json=as_json)
        return
    keep = keep_uncatalogued
    if keep is None:
        keep = config.scrape.keep_uncatalogued if config is not None else True
    with open_store(state, create=True) as store:
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


def _check_recorded_options(
    *, resolution: Resolution | None, keep_uncatalogued: bool | None
) -> None:
    """--recorded reads the recorded series as evaluated: options about raw families or step
    instants have nothing to act on."""
    if resolution is Resolution.STEP:
        raise fail(
            "--recorded with --resolution step: recorded series are read as evaluated, one "
            "sample per rule evaluation; leave --resolution out (--step sizes the chunks: give "
            "the rules' evaluation interval)",
            code=EXIT_BAD_INPUT,
        )
    if keep_uncatalogued is not None:
        raise fail(
            "--recorded with --keep-uncatalogued/--catalogued-only: a recorded import reads the "
            "SLI records only; leave the option out",
            code=EXIT_BAD_INPUT,
        )


def _import_recorded(state: CliState, url: str, *, window: ImportWindow, as_json: bool) -> None:
    with open_store(state, create=True) as store:
        try:
            report = import_recorded_from_prometheus(url, store=store, window=window)
        except PrometheusApiError as exc:
            raise fail(f"{exc} (chunks imported before this are kept; rerun to resume)") from exc
    if as_json:
        print_json(recorded_import_json(report, window=window))
        return
    out_console.print(recorded_import_summary(report), highlight=False)
    for problem in report.problems:
        err_console.print(labelled("problem", str(problem)))
