"""Recorded fixture folders: a manifest, gzip-compressed exposition pages, OTLP span files.

The layout (written by the emulator's fixture mode and by `servewatch record`):

    manifest.json
    pages/<kind>/<name>/<unix_ms>.prom.gz     one page per target per scrape
    spans.jsonl.gz                            OTLP JSON lines (files listed in the manifest)

A target with no page at a scrape time was not answering then; replay records that scrape as
failed, as a live scrape of a dead target would be.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servewatch.collectors.exposition import page_text
from servewatch.collectors.metric_ingest import Page
from servewatch.collectors.targets import Target, TargetKind

FORMAT = "servewatch.fixture"
SUPPORTED_VERSIONS = (1,)
PAGE_SUFFIX = ".prom.gz"


class FixtureError(ValueError):
    """The folder is not a readable fixture; the message says which file and what is wrong."""


@dataclass(frozen=True)
class FixtureTarget:
    target: Target
    pages_dir: Path


@dataclass(frozen=True)
class Fixture:
    folder: Path
    manifest: dict[str, Any]
    targets: tuple[FixtureTarget, ...]
    scrape_times: tuple[datetime, ...]
    span_files: tuple[Path, ...]

    @property
    def emulated(self) -> bool:
        return bool(self.manifest.get("emulated", False))


def _naive_utc(unix_s: float) -> datetime:
    return datetime.fromtimestamp(unix_s, tz=UTC).replace(tzinfo=None)


def open_fixture(folder: Path) -> Fixture:
    path = folder / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FixtureError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise FixtureError(f"{path}: not valid JSON: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise FixtureError(f"{path}: format is {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("format_version") not in SUPPORTED_VERSIONS:
        raise FixtureError(
            f"{path}: format_version {manifest.get('format_version')!r} is not one of "
            f"{SUPPORTED_VERSIONS}"
        )
    try:
        start_s = float(manifest["time_range"]["start_s"])
        end_s = float(manifest["time_range"]["end_s"])
        interval_s = float(manifest["scrape_interval_s"])
        targets = tuple(_target(folder, entry) for entry in manifest["targets"])
        span_files = tuple(folder / name for name in manifest.get("spans", {}).get("files", []))
    except (KeyError, TypeError, ValueError) as exc:
        raise FixtureError(f"{path}: missing or malformed field: {exc}") from exc
    if interval_s <= 0 or end_s < start_s:
        raise FixtureError(f"{path}: time_range and scrape_interval_s do not make a timeline")
    count = int((end_s - start_s) // interval_s) + 1
    # Integer milliseconds, as the page file names are, so times match exactly.
    start_ms, interval_ms = round(start_s * 1000), round(interval_s * 1000)
    times = tuple(_naive_utc((start_ms + i * interval_ms) / 1000) for i in range(count))
    return Fixture(folder, manifest, targets, times, span_files)


def _target(folder: Path, entry: dict[str, Any]) -> FixtureTarget:
    labels = entry.get("labels", {})
    target_id = str(entry["id"])
    target = Target(
        target_id=target_id,
        kind=TargetKind(entry["kind"]),
        url=f"fixture:{target_id}",
        replica=labels.get("replica"),
        host=labels.get("host"),
        zone=labels.get("zone"),
        model=entry.get("model"),
        pool=entry.get("pool"),
        gpus=entry.get("gpus"),
    )
    return FixtureTarget(target=target, pages_dir=folder / str(entry["pages"]))


def iter_fixture_pages(fixture: Fixture) -> Iterator[Page]:
    """Every (target, scrape time) of the fixture as a Page, in time order; a missing page
    is a failed scrape."""
    for scrape_ts in fixture.scrape_times:
        unix_ms = round(scrape_ts.replace(tzinfo=UTC).timestamp() * 1000)
        for entry in fixture.targets:
            path = entry.pages_dir / f"{unix_ms}{PAGE_SUFFIX}"
            try:
                body = page_text(gzip.decompress(path.read_bytes()))
            except FileNotFoundError:
                yield Page(entry.target, scrape_ts, None, error="no page recorded: target down")
                continue
            except (OSError, EOFError) as exc:
                yield Page(entry.target, scrape_ts, None, error=f"unreadable page {path}: {exc}")
                continue
            yield Page(entry.target, scrape_ts, body, openmetrics=False)
