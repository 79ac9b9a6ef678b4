"""`servewatch emulate` and `demo`: emulated fleets, live or recorded, and the demo."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from servewatch.cli.app import (
    EXIT_BAD_INPUT,
    JsonOption,
    app,
    fail,
)
from servewatch.demo import DemoError, run_demo
from servewatch.emulation import record_emulated_fleet, serve_emulated_fleet
from servewatch.emulator.fleet_config import FleetConfig, FleetConfigError, load_fleet_config
from servewatch.emulator.native import describe as emulator_implementation
from servewatch.render import (
    demo_summary,
    err_console,
    labelled,
    out_console,
    print_json,
)


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
