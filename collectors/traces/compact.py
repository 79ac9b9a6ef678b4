"""Compaction: an OpenTelemetry Collector's time-partitioned OTLP/JSON files turned into hourly
Parquet partitions of request rows (`servewatch compact`).

The Collector's file and S3 exporters write OTLP/JSON lines (optionally gzip) under folders
such as `year=YYYY/month=MM/day=DD/hour=HH/`; the folders only say when a batch was written,
so every file below the input folder is read whatever its place. Spans are mapped to request
rows exactly as trace ingest maps them (`SpanMapping`, `TargetDirectory`), then staged and
merged into the partition of their end time (`store.partitions`), each (trace_id, span_id)
once.

Resumable and idempotent: a manifest in the output folder lists the input files compacted,
with their size and modification time. A run reads only files that are new or changed (a
Collector appends to its current file), in groups of about `GROUP_BYTES`; each group's
partitions are renamed into place before the manifest names its files. Interrupted anywhere,
the next run reads again at most the group that was under way, and the merge drops what is
already stored. A malformed line or span is reported with file and line and skipped.
"""

from __future__ import annotations

import gzip
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import polars as pl

from servewatch.collectors.traces.ingest import ProgressCallback, Reject, add_chunk, text_size
from servewatch.collectors.traces.otlp_json import read_trace_file
from servewatch.collectors.traces.request_spans import RequestRows, SpanMapping
from servewatch.collectors.traces.span_identity import TargetDirectory
from servewatch.pipeline.partitions import (
    EMPTY_MANIFEST,
    MANIFEST_FILE,
    FileState,
    Manifest,
    ManifestError,
    manifest_json,
    parse_manifest,
)
from servewatch.store import PartitionWriter, PartitionWritten

# Input files the Collector's exporters write (`.json` for the file exporter, `.jsonl` and
# their gzip forms elsewhere).
INPUT_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
# Request rows decoded before they are staged: bounds the decoder's Python objects.
STAGE_BATCH_ROWS = 200_000
# Input text read before its rows are merged into the partitions and the manifest moves: what
# an interruption costs at most, and what the staging folder holds.
GROUP_BYTES = 2 * 1024**3


class CompactError(ValueError):
    """The compaction cannot run as asked: input or output folder wrong, manifest unreadable."""


@dataclass
class CompactReport:
    """What one run did: files found and read, spans decoded, rows per partition, rejects."""

    files_found: int = 0
    files_read: int = 0
    spans: int = 0
    request_spans: int = 0
    other_spans: int = 0
    partitions: list[PartitionWritten] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)

    @property
    def new_rows(self) -> int:
        return sum(p.new_rows for p in self.partitions)


def find_inputs(folder: Path) -> list[FileState]:
    """Every trace file below `folder` (hidden files and folders skipped), by path."""
    if not folder.is_dir():
        raise CompactError(f"input {folder}: not a folder; give the Collector's output folder")
    found: list[FileState] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or not name.endswith(INPUT_SUFFIXES):
                continue
            path = Path(root) / name
            stat = path.stat()
            found.append(FileState(str(path.resolve()), stat.st_size, stat.st_mtime_ns))
    return found


def read_manifest(out: Path) -> Manifest:
    path = out / MANIFEST_FILE
    if not path.exists():
        return EMPTY_MANIFEST
    try:
        return parse_manifest(path.read_bytes(), where=str(path))
    except ManifestError as exc:
        raise CompactError(f"{exc}; move it away to compact every input again") from exc


def write_manifest(out: Path, manifest: Manifest) -> None:
    """Written beside and renamed over the old one: a crash leaves the old or the new."""
    path = out / MANIFEST_FILE
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_bytes(manifest_json(manifest))
    partial.replace(path)


def groups(files: Sequence[FileState], *, limit_bytes: int) -> Iterator[list[FileState]]:
    """`files` in order, cut into runs of at most `limit_bytes` (a larger file alone)."""
    group: list[FileState] = []
    size = 0
    for f in files:
        if group and size + f.size_bytes > limit_bytes:
            yield group
            group, size = [], 0
        group.append(f)
        size += f.size_bytes
    if group:
        yield group


def compact_traces(
    source: Path,
    out: Path,
    *,
    now: datetime,
    mapping: SpanMapping | None = None,
    targets: TargetDirectory | None = None,
    group_bytes: int = GROUP_BYTES,
    on_progress: ProgressCallback | None = None,
    on_files: Callable[[int], None] | None = None,
) -> CompactReport:
    """Compact the new or changed trace files below `source` into the partitions below `out`
    (see the module text). Rows are stamped `ingested_ts = now` (naive UTC). Spans are matched
    to `targets` (none by default: the replica is what the span's resource names).
    `on_files` is told the bytes of text to read, before reading; `on_progress` the bytes
    read as they are."""
    if out.exists() and not out.is_dir():
        raise CompactError(f"--out {out}: is a file; give the partitions folder")
    if out.resolve() == source.resolve() or out.resolve().is_relative_to(source.resolve()):
        raise CompactError(f"--out {out}: must not be the input folder or inside it")
    found = find_inputs(source)
    manifest = read_manifest(out)
    pending = manifest.pending(found)
    report = CompactReport(files_found=len(found))
    if on_files is not None:
        on_files(sum(text_size(Path(f.name)) for f in pending))
    if not pending:
        return report
    out.mkdir(parents=True, exist_ok=True)
    # An interrupted run's staged rows: its files are not in the manifest, so they are read
    # again now.
    for stale in out.glob(".staging-*"):
        shutil.rmtree(stale, ignore_errors=True)
    rows = RequestRows(mapping=mapping or SpanMapping(), targets=targets or TargetDirectory())
    staging = out / f".staging-{os.getpid()}"
    with PartitionWriter(out, staging=staging) as writer:
        for group in groups(pending, limit_bytes=group_bytes):
            for state in group:
                rows = _read_file(
                    Path(state.name),
                    rows,
                    writer=writer,
                    report=report,
                    now=now,
                    on_progress=on_progress,
                )
            _stage(rows, writer, now)
            rows = RequestRows(mapping=rows.mapping, targets=rows.targets)
            report.partitions.extend(writer.merge())
            manifest = manifest.with_files(group)
            write_manifest(out, manifest)
    shutil.rmtree(staging, ignore_errors=True)
    return report


def _read_file(
    path: Path,
    rows: RequestRows,
    *,
    writer: PartitionWriter,
    report: CompactReport,
    now: datetime,
    on_progress: ProgressCallback | None,
) -> RequestRows:
    """Decode one file into `rows`, staging them whenever enough piled up."""
    source = str(path)
    try:
        for chunk in read_trace_file(path):
            add_chunk(chunk, rows=rows, report=report, source=source)
            if len(rows) >= STAGE_BATCH_ROWS:
                _stage(rows, writer, now)
                rows = RequestRows(mapping=rows.mapping, targets=rows.targets)
            if on_progress is not None:
                on_progress(chunk.size_bytes)
    except (OSError, gzip.BadGzipFile, EOFError) as exc:
        report.rejects.append(Reject(source, "file", f"cannot read: {exc}"))
    report.files_read += 1
    return rows


def _stage(rows: RequestRows, writer: PartitionWriter, now: datetime) -> None:
    if not len(rows):
        return
    stamped = rows.to_frame().with_columns(
        pl.lit(now, dtype=pl.Datetime("us")).alias("ingested_ts")
    )
    writer.stage(stamped)
