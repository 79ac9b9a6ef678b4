"""Trace ingest: OTLP/JSON files read, mapped to request rows and written to the store.

Bad input never stops a batch: an unreadable line or broken span becomes a `Reject` (source,
location, message), is recorded in the store's `ingest_errors`, and everything else is kept.
Writing is idempotent, so ingesting the same file twice leaves the same rows.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import polars as pl

from servewatch.collectors.traces.otlp_json import FileChunk, read_trace_file
from servewatch.collectors.traces.request_spans import RequestRows, SpanMapping, SpanMappingError
from servewatch.collectors.traces.span_identity import TargetDirectory
from servewatch.pipeline.tables import INGEST_ERRORS_SCHEMA
from servewatch.store import Store

WRITE_BATCH_ROWS = 100_000


@dataclass(frozen=True)
class Reject:
    source: str
    location: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}:{self.location}: {self.message}"


@dataclass
class IngestReport:
    files: int = 0
    spans: int = 0
    request_spans: int = 0
    other_spans: int = 0
    new_requests: int = 0
    rejects: list[Reject] = field(default_factory=list)

    @property
    def duplicate_requests(self) -> int:
        return self.request_spans - self.new_requests


ProgressCallback = Callable[[int], None]


class SpanCounts(Protocol):
    """What reading a file counts: spans, request spans, other spans and rejects."""

    spans: int
    request_spans: int
    other_spans: int
    rejects: list[Reject]


def add_chunk(chunk: FileChunk, *, rows: RequestRows, report: SpanCounts, source: str) -> None:
    """A document of a trace file into `rows`: its undecodable parts and the request spans
    that cannot be mapped become rejects naming line (and span), the rest are added."""
    for error in chunk.decoded.errors:
        location = f"line {chunk.line}"
        if error.path != "$":
            location += f" {error.path}"
        report.rejects.append(Reject(source, location, error.message))
    for index, span in enumerate(chunk.decoded.spans):
        report.spans += 1
        if not rows.is_request(span):
            report.other_spans += 1
            continue
        report.request_spans += 1
        try:
            rows.add(span, source=source)
        except SpanMappingError as exc:
            location = f"line {chunk.line} span {index} ({span.span_id})"
            report.rejects.append(Reject(source, location, str(exc)))


def text_size(path: Path) -> int:
    """Bytes a trace file will yield, for progress: gzip's trailer holds the raw size."""
    size = path.stat().st_size
    if path.suffix != ".gz" or size < 4:
        return size
    with path.open("rb") as raw:
        raw.seek(-4, 2)
        return int.from_bytes(raw.read(4), "little")


def ingest_trace_files(
    paths: Sequence[Path],
    *,
    store: Store,
    mapping: SpanMapping | None = None,
    targets: TargetDirectory | None = None,
    now: datetime | None = None,
    on_progress: ProgressCallback | None = None,
) -> IngestReport:
    """Read every file, write new requests and rejects to `store`, and report counts. Spans are
    matched to `targets` (default: the targets the store has scraped)."""
    report = IngestReport()
    recorded_ts = (now or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None)
    if targets is None:
        targets = TargetDirectory.from_frame(store.read_targets().collect())
    rows = RequestRows(mapping=mapping or SpanMapping(), targets=targets)
    for path in paths:
        source = str(path)
        try:
            chunks = read_trace_file(path)
            for chunk in chunks:
                add_chunk(chunk, rows=rows, report=report, source=source)
                if len(rows) >= WRITE_BATCH_ROWS:
                    report.new_requests += store.write_requests(rows.to_frame())
                    rows = RequestRows(mapping=rows.mapping, targets=targets)
                if on_progress is not None:
                    on_progress(chunk.size_bytes)
        except (OSError, gzip.BadGzipFile, EOFError) as exc:
            report.rejects.append(Reject(source, "file", f"cannot read: {exc}"))
        report.files += 1
    report.new_requests += store.write_requests(rows.to_frame())
    if report.rejects:
        store.write_ingest_errors(rejects_frame(report.rejects, recorded_ts=recorded_ts))
    return report


def rejects_frame(rejects: list[Reject], *, recorded_ts: datetime) -> pl.DataFrame:
    """Rejects as rows of `ingest_errors` (naive UTC time; one row per source and location)."""
    if recorded_ts.tzinfo is not None:
        recorded_ts = recorded_ts.astimezone(UTC).replace(tzinfo=None)
    return pl.DataFrame(
        {
            "source": [r.source for r in rejects],
            "location": [r.location for r in rejects],
            "message": [r.message for r in rejects],
            "recorded_ts": [recorded_ts] * len(rejects),
        },
        schema=INGEST_ERRORS_SCHEMA,
    ).unique(subset=["source", "location"], keep="first", maintain_order=True)
