"""Fixture recordings: live scrapes and received spans written as a fixture folder.

The folder has the layout `collectors.fixture_folder` reads (and the emulator writes), so
`servewatch replay` takes a recording unchanged. Differences from an emulated fixture are in
the manifest only: `"emulated": false`, `"recorded": true`, target ids are the live targets'
ids (their URLs), so replayed series match a live `servewatch scrape` of the same fleet.

Pages are named by their round's instant on the scrape grid (start + k * interval, integer
milliseconds), which is the timeline replay rebuilds; a target that failed a round has no page
for it. Spans are OTLP/JSON lines, one line per accepted export: protobuf bodies are converted
with hex ids and integer enums, as the OpenTelemetry Collector's file exporter writes them.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import re
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from servewatch.collectors.exposition import page_bytes
from servewatch.collectors.fixture_folder import (
    FORMAT,
    PAGE_SUFFIX,
    SUPPORTED_VERSIONS,
    FixtureError,
)
from servewatch.collectors.targets import Target

MANIFEST_NAME = "manifest.json"
SPANS_NAME = "spans.jsonl.gz"
PAGES_DIR = "pages"
PAGE_CONTENT_TYPE = "text/plain; version=0.0.4"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _iso(unix_ms: int) -> str:
    return datetime.fromtimestamp(unix_ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def _hex_ids(obj: Any) -> None:
    """Protobuf's generic JSON mapping writes ids as base64; OTLP/JSON wants hex."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                obj[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(obj, list):
        for item in obj:
            _hex_ids(item)


def otlp_json_line(body: bytes, *, protobuf: bool) -> bytes:
    """One export body as one OTLP/JSON line (no trailing newline).

    Raises ValueError if the body does not decode; the receiver has refused such bodies already.
    """
    if protobuf:
        request = ExportTraceServiceRequest.FromString(body)
        doc: Any = json_format.MessageToDict(request, use_integers_for_enums=True)
        _hex_ids(doc)
    else:
        doc = orjson.loads(body)
    return orjson.dumps(doc)


def _page_folder_names(targets: Sequence[Target]) -> list[str]:
    """A page folder per target, `<kind>/<replica or host>`, made unique and path-safe."""
    names: list[str] = []
    used: set[str] = set()
    for index, target in enumerate(targets):
        stem = _UNSAFE.sub("_", target.replica or target.host or f"target-{index}").strip("._")
        stem = stem or f"target-{index}"
        name, n = f"{target.kind.value}/{stem}", 2
        while name in used:
            name, n = f"{target.kind.value}/{stem}-{n}", n + 1
        used.add(name)
        names.append(name)
    return names


class FixtureRecording:
    """A fixture folder being recorded. `write_page` per target per round, `write_export` per
    accepted OTLP export (from any thread), then `close` writes the manifest.

    Until `close`, the folder has no manifest, so an interrupted process leaves a folder that
    replay refuses rather than misreads; `close` is what a clean stop calls.
    """

    def __init__(
        self,
        folder: Path,
        targets: Sequence[Target],
        *,
        start_ms: int,
        scrape_interval_ms: int,
        compresslevel: int = 6,
    ) -> None:
        if scrape_interval_ms <= 0:
            raise FixtureError(f"scrape interval must be positive, got {scrape_interval_ms} ms")
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise FixtureError(f"{folder} exists and is not an empty folder; pick a new one")
        self.folder = folder
        self.targets = tuple(targets)
        self.start_ms = start_ms
        self.scrape_interval_ms = scrape_interval_ms
        self.compresslevel = compresslevel
        self.page_dirs = {
            t.target_id: f"{PAGES_DIR}/{name}"
            for t, name in zip(self.targets, _page_folder_names(self.targets), strict=True)
        }
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for page_dir in self.page_dirs.values():
                (folder / page_dir).mkdir(parents=True, exist_ok=True)
            # mtime=0 keeps the gzip header free of the recording time.
            self._spans_gzip = gzip.GzipFile(
                folder / SPANS_NAME, mode="wb", compresslevel=compresslevel, mtime=0
            )
        except OSError as exc:
            raise FixtureError(f"cannot write the recording to {folder}: {exc}") from exc
        self._spans = io.BufferedWriter(self._spans_gzip)
        self._lock = threading.Lock()
        self.rounds = 0
        self.last_round_ms: int | None = None
        self.pages = 0
        self.failed_scrapes = 0
        self.exports = 0
        self.spans = 0
        self.openmetrics_pages = 0
        self._closed = False

    def round_ms(self, k: int) -> int:
        """The instant of round `k` on the scrape grid."""
        return self.start_ms + k * self.scrape_interval_ms

    def write_page(
        self, target: Target, round_ms: int, body: str | None, *, openmetrics: bool = False
    ) -> None:
        """The page `target` served in the round at `round_ms`; None when the scrape failed.

        Replay reads pages as text format 0.0.4, which a recorder asks for; a server that
        answers OpenMetrics anyway is counted in the manifest (`pages.openmetrics`).
        """
        if self._closed:
            raise FixtureError("page written after the recording was closed")
        if (round_ms - self.start_ms) % self.scrape_interval_ms:
            raise FixtureError(f"{round_ms} is not on the scrape grid of this recording")
        if self.last_round_ms != round_ms:
            if self.last_round_ms is not None and round_ms < self.last_round_ms:
                raise FixtureError(f"rounds must go forward: {round_ms} after {self.last_round_ms}")
            self.last_round_ms = round_ms
            self.rounds += 1
        if body is None:
            self.failed_scrapes += 1
            return
        path = self.folder / self.page_dirs[target.target_id] / f"{round_ms}{PAGE_SUFFIX}"
        data = gzip.compress(page_bytes(body), compresslevel=self.compresslevel, mtime=0)
        path.write_bytes(data)
        self.pages += 1
        self.openmetrics_pages += openmetrics

    def write_export(self, body: bytes, *, protobuf: bool, spans: int) -> None:
        """One accepted export (decompressed body), as an OTLP/JSON line."""
        line = otlp_json_line(body, protobuf=protobuf)
        with self._lock:
            if self._closed:
                return  # an export racing the stop: the recording has ended
            self._spans.write(line + b"\n")
            self.exports += 1
            self.spans += spans

    def close(self, *, stopped_ms: int, description: str = "") -> dict[str, Any]:
        """Flush the spans and write the manifest; returns it."""
        with self._lock:
            if self._closed:
                raise FixtureError("recording already closed")
            self._closed = True
            self._spans.close()
        end_ms = self.last_round_ms if self.last_round_ms is not None else self.start_ms
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "format_version": SUPPORTED_VERSIONS[-1],
            "emulated": False,
            "recorded": True,
            "description": description,
            # The scrape timeline replay rebuilds: first to last round.
            "time_range": {
                "start_s": self.start_ms / 1000,
                "end_s": end_ms / 1000,
                "start": _iso(self.start_ms),
                "end": _iso(end_ms),
            },
            "recording": {"started": _iso(self.start_ms), "stopped": _iso(stopped_ms)},
            "scrape_interval_s": self.scrape_interval_ms / 1000,
            "pages": {
                "layout": f"{PAGES_DIR}/<kind>/<name>/<unix_ms>{PAGE_SUFFIX}",
                "content_type": PAGE_CONTENT_TYPE,
                "scrapes": self.rounds,
                "count": self.pages,
                "failed": self.failed_scrapes,
                "openmetrics": self.openmetrics_pages,
            },
            "targets": [self._target_json(t) for t in self.targets],
            "spans": {
                "files": [SPANS_NAME],
                "format": "otlp-json-lines",
                "count": self.spans,
                "exports": self.exports,
            },
        }
        text = json.dumps(manifest, indent=2, allow_nan=False)
        (self.folder / MANIFEST_NAME).write_text(text + "\n", encoding="utf-8")
        return manifest

    def _target_json(self, target: Target) -> dict[str, Any]:
        labels = {
            name: value
            for name, value in (
                ("replica", target.replica),
                ("host", target.host),
                ("zone", target.zone),
            )
            if value is not None
        }
        return {
            "id": target.target_id,
            "kind": target.kind.value,
            "job": target.kind.value,
            "url": target.url,
            "labels": labels,
            "model": target.model,
            "pool": target.pool,
            "gpus": target.gpus,
            "pages": self.page_dirs[target.target_id],
        }
