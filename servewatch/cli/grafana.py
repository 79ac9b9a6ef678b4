"""`servewatch grafana`: the Grafana dashboard JSON over the user's Prometheus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from servewatch.cli.app import EXIT_BAD_INPUT, JsonOption, app, fail, write_file
from servewatch.dashboards.grafana import (
    DashboardLabelError,
    DashboardLabels,
    build_grafana_dashboard,
    dashboard_summary,
)
from servewatch.render import err_console, print_json


@app.command()
def grafana(
    out: Annotated[
        Path, typer.Option(help="Where to write the dashboard JSON (import it into Grafana).")
    ] = Path("dashboard.json"),
    replica_label: Annotated[
        str,
        typer.Option(
            help="Label naming a replica on its vLLM series and on its GPUs' DCGM series."
        ),
    ] = "pod",
    namespace_label: Annotated[
        str,
        typer.Option(help="Label qualifying the replica label; '' when replica names are unique."),
    ] = "namespace",
    title: Annotated[str, typer.Option(help="The dashboard's title.")] = (
        "servewatch: vLLM fleet, GPUs, SLOs and capacity"
    ),
    uid: Annotated[str, typer.Option(help="The dashboard's uid (importing again replaces it).")] = (
        "servewatch-fleet"
    ),
    as_json: JsonOption = False,
) -> None:
    """Write a Grafana dashboard over your Prometheus: vLLM's panels, dcgm-exporter's GPU panels
    joined to replicas by pod, and servewatch run's SLO, error budget, burn rate and capacity
    gauges, with variables for the datasource, pool, model, replica and SLO (docs/dashboards.md,
    Grafana). --json prints its panels, queries and variables."""
    try:
        labels = DashboardLabels(replica=replica_label, namespace=namespace_label)
    except DashboardLabelError as exc:
        raise fail(f"--replica-label/--namespace-label: {exc}", code=EXIT_BAD_INPUT) from exc
    document = build_grafana_dashboard(labels=labels, title=title, uid=uid)
    write_file(out, json.dumps(document, indent=2) + "\n", what="the dashboard file")
    summary = dashboard_summary(document)
    if as_json:
        print_json({"out": str(out), **summary})
        return
    err_console.print(
        f"wrote {out}: {len(summary['panels'])} panels, {summary['queries']} queries, "
        f"variables {', '.join(v['name'] for v in summary['variables'])}"
    )
