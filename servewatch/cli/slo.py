"""`servewatch slo status|rules|evaluate` and `alerts`: budgets, burn rates, alert state."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import httpx
import typer

from servewatch.answers import alerts_answer, described, slo_answer
from servewatch.cli.app import (
    CliState,
    ConfigOption,
    JsonOption,
    SloOption,
    app,
    instant,
    load_config_or_fail,
    open_store,
    read_answer,
    slo_app,
    write_file,
)
from servewatch.cli.slo_files import slo_specs
from servewatch.collectors.service_api import ALERTS_PATH, SLO_PATH
from servewatch.pipeline.instants import format_instant
from servewatch.render import (
    alerts_table,
    change_json,
    err_console,
    labelled,
    out_console,
    print_json,
    slo_status_table,
)
from servewatch.slo.alertmanager import AlertmanagerNotifier
from servewatch.slo.prometheus_rules import prometheus_rules
from servewatch.slo_service import evaluate
from servewatch.store import (
    utc_now,
)


@slo_app.command("status")
def slo_status_command(
    ctx: typer.Context,
    slo: SloOption = None,
    config: ConfigOption = None,
    at: Annotated[
        str | None,
        typer.Option(help="Evaluate at this time (default: the end of the data the SLOs read)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Budget remaining and consumed, burn rate per alert window, time to exhaustion and alert
    state of every SLO, exact from per-minute good and total counts. A period without events
    says "no data". The output names the instant evaluated and why."""
    state = ctx.ensure_object(CliState)
    specs = slo_specs(state, slo, config, required=True)
    moment = instant(at, "--at")
    # While `run` holds the store it answers for the SLOs of its own configuration, by name.
    asked = {"slo": [s.name for s in specs], **({} if at is None else {"at": at})}
    document = read_answer(
        state,
        lambda store: slo_answer(store, specs=specs, at=moment),
        path=SLO_PATH,
        params=asked,
    )
    if as_json:
        print_json(document)
        return
    out_console.print(
        slo_status_table(document["slos"], at=document["at"], caption=described(document))
    )


@slo_app.command("rules")
def slo_rules_command(
    ctx: typer.Context,
    slo: SloOption = None,
    config: ConfigOption = None,
    out: Annotated[Path, typer.Option(help="Where to write the Prometheus rule file.")] = Path(
        "rules.yml"
    ),
    service_counters: Annotated[
        bool,
        typer.Option(
            help="Rules for SLOs vLLM's metrics cannot express (traced, goodput) over the "
            "event counters `servewatch run` serves; --no-service-counters skips them.",
        ),
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Write Prometheus recording and alerting rules equivalent to servewatch's evaluation
    (error ratios per window from vLLM's histograms and counters, or from `servewatch run`'s
    event counters for traced SLOs; promtool-valid)."""
    state = ctx.ensure_object(CliState)
    specs = slo_specs(state, slo, config, required=True)
    rules = prometheus_rules(specs, service_counters=service_counters)
    write_file(out, rules.to_yaml(), what="the rule file")
    if as_json:
        print_json({"out": str(out), "skipped": list(rules.skipped)})
        return
    out_console.print(f"wrote {out}", highlight=False)
    for reason in rules.skipped:
        err_console.print(labelled("not expressible in PromQL:", reason))


@slo_app.command("evaluate")
def slo_evaluate_command(
    ctx: typer.Context,
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
    state = ctx.ensure_object(CliState)
    specs = slo_specs(state, slo, config, required=True)
    moment = instant(at, "--at") or utc_now()
    url = alertmanager
    if url is None and config is not None:
        url = load_config_or_fail(config).slo.alertmanager_url
    with open_store(state) as store, httpx.Client(timeout=10) as client:
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
def alerts(
    ctx: typer.Context,
    at: Annotated[
        str | None,
        typer.Option(help="History up to this time (default: the end of the stored data)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The alert state history recorded by SLO evaluations (pending, firing, resolved) up to
    an instant, and which alerts were firing then. The output names the instant and why."""
    state = ctx.ensure_object(CliState)
    requested = instant(at, "--at")
    document = read_answer(
        state,
        lambda store: alerts_answer(store, at=requested),
        path=ALERTS_PATH,
        params={} if at is None else {"at": at},
    )
    if as_json:
        print_json(document)
        return
    table = alerts_table(document["alerts"])
    table.caption = f"{len(document['firing'])} firing; history {described(document)}"
    out_console.print(table)
