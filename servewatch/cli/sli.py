"""`servewatch sli`: SLIs from traces and scraped histograms, per group and for the fleet."""

from __future__ import annotations

from typing import Annotated

import typer

from servewatch.answers import sli_answer
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
    read_window,
)
from servewatch.pipeline.instants import format_instant, parse_duration
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.sli_report import Grouping, SliSource, points_window
from servewatch.pipeline.window import WindowQuery
from servewatch.render import (
    err_console,
    out_console,
    print_json,
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
    """
    state = ctx.ensure_object(CliState)
    from_ts, to_ts = instant(from_, "--from"), instant(to, "--to")
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
        if source.traces:
            out_console.print(sli_table(report))
            if step is not None:
                out_console.print(sli_series_table(report))
        if "histograms" in report:
            for table in sli_histogram_tables(report):
                out_console.print(table)
        for table in sli_family_tables(report):
            out_console.print(table)
    if source.histograms and "histograms" not in report:
        err_console.print(
            f"no scraped series in {state.stores_named} for this window: scrape or replay first"
        )
    if source.traces and report["overall"]["requests"] == 0:
        err_console.print(
            f"no requests in {state.stores_named} for this window: ingest traces first"
        )
