"""`servewatch report`: the offline report page of a store window, its answers first."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from servewatch.capacity.decision_record import DecisionRecord
from servewatch.capacity.parallel import process_map
from servewatch.capacity.requirement import RequirementError, load_requirement
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
    limit_s,
    read_window,
    store_failure,
)
from servewatch.cli.slo_files import slo_specs
from servewatch.dashboards.export import write_report
from servewatch.health.rollout_comparison import VersionLabelError
from servewatch.health_service import (
    DEFAULT_VERSION_LABEL,
)
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.window import WindowQuery
from servewatch.recommend_service import recommend_from_store
from servewatch.render import (
    err_console,
    labelled,
    out_console,
    print_json,
)
from servewatch.report_service import SloViews, report_span, slo_views, window_report
from servewatch.slo.spec import SloSpec
from servewatch.slo_service import limits_of
from servewatch.store import Store, StoreBusyError, StoreError


def _answers(
    state: CliState,
    *,
    specs: Sequence[SloSpec],
    requirement: Path | None,
    span: tuple[datetime, datetime] | None,
    window: WindowQuery,
) -> tuple[SloViews | None, DecisionRecord | None]:
    """The SLO verdicts and the capacity answer: both read the store itself."""
    if (not specs and requirement is None) or span is None:
        return None, None
    spec = None
    if requirement is not None:
        try:
            spec = load_requirement(requirement)
        except RequirementError as exc:
            raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    start, end = span
    if len(state.dbs) > 1:
        err_console.print(
            labelled(
                "note:",
                f"the SLO verdicts and the capacity answer read one store; with {len(state.dbs)} "
                "stores they are left out of this report (`servewatch slo status` and "
                "`recommend` read each store)",
            )
        )
        return None, None
    try:
        opened = Store.open(state.db, create=False, read_only=True)
    except StoreBusyError as exc:
        # The window itself was read through the service; these need the store's own reads.
        err_console.print(
            labelled(
                "note:",
                f"{exc}: the SLO verdicts and the capacity answer are left out of this report "
                "(`servewatch slo status` and `recommend` read them once the store is free)",
            )
        )
        return None, None
    except StoreError as exc:
        raise store_failure(exc) from exc
    try:
        with opened as store:
            slos = slo_views(store, specs=specs, start=start, end=end) if specs else None
            record = None
            if spec is not None:
                with process_map() as mapper:
                    record, _ = recommend_from_store(
                        store,
                        requirement=spec,
                        from_ts=window.from_ts,
                        to_ts=window.to_ts,
                        mapper=mapper,
                    )
    except RequirementError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    return slos, record


@app.command()
def report(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Folder for report.html and charts/.")] = Path("report"),
    from_: FromOption = None,
    to: ToOption = None,
    ttft_ms: Annotated[
        float | None,
        typer.Option("--ttft-ms", help="TTFT limit, ms (default: the goodput SLO's)."),
    ] = None,
    tpot_ms: Annotated[
        float | None,
        typer.Option("--tpot-ms", help="TPOT limit, ms (default: the goodput SLO's)."),
    ] = None,
    slo: SloOption = None,
    config: ConfigOption = None,
    requirement: Annotated[
        Path | None,
        typer.Option(
            help="Requirement TOML (docs/capacity.md): adds the recommended fleet, its cost, "
            "failure table, tornado and drill, sized as `recommend` sizes it."
        ),
    ] = None,
    images: Annotated[bool, typer.Option(help="Also write a PNG and an SVG per chart.")] = True,
    version_label: VersionLabelOption = DEFAULT_VERSION_LABEL,
    as_json: JsonOption = False,
) -> None:
    """Write an offline report: report.html (scripts inlined, nothing fetched) opening with
    each SLO's verdict at the end of the window (budget, burn rates, alerts fired and firing),
    the recommended fleet when --requirement is given, and which replica is bad; then every
    chart the store's data supports and the fleet-health findings, plus a PNG, an SVG and the
    Vega-Lite JSON per chart. SLOs come from --slo, else from the [slo] files of --config or
    ./servewatch.toml."""
    state = ctx.ensure_object(CliState)
    from_ts, to_ts = instant(from_, "--from"), instant(to, "--to")
    specs = slo_specs(state, slo, config)
    given = GoodputLimits(
        ttft_s=limit_s(ttft_ms, "--ttft-ms"), tpot_s=limit_s(tpot_ms, "--tpot-ms")
    )
    limits = given if given != GoodputLimits() else limits_of(specs)
    if out.exists() and not out.is_dir():
        raise fail(
            f"--out {out}: is a file; the report is a folder (report.html and charts/)",
            code=EXIT_BAD_INPUT,
        )
    query = WindowQuery(from_ts, to_ts)
    stored = read_window(state, query)
    span = report_span(stored)
    slos, record = _answers(state, specs=specs, requirement=requirement, span=span, window=query)
    try:
        built = window_report(
            stored,
            limits=limits,
            version_label=version_label,
            slos=slos,
            record=record,
            specs=specs,
        )
    except VersionLabelError as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    with err_console.status("rendering charts"):
        files = write_report(built, out, images=images)
    document = {
        "html": str(files.html),
        "html_bytes": files.html_bytes,
        "out": str(out),
        "slo_verdicts": [
            {
                "slo": v.slo,
                "verdict": v.state.value,
                "good": v.good,
                "total": v.total,
                "budget_remaining_ratio": v.budget_remaining_ratio,
                "alerts_firing": [a.name for a in v.firing],
                "alerts_fired": [a.name for a in v.fired],
            }
            for v in built.verdicts
        ],
        "recommendation": None if record is None else record.verdict(),
        "not_shown": [{"panel": p, "reason": r} for p, r in built.omitted],
    }
    if as_json:
        print_json(document)
    else:
        out_console.print(f"wrote {files.html} ({files.html_bytes:,} bytes)", highlight=False)
