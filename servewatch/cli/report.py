"""`servewatch report`: the offline report page of a store window."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servewatch.cli.app import (
    EXIT_BAD_INPUT,
    CliState,
    FromOption,
    JsonOption,
    ToOption,
    VersionLabelOption,
    app,
    fail,
    instant,
    limit_s,
    read_window,
)
from servewatch.dashboards.export import write_report
from servewatch.health.rollout_comparison import VersionLabelError
from servewatch.health_service import (
    DEFAULT_VERSION_LABEL,
)
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.window import WindowQuery
from servewatch.render import (
    err_console,
    out_console,
    print_json,
)
from servewatch.report_service import window_report


@app.command()
def report(
    ctx: typer.Context,
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
    state = ctx.ensure_object(CliState)
    from_ts, to_ts = instant(from_, "--from"), instant(to, "--to")
    limits = GoodputLimits(
        ttft_s=limit_s(ttft_ms, "--ttft-ms"), tpot_s=limit_s(tpot_ms, "--tpot-ms")
    )
    if out.exists() and not out.is_dir():
        raise fail(
            f"--out {out}: is a file; the report is a folder (report.html and charts/)",
            code=EXIT_BAD_INPUT,
        )
    stored = read_window(state, WindowQuery(from_ts, to_ts))
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
