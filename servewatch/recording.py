"""`servewatch record`: live scrapes and received spans recorded as a replayable fixture folder.

For the given minutes the configured targets are scraped on a fixed grid (every
`scrape.interval_s` from the start) and the OTLP receivers (HTTP, and gRPC unless turned off)
listen on the configured addresses;
every page and every accepted export goes to the folder (`collectors.fixture.recording`).
Nothing is written to the store: a recording is the raw input, and `servewatch replay DIR`
turns it into tables whenever wanted (twice gives the same tables), without holding the store
that a running `servewatch run` may own. Stopping early (the `stop` event, set by SIGINT or
SIGTERM) finishes the round in progress and writes the manifest, so the folder stays valid.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from servewatch.collectors.fixture.recording import FixtureRecording
from servewatch.collectors.scrape import event_loop
from servewatch.collectors.scrape.scraper import ScrapeResult, scrape_targets
from servewatch.collectors.scrape.targets import Target
from servewatch.collectors.store_writer import TraceCommit
from servewatch.collectors.traces.grpc_receiver import OtlpGrpcReceiver
from servewatch.collectors.traces.ingest import Reject
from servewatch.collectors.traces.receiver import PROTOBUF, ExportOutcome, OtlpHttpReceiver
from servewatch.config import Config, ScrapeSettings
from servewatch.scraping import resolve_targets

# The fixture format holds text-format pages (replay parses them so): ask for that format only.
TEXT_FORMAT_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


class RecordingError(Exception):
    """The recording cannot be made as asked; the message says why."""


@dataclass(frozen=True)
class RecordingProgress:
    rounds: int
    planned_rounds: int
    pages: int
    failed_scrapes: int
    spans: int


ProgressCallback = Callable[[RecordingProgress], None]


class _Discard:
    """A recording keeps request bodies, not rows: the receiver's rows go nowhere."""

    def submit(self, rows: pl.DataFrame, rejects: list[Reject]) -> TraceCommit:
        return TraceCommit.committed()


def _receivers(
    config: Config, keep: Callable[[ExportOutcome], None]
) -> list[OtlpHttpReceiver | OtlpGrpcReceiver]:
    """The OTLP listeners of `servewatch run`'s configuration, bound, keeping what they accept."""
    otlp = config.otlp
    try:
        http = OtlpHttpReceiver(otlp, _Discard(), on_accepted=keep)
    except OSError as exc:
        raise RecordingError(f"cannot listen for OTLP on {otlp.host}:{otlp.port}: {exc}") from exc
    if not otlp.grpc_enabled:
        return [http]
    try:
        return [http, OtlpGrpcReceiver(otlp, _Discard(), on_accepted=keep)]
    except OSError as exc:
        http.stop()
        raise RecordingError(str(exc)) from exc


def _stop_all(receivers: Sequence[OtlpHttpReceiver | OtlpGrpcReceiver]) -> None:
    for receiver in receivers:
        receiver.stop()


async def _fetch(targets: Sequence[Target], settings: ScrapeSettings) -> list[ScrapeResult]:
    async def text_format(request: httpx.Request) -> None:
        request.headers["Accept"] = TEXT_FORMAT_ACCEPT

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(
        limits=limits, follow_redirects=False, event_hooks={"request": [text_format]}
    ) as client:
        return await scrape_targets(list(targets), client=client, timeout_s=settings.timeout_s)


def planned_rounds(*, minutes: float, interval_s: float) -> int:
    """Rounds at 0, interval, ... up to and including the recording's length."""
    return math.floor(minutes * 60 / interval_s + 1e-9) + 1


def record(
    config: Config,
    *,
    out: Path,
    minutes: float,
    stop: threading.Event,
    clock: Callable[[], float] = time.time,
    on_progress: ProgressCallback | None = None,
    description: str = "servewatch record",
) -> dict[str, Any]:
    """Record for `minutes` (or until `stop` is set) into the new folder `out`; returns the
    manifest. Raises RecordingError or FixtureError before anything is recorded if the
    recording cannot start."""
    if not (minutes > 0 and math.isfinite(minutes)):
        raise RecordingError(f"--minutes must be a positive number, got {minutes}")
    targets, problems = resolve_targets(config)
    if problems:
        raise RecordingError("; ".join(problems))
    interval_ms = round(config.scrape.interval_s * 1000)
    if interval_ms <= 0:
        raise RecordingError(f"scrape.interval_s {config.scrape.interval_s} is under 1 ms")
    total = planned_rounds(minutes=minutes, interval_s=interval_ms / 1000)
    start_ms = math.ceil(clock() * 1000)
    export_errors: list[str] = []

    def keep(outcome: ExportOutcome) -> None:
        if outcome.request_body is None:
            return
        try:
            recording.write_export(
                outcome.request_body,
                protobuf=outcome.content_type == PROTOBUF,
                spans=outcome.spans,
            )
        except (ValueError, OSError) as exc:
            export_errors.append(str(exc))

    receivers = _receivers(config, keep)
    try:
        recording = FixtureRecording(
            out, targets, start_ms=start_ms, scrape_interval_ms=interval_ms
        )
    except BaseException:
        _stop_all(receivers)  # only bound so far: this closes the sockets
        raise
    for receiver in receivers:
        receiver.start()
    try:
        k = 0
        while k < total:
            at_ms = recording.round_ms(k)
            delay_s = at_ms / 1000 - clock()
            # The first round runs whatever happens, so even an instant stop leaves one.
            if k > 0 and (stop.wait(delay_s) if delay_s > 0 else stop.is_set()):
                break
            for result in event_loop.run(_fetch(targets, config.scrape)):
                recording.write_page(
                    result.target, at_ms, result.body, openmetrics=result.openmetrics
                )
            if on_progress is not None:
                on_progress(
                    RecordingProgress(
                        rounds=recording.rounds,
                        planned_rounds=total,
                        pages=recording.pages,
                        failed_scrapes=recording.failed_scrapes,
                        spans=recording.spans,
                    )
                )
            # A round that overran the interval skips the instants it missed.
            k = max(k + 1, math.floor((clock() * 1000 - start_ms) / interval_ms) + 1)
        if not stop.is_set():
            # Spans of the last moments are still on their way: wait out the rest of the time.
            stop.wait(max(0.0, start_ms / 1000 + minutes * 60 - clock()))
    finally:
        _stop_all(receivers)
        manifest = recording.close(stopped_ms=round(clock() * 1000), description=description)
    if export_errors:
        manifest["export_errors"] = export_errors[:20]
    return manifest
