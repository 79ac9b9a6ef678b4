"""`servewatch sli`: SLIs from traces and scraped histograms, per group and for the fleet."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer

from servewatch.answers import recorded_sli_answer, sli_answer
from servewatch.cli.app import (
    EXIT_BAD_INPUT,
    CliState,
    FromOption,
    JsonOption,
    ToOption,
    app,
    fail,
    instant,
    limit_s,
    open_store,
    read_window,
)
from servewatch.pipeline.instants import format_instant, parse_duration
from servewatch.pipeline.recorded_sli import DEFAULT_LOOKBACK_S
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.sli_report import Grouping, SliSource, points_window
from servewatch.pipeline.window import WindowQuery
from servewatch.render import (
    err_console,
    out_console,
    print_json,
    recorded_sli_table,
    sli_family_tables,
    sli_histogram_tables,
    sli_series_table,
    sli_table,
)


@app.command()
def sli(
    ctx: typer.Context,
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
        Grouping,
        typer.Option(
            "--by",
            help="Group rows by replica, pool, model, LoRA adapter (traces only), or fleet only.",
        ),
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
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            metavar="FAMILY",
            help="Also read this stored family, catalogued or not (repeatable): quantiles of a "
            "histogram, increase of a counter, mean and max of a gauge.",
        ),
    ] = None,
    recorded: Annotated[
        bool,
        typer.Option(
            "--recorded",
            help="Answer from the recorded SLI series (`import prometheus --recorded`) at --to "
            "(default: the newest evaluation), by replica, pool or model (pool and model).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """SLIs from traces and from scraped histograms, per replica, pool, model, adapter or fleet.

    Traces: TTFT, TPOT, e2e percentiles, attainment and goodput of requests selected by
    completion time; goodput counts requests that succeeded and met every given limit, per
    second of the window, token goodput their output tokens per second and as a share of all
    output tokens, failed requests' included (neither computed without limits). Histograms:
    TTFT, ITL, TPOT and e2e quantiles as PromQL's histogram_quantile over the window, KV-cache
    usage, prefix-cache hit rate, running and waiting requests, preemptions, token throughput,
    finish reasons and GPU utilisation and power, shown when scraped series exist in the window.
    Recorded (--recorded): the values the fleet's Prometheus recorded from `servewatch rules
    sli`, each over its rule's window ending at its evaluation (docs/prometheus-import.md).
    """
    state = ctx.ensure_object(CliState)
    from_ts, to_ts = instant(from_, "--from"), instant(to, "--to")
    if recorded:
        given = {
            "--from": from_ is not None,
            "--window": window is not None,
            "--ttft-ms/--tpot-ms/--e2e-ms": any(v is not None for v in (ttft_ms, tpot_ms, e2e_ms)),
            "--metric": bool(metric),
            "--source": source is not SliSource.BOTH,
        }
        _recorded_sli(state, to_ts=to_ts, by=by, as_json=as_json, refused=given)
        return
    if from_ts and to_ts and to_ts <= from_ts:
        raise fail(
            f"--to ({format_instant(to_ts)}) must be after --from ({format_instant(from_ts)})",
            code=EXIT_BAD_INPUT,
        )
    limits = GoodputLimits(
        ttft_s=limit_s(ttft_ms, "--ttft-ms"),
        tpot_s=limit_s(tpot_ms, "--tpot-ms"),
        e2e_s=limit_s(e2e_ms, "--e2e-ms"),
    )
    step = None
    if window is not None:
        try:
            step = parse_duration(window)
        except ValueError as exc:
            raise fail(f"--window: {exc}", code=EXIT_BAD_INPUT) from exc
    window_read = read_window(state, WindowQuery(from_ts, to_ts, **points_window(step)))
    report = sli_answer(
        window_read, limits=limits, by=by, step=step, source=source, families=metric or ()
    )
    if as_json:
        print_json(report)
    else:
        _print_tables(report, source=source, stepped=step is not None)
    if source.histograms and "histograms" not in report:
        err_console.print(
            f"no scraped series in {state.stores_named} for this window: scrape or replay first"
        )
    if source.traces and report["overall"]["requests"] == 0:
        err_console.print(
            f"no requests in {state.stores_named} for this window: ingest traces first"
        )


def _print_tables(report: dict[str, Any], *, source: SliSource, stepped: bool) -> None:
    if source.traces:
        out_console.print(sli_table(report))
        if stepped:
            out_console.print(sli_series_table(report))
    if "histograms" in report:
        for table in sli_histogram_tables(report):
            out_console.print(table)
    for table in sli_family_tables(report):
        out_console.print(table)


_RECORDED_LEVELS = {
    Grouping.REPLICA: "replica",
    Grouping.POOL: "pool",
    Grouping.MODEL: "pool_model",
}


def _recorded_sli(
    state: CliState,
    *,
    to_ts: datetime | None,
    by: Grouping,
    as_json: bool,
    refused: dict[str, bool],
) -> None:
    """`sli --recorded`: the recorded SLIs of one level at one instant."""
    for option, present in refused.items():
        if present:
            raise fail(
                f"--recorded with {option}: recorded SLIs are read at one instant (--to), each "
                "over its own rule's window, with no limits or other sources; leave it out",
                code=EXIT_BAD_INPUT,
            )
    level = _RECORDED_LEVELS.get(by)
    if level is None:
        raise fail(
            f"--recorded with --by {by.value}: the rules record replica, pool and pool_model "
            "levels only; give --by replica, pool or model (pool and model)",
            code=EXIT_BAD_INPUT,
        )
    with open_store(state, read_only=True) as store:
        document = recorded_sli_answer(store, at=to_ts, level=level, lookback_s=DEFAULT_LOOKBACK_S)
    if as_json:
        print_json(document)
    else:
        out_console.print(recorded_sli_table(document))
    if not document["groups"]:
        err_console.print(
            f"no recorded {level} SLIs in {state.db} at this instant: "
            "servewatch import prometheus URL --recorded first"
        )
