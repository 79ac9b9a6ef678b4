"""`servewatch run`: the scheduled service next to a fleet."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from servewatch.cli.app import (
    DEFAULT_DB,
    EXIT_BAD_INPUT,
    CliState,
    ShardOption,
    app,
    fail,
    shard_or_fail,
    store_failure,
)
from servewatch.config import ConfigError
from servewatch.render import (
    err_console,
)
from servewatch.service import Service
from servewatch.slo.fields import SpecError
from servewatch.slo_service import SloSetupError
from servewatch.store import (
    StoreError,
)


@app.command()
def run(
    ctx: typer.Context,
    config_path: Annotated[
        Path, typer.Option("--config", help="servewatch.toml: targets, OTLP listener, SLOs.")
    ] = Path("servewatch.toml"),
    health_port: Annotated[
        int,
        typer.Option(
            help="Port on 127.0.0.1 for the service's live page (/), API (/api/v1/), /metrics "
            "and /healthz."
        ),
    ] = 9464,
    shard: ShardOption = None,
) -> None:
    """Run the service: scrape, receive OTLP, roll up, evaluate SLOs and alert, on schedule.

    SIGTERM or Ctrl-C finishes the running jobs, writes what is pending and exits 0. A config
    file that turns invalid while running is reported and the last good one stays in use. A
    target failing scrape.failing_after scrapes in a row is warned about on stderr; /healthz
    says degraded while some targets fail and answers 503 while all do. The live report page
    is served at /, the reading commands' answers under /api/v1/ (sli, slo, alerts, health,
    recommendation), and SLO, capacity and finding gauges on /metrics; an [api] bearer_token
    guards all of them (not /healthz). With --shard I/N (or scrape.shard) only shard I's
    targets are scraped, and /healthz says which shard it is and how many targets it kept.
    """
    state = ctx.ensure_object(CliState)
    chosen = shard_or_fail(shard)
    db = state.one_store()
    try:
        service = Service(config_path, store_path=None if db == DEFAULT_DB else db, shard=chosen)
    except (ConfigError, SloSetupError, SpecError) as exc:
        raise fail(str(exc), code=EXIT_BAD_INPUT) from exc
    except StoreError as exc:
        raise store_failure(exc) from exc
    except OSError as exc:  # a listener cannot bind its address
        raise fail(f"cannot start: {exc}") from exc
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    grpc = service.grpc_receiver
    otlp = service.receiver.endpoint + (f" and gRPC {grpc.endpoint}" if grpc else "")
    sharding = service.state.config.scrape.shard
    shard_note = f"shard {sharding}, " if sharding.count > 1 else ""
    err_console.print(
        f"servewatch run: store {service.store.path}, OTLP {otlp}, {shard_note}"
        f"live page http://127.0.0.1:{health_port}/ (API /api/v1/, /metrics, /healthz)"
    )
    try:
        service.run_until(stop, health_port=health_port)
    except OSError as exc:
        raise fail(f"cannot start: {exc}") from exc
