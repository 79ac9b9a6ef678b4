"""`servewatch health`: the failure modes the store's window shows."""

from __future__ import annotations

from typing import Annotated

import typer

from servewatch.answers import health_answer
from servewatch.cli.app import (
    EXIT_BAD_INPUT,
    CliState,
    ConfigOption,
    FromOption,
    JsonOption,
    SloOption,
    ToOption,
    VersionLabelOption,
    app,
    fail,
    instant,
    read_window,
)
from servewatch.cli.slo_files import slo_specs
from servewatch.health_service import (
    DEFAULT_VERSION_LABEL,
    health_findings,
    health_window,
)
from servewatch.pipeline.instants import format_instant
from servewatch.pipeline.window import WindowQuery
from servewatch.render import (
    err_console,
    health_table,
    out_console,
    print_json,
)


@app.command()
def health(
    ctx: typer.Context,
    from_: FromOption = None,
    to: ToOption = None,
    version_label: VersionLabelOption = DEFAULT_VERSION_LABEL,
    zone_loss: Annotated[
        bool,
        typer.Option(help="Whether losing a zone is in scope (flags pools in a single zone)."),
    ] = True,
    slo: SloOption = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Which failure mode the data shows, where, since when and how sure: slow replicas, KV
    pool pressure, affinity loss, traffic steps, regressing rollouts and shared failure domains
    (host loss, replicas without host or zone, all capacity in one zone).

    Each finding says what it cost: bad requests beyond the usual and the share of the
    window's error budget, against the goodput limits and objective of the SLOs (--slo, else
    the config's [slo] files; failed requests only, against 99 %, when none are given).
    Findings one cause explains are listed under it (`consequences` in JSON).

    The window defaults to everything stored; an empty end (null in JSON) means ongoing.
    """
    state = ctx.ensure_object(CliState)
    specs = slo_specs(state, slo, config)
    from_ts, to_ts = instant(from_, "--from"), instant(to, "--to")
    if from_ts and to_ts and to_ts <= from_ts:
        raise fail(
            f"--to ({format_instant(to_ts)}) must be after --from ({format_instant(from_ts)})",
            code=EXIT_BAD_INPUT,
        )
    stored = read_window(state, WindowQuery(from_ts, to_ts))
    try:
        if as_json:
            document, examined = health_answer(
                stored, version_label=version_label, zone_loss_in_scope=zone_loss, specs=specs
            )
            print_json(document)
        else:
            window = health_window(stored)
            examined = window is not None
            findings = health_findings(
                stored, version_label=version_label, zone_loss_in_scope=zone_loss, specs=specs
            )
            out_console.print(health_table(findings, start=window[0] if window else None))
    except ValueError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    if not examined:
        err_console.print(
            f"nothing stored in {state.stores_named} to examine: scrape or replay first"
        )
