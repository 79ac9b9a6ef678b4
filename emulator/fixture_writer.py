"""Fixture folders: an emulated fleet's wire outputs recorded in virtual time.

Layout (docs/emulator-outputs.md describes it for readers):

    manifest.json                            what the folder holds (below)
    pages/vllm/<replica>/<unix_ms>.prom.gz   one vLLM /metrics page per replica per scrape
    pages/<kind>/<replica>/<unix_ms>.prom.gz the same for replicas of another engine
                                             (kind sglang, trtllm, tgi or llamacpp)
    pages/dcgm/<host>/<unix_ms>.prom.gz      one DCGM exporter page per host per scrape
    pages/gateway/<pool>/<unix_ms>.prom.gz   the gateway's endpoint-picker page per scrape,
                                             only for a fleet with an admission limit
    spans.jsonl.gz                           llm_request spans as OTLP JSON lines

Pages are the exact bytes a live endpoint would serve at that instant (Prometheus text 0.0.4),
gzip-compressed; the file name is the scrape time in Unix milliseconds. A target that is down
at a scrape (crashed replica, lost host) has no page for it, as a live scrape would fail.
The manifest says `"emulated": true` and lists targets with their replica/host/zone labels,
the time range, the scrape interval, every injected event and the caller's ground truth.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from servewatch.emulator.dcgm_metrics import DcgmObserver, GpuSpec
from servewatch.emulator.engine_pages import EnginePagesObserver
from servewatch.emulator.fixture_files import FixtureFiles, InlineFixtureFiles, SpanSink
from servewatch.emulator.fixture_targets import (
    PAGES_DIR,
    SAFE_NAME,
    FixtureError,
    TargetKind,
    fleet_targets,
)
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig
from servewatch.emulator.gateway_metrics import GatewayMetrics, GatewaySpec
from servewatch.emulator.records import (
    EngineKind,
    EngineSteps,
    FinishedRequest,
    ReplicaEvent,
    ReplicaPlacement,
    ReplicaState,
)
from servewatch.emulator.vllm_metrics import PAGE_CONTENT_TYPE, EngineSettings, VllmMetricsObserver

FORMAT = "servewatch.fixture"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SPANS_NAME = "spans.jsonl.gz"
PAGE_SUFFIX = ".prom.gz"
DEFAULT_SCRAPE_INTERVAL_S = 60.0  # day-long recordings; live scraping keeps 15 s


def _iso(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, tz=UTC).isoformat().replace("+00:00", "Z")


def _event_json(event: ReplicaEvent, placement: ReplicaPlacement | None) -> dict[str, Any]:
    return {
        "at_s": event.at_s,
        "at": _iso(event.at_s),
        "kind": event.kind.value,
        "replica": event.replica,
        "host": placement.host if placement else None,
        "zone": placement.zone if placement else None,
        "detail": event.detail,
        "factor": event.factor,
    }


class FixtureWriter:
    """Records an emulated fleet into a new fixture folder.

    Use it as the simulation's observer, call `scrape` at every scrape instant with the
    simulation's states, then `close` to write the manifest. `record_fixture` does the loop.
    Pages and spans are compressed and written by a helper process (`background`, the default;
    emulator/fixture_files.py) or in this one: either way they are complete once `close`
    returns, and the same bytes.
    """

    def __init__(
        self,
        folder: Path,
        placements: Iterable[ReplicaPlacement],
        *,
        start_s: float,
        scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
        engine: EngineSettings | None = None,
        gpu: GpuSpec | None = None,
        seed: int = 0,
        spans_per_line: int = 512,
        compresslevel: int = 3,
        background: bool = True,
        conversation_ids: bool = False,
        gateway: GatewaySpec | None = None,
    ) -> None:
        if not (scrape_interval_s > 0 and math.isfinite(scrape_interval_s)):
            raise FixtureError(
                f"scrape_interval_s must be a positive number, got {scrape_interval_s}"
            )
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise FixtureError(f"fixture folder {folder} exists and is not empty; pick a new one")
        self.folder = folder
        self.placement_list = list(placements)
        if not self.placement_list:
            raise FixtureError("a fixture needs at least one replica placement")
        self.placements = {p.replica: p for p in self.placement_list}
        self.targets = fleet_targets(self.placement_list, gateway=gateway)
        self.gateway = GatewayMetrics(gateway) if gateway is not None else None
        self.start_s = start_s
        self.scrape_interval_s = scrape_interval_s
        self.engine = engine or EngineSettings()
        self.compresslevel = compresslevel
        vllm = [p for p in self.placement_list if p.engine is EngineKind.VLLM]
        others = [p for p in self.placement_list if p.engine is not EngineKind.VLLM]
        self.vllm = VllmMetricsObserver(vllm, started_s=start_s, settings=self.engine)
        self.engines = EnginePagesObserver(others, started_s=start_s, settings=self.engine)
        self._engine_replicas = frozenset(p.replica for p in others)
        self.dcgm = DcgmObserver(
            self.placement_list,
            started_s=start_s,
            spec=gpu,
            gpu_memory_utilization=self.engine.gpu_memory_utilization,
        )
        folder.mkdir(parents=True, exist_ok=True)
        for target in self.targets:
            (folder / target.pages_dir).mkdir(parents=True, exist_ok=True)
        # Each target's page folder as bytes ending in a separator: a page's path is this plus
        # its file name (a hundred thousand paths a day, each a Path otherwise).
        self._page_dirs = [
            os.fsencode(folder / target.pages_dir) + os.fsencode(os.sep) for target in self.targets
        ]
        sink = FixtureFiles if background else InlineFixtureFiles
        self._files = sink(
            folder / SPANS_NAME,
            settings=self.engine,
            compresslevel=compresslevel,
            placements=self.placement_list,
            seed=seed,
            spans_per_line=spans_per_line,
            conversation_ids=conversation_ids,
        )
        self.spans: SpanSink = self._files.spans
        # The observer's engine_steps is the vLLM metrics' own (DCGM and spans ignore steps)
        # when every replica runs vLLM: millions of records a day skip a call.
        self.engine_steps: Callable[[EngineSteps], None] = (
            self._mixed_engine_steps if others else self.vllm.engine_steps
        )
        self.events: list[dict[str, Any]] = []
        self.pages_written = 0
        self.scrapes = 0
        self._last_scrape_s: float | None = None
        self._closed = False

    # FleetObserver
    def request_finished(self, record: FinishedRequest) -> None:
        if record.replica in self._engine_replicas:
            self.engines.request_finished(record)
        else:
            self.vllm.request_finished(record)
        self.spans.request_finished(record)

    # GatewayObserver (the fleet calls it only when it has an admission limit)
    def gateway_request(self, model: str, error_code: str | None) -> None:
        if self.gateway is not None:
            self.gateway.gateway_request(model, error_code)

    def _mixed_engine_steps(self, record: EngineSteps) -> None:
        if record.replica in self._engine_replicas:
            self.engines.engine_steps(record)
        else:
            self.vllm.engine_steps(record)

    def replica_event(self, event: ReplicaEvent) -> None:
        if event.replica in self._engine_replicas:
            self.engines.replica_event(event)
        else:
            self.vllm.replica_event(event)
        self.dcgm.replica_event(event)
        self.spans.replica_event(event)
        self.events.append(_event_json(event, self.placements.get(event.replica)))

    def scrape(self, at_s: float, states: Iterable[ReplicaState]) -> int:
        """Write one page per target that is up at `at_s`; returns how many were written."""
        if self._closed:
            raise FixtureError("scrape after close")
        if self._last_scrape_s is not None and at_s <= self._last_scrape_s:
            raise FixtureError(f"scrape times must increase: {at_s} after {self._last_scrape_s}")
        snapshot = list(states)
        self.vllm.set_states(snapshot)
        self.engines.set_states(snapshot)
        self.dcgm.sample(at_s, snapshot)
        if self.gateway is not None:
            self.gateway.set_states(snapshot)
        stamp = f"{round(at_s * 1000)}{PAGE_SUFFIX}".encode()
        written = 0
        for target, page_dir in zip(self.targets, self._page_dirs, strict=True):
            path = page_dir + stamp
            if target.kind is TargetKind.VLLM:
                # Rendered where it is written: the values are a tenth of the text.
                values = self.vllm.page_values(target.name)
                if values is None:
                    continue
                self._files.vllm_page(path, *values)
            else:
                if target.kind is TargetKind.DCGM:
                    page = self.dcgm.page(target.name)
                elif target.kind is TargetKind.GATEWAY and self.gateway is not None:
                    page = self.gateway.page()
                else:
                    page = self.engines.page(target.name)
                if page is None:
                    continue
                self._files.page(path, page)
            written += 1
        self._last_scrape_s = at_s
        self.scrapes += 1
        self.pages_written += written
        return written

    def close(
        self,
        *,
        end_s: float,
        ground_truth: Mapping[str, Any] | None = None,
        description: str = "",
        generator: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Flush the spans and write the manifest; returns the manifest."""
        if self._closed:
            raise FixtureError("fixture already closed")
        if end_s < self.start_s:
            raise FixtureError(f"end_s {end_s} is before start_s {self.start_s}")
        self._closed = True
        self._files.close()
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "emulated": True,
            "description": description,
            "time_range": {
                "start_s": self.start_s,
                "end_s": end_s,
                "start": _iso(self.start_s),
                "end": _iso(end_s),
            },
            "scrape_interval_s": self.scrape_interval_s,
            "pages": {
                "layout": f"{PAGES_DIR}/<kind>/<name>/<unix_ms>{PAGE_SUFFIX}",
                "content_type": PAGE_CONTENT_TYPE,
                "scrapes": self.scrapes,
                "count": self.pages_written,
            },
            "targets": [target.to_json() for target in self.targets],
            "spans": {
                "files": [SPANS_NAME],
                "format": "otlp-json-lines",
                "count": self.spans.spans_emitted,
            },
            "engine": {
                "max_model_len": self.engine.max_model_len,
                "block_size": self.engine.block_size,
                "num_gpu_blocks": self.engine.num_gpu_blocks,
                "gpu_memory_utilization": self.engine.gpu_memory_utilization,
            },
            "events": self.events,
            "ground_truth": dict(ground_truth or {}),
            "generator": dict(generator or {}),
        }
        text = json.dumps(manifest, indent=2, sort_keys=False, allow_nan=False)
        (self.folder / MANIFEST_NAME).write_text(text + "\n", encoding="utf-8")
        return manifest


class Simulation(Protocol):
    """What `record_fixture` needs of a fleet simulation."""

    def run_until(self, t_s: float) -> None: ...

    def states(self) -> Iterable[ReplicaState] | Mapping[str, ReplicaState]: ...


def state_list(states: Iterable[ReplicaState] | Mapping[str, ReplicaState]) -> list[ReplicaState]:
    if isinstance(states, Mapping):
        return list(states.values())
    return list(states)


def scrape_times(start_s: float, end_s: float, interval_s: float) -> list[float]:
    """Scrape instants start, start + interval, ... up to and including end (no float drift)."""
    count = math.floor((end_s - start_s) / interval_s + 1e-9)
    return [start_s + k * interval_s for k in range(count + 1)]


def record_fixture(
    simulation: Simulation,
    writer: FixtureWriter,
    *,
    end_s: float,
    ground_truth: Mapping[str, Any] | None = None,
    description: str = "",
    generator: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run `simulation` (whose observer is `writer`) to `end_s`, scraping at every interval."""
    for t_s in scrape_times(writer.start_s, end_s, writer.scrape_interval_s):
        simulation.run_until(t_s)
        writer.scrape(t_s, state_list(simulation.states()))
    return writer.close(
        end_s=end_s, ground_truth=ground_truth, description=description, generator=generator
    )


def record_fleet(
    config: FleetConfig,
    folder: Path,
    *,
    start_s: float,
    end_s: float,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
    seed: int = 0,
    ground_truth: Mapping[str, Any] | None = None,
    description: str = "",
    generator: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Simulate `config` from `start_s` to `end_s` in virtual time into a new fixture folder
    (its engine settings on every page); returns the manifest."""
    writer = FixtureWriter(
        folder,
        config.placements(),
        start_s=start_s,
        scrape_interval_s=scrape_interval_s,
        engine=EngineSettings.from_engine(config.engine),
        seed=seed,
        conversation_ids=config.conversation_ids,
        gateway=GatewaySpec.of(config),
    )
    simulation = FleetSimulation(config, observer=writer, seed=seed, start_s=start_s)
    return record_fixture(
        simulation,
        writer,
        end_s=end_s,
        ground_truth=ground_truth,
        description=description,
        generator=generator,
    )


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a fixture folder, checked to be an emulated servewatch fixture."""
    path = folder / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise FixtureError(f"{path}: no manifest; is {folder} a fixture folder?") from exc
    except json.JSONDecodeError as exc:
        raise FixtureError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FixtureError(f"{path}: not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FixtureError(
            f"{path}: format_version {manifest.get('format_version')!r}, "
            f"this reader knows {FORMAT_VERSION}"
        )
    return manifest


def iter_pages(folder: Path, target_id: str) -> Iterator[tuple[float, bytes]]:
    """(scrape time in Unix seconds, page bytes) of one target, in time order."""
    kind, _, name = target_id.partition("/")
    if kind not in {k.value for k in TargetKind} or not SAFE_NAME.match(name):
        kinds = "|".join(k.value for k in TargetKind)
        raise FixtureError(f"target id {target_id!r} is not <{kinds}>/<name>")
    pages_dir = folder / PAGES_DIR / kind / name
    stamped: list[tuple[int, Path]] = []
    for path in pages_dir.iterdir():
        stem = path.name.removesuffix(PAGE_SUFFIX)
        if stem == path.name or not stem.isdigit():
            raise FixtureError(f"{path}: not a page file (<unix_ms>{PAGE_SUFFIX})")
        stamped.append((int(stem), path))
    for unix_ms, path in sorted(stamped):
        with gzip.open(path, "rb") as stream:
            yield unix_ms / 1000, stream.read()
