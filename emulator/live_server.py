"""Live endpoints of an emulated fleet: each replica's `/metrics`, each host's DCGM page and,
for a fleet with an admission limit, its gateway's endpoint-picker page.

A replica serves its page in its engine's shape (emulator/engine_pages.py): vLLM's, SGLang's,
TensorRT-LLM's (at trtllm-serve's own `/prometheus/metrics`, and at `/metrics` too), TGI's or
llama.cpp's; the target's URL names the engine's own path.

Every target is its own HTTP server on 127.0.0.1 (never another address), on the port the
configuration gives it or on a free one chosen at start. A crashed replica's server closes its
socket, so scrapes fail as they would against a dead process, and reopens on the same port
when the replica starts again; a lost host takes its DCGM server and its replicas down.

vLLM pages are encoded by prometheus-client from the fleet's collector, in the text format
0.0.4 whatever the scraper's Accept header says: prometheus-client 0.26's OpenMetrics encoder
rewrites the sample names `vllm:...` to `vllm_...` while the TYPE lines keep `vllm:`, which
would file the samples under other names. Responses are gzip-compressed when the scraper
accepts it, as vLLM's server does.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import generate_latest, gzip_accepted

from servewatch.emulator.dcgm_metrics import PAGE_CONTENT_TYPE as DCGM_CONTENT_TYPE
from servewatch.emulator.dcgm_metrics import DcgmObserver, GpuSpec
from servewatch.emulator.engine_pages import METRICS_PATH, PAGE_SHAPES, EnginePagesObserver
from servewatch.emulator.fixture_targets import TargetKind, fleet_targets
from servewatch.emulator.fixture_writer import Simulation, state_list
from servewatch.emulator.gateway_metrics import PAGE_CONTENT_TYPE as GATEWAY_CONTENT_TYPE
from servewatch.emulator.gateway_metrics import GatewayMetrics, GatewaySpec
from servewatch.emulator.records import (
    EngineKind,
    EngineSteps,
    FinishedRequest,
    ReplicaEvent,
    ReplicaPlacement,
    ReplicaState,
)
from servewatch.emulator.span_output import SpanOutput
from servewatch.emulator.vllm_metrics import PAGE_CONTENT_TYPE as VLLM_CONTENT_TYPE
from servewatch.emulator.vllm_metrics import EngineSettings, VllmMetricsObserver

LOOPBACK = "127.0.0.1"
_POLL_INTERVAL_S = 0.05  # how quickly a stopped server lets go of its socket

Render = Callable[[], bytes | None]


@dataclass(frozen=True)
class LiveTarget:
    """One served endpoint and the labels a scraper should attach to it."""

    kind: TargetKind
    name: str  # replica (engine targets), host (DCGM) or the gateway's name
    host: str
    zone: str
    port: int
    namespace: str | None = None  # a vLLM replica that is a Kubernetes pod of this namespace
    path: str = METRICS_PATH  # where the page is (the engine's own path)
    gpu_uuids: tuple[str, ...] = ()  # a replica's whole GPUs (see FixtureTarget)
    pool: str | None = None  # the gateway's pool (engine targets' pools are in the config)

    @property
    def target_id(self) -> str:
        return f"{self.kind.value}/{self.name}"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}{self.path}"

    @property
    def labels(self) -> dict[str, str]:
        if self.kind is TargetKind.GATEWAY:
            # On no host: the pool it fronts is what places it.
            return {"kind": self.kind.value} | ({} if self.pool is None else {"pool": self.pool})
        labels = {"host": self.host, "zone": self.zone}
        if self.kind is not TargetKind.DCGM and self.namespace is not None:
            # As a Kubernetes service discovery relabels a pod: pod and namespace, which
            # servewatch reads as the replica `<namespace>/<pod>`.
            labels = {"pod": self.name, "namespace": self.namespace, **labels}
        elif self.kind is not TargetKind.DCGM:
            labels = {"replica": self.name, **labels}
        if self.gpu_uuids:
            labels["gpu_uuids"] = ",".join(self.gpu_uuids)
        return labels


class _Handler(BaseHTTPRequestHandler):
    server: _PageHTTPServer

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in self.server.paths:
            self.send_error(404, f"only {' and '.join(self.server.paths)} are served")
            return
        page = self.server.render()
        if page is None:
            # Between a crash and the server closing its socket: answer as a dying process.
            self.send_error(503, "target is down")
            return
        headers = {"Content-Type": self.server.content_type}
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            page = gzip.compress(page, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self.send_response(200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """Scrapes are not worth a log line each."""


class _PageHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, port: int, render: Render, content_type: str, paths: tuple[str, ...]
    ) -> None:
        self.render = render
        self.content_type = content_type
        self.paths = paths
        super().__init__((LOOPBACK, port), _Handler)


class _Endpoint:
    """One target's server: started, stopped and restarted on the same port."""

    def __init__(
        self,
        port: int,
        render: Render,
        content_type: str,
        paths: tuple[str, ...] = (METRICS_PATH,),
    ) -> None:
        self.port = port
        self._render = render
        self._content_type = content_type
        self._paths = paths
        self._server: _PageHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        if self._server is not None:
            return
        try:
            server = _PageHTTPServer(self.port, self._render, self._content_type, self._paths)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot listen on {LOOPBACK}:{self.port} for an emulated target: {exc}"
            ) from exc
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL_S},
            name=f"emulated-target-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()


class LiveFleetServer:
    """Serves a fleet's pages over HTTP and keeps them current; a fleet observer itself.

    `ports` maps target ids (`vllm/<replica>`, `sglang/<replica>`, ..., `dcgm/<host>`) to
    fixed ports; others get free
    ports at `start`. Call `update` with the simulation's states after every advance; it also
    opens and closes endpoints as replicas and hosts go up and down. Finished requests are
    passed on to `spans` when given (live-mode OTLP export).
    """

    def __init__(
        self,
        placements: Iterable[ReplicaPlacement],
        *,
        started_s: float,
        engine: EngineSettings | None = None,
        gpu: GpuSpec | None = None,
        ports: Mapping[str, int] | None = None,
        spans: SpanOutput | None = None,
        gateway: GatewaySpec | None = None,
    ) -> None:
        placement_list = list(placements)
        self.gateway = GatewayMetrics(gateway) if gateway is not None else None
        self.engine = engine or EngineSettings()
        self.vllm = VllmMetricsObserver(
            [p for p in placement_list if p.engine is EngineKind.VLLM],
            started_s=started_s,
            settings=self.engine,
        )
        others = [p for p in placement_list if p.engine is not EngineKind.VLLM]
        self.engines = EnginePagesObserver(others, started_s=started_s, settings=self.engine)
        self._engine_replicas = frozenset(p.replica for p in others)
        self._paths: dict[str, str] = {}
        self.dcgm = DcgmObserver(
            placement_list,
            started_s=started_s,
            spec=gpu,
            gpu_memory_utilization=self.engine.gpu_memory_utilization,
        )
        self.spans = spans
        self._targets = fleet_targets(placement_list, gateway=gateway)
        known = {t.target_id for t in self._targets}
        fixed = dict(ports or {})
        unknown = sorted(set(fixed) - known)
        if unknown:
            raise ValueError(f"ports given for unknown targets {unknown}; known: {sorted(known)}")
        for target_id, port in fixed.items():
            if not 0 < port < 65536:
                raise ValueError(f"port for {target_id} must be in 1-65535, got {port}")
        self._lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}
        for target in self._targets:
            paths: tuple[str, ...] = (METRICS_PATH,)
            if target.kind is TargetKind.VLLM:
                render = self._vllm_renderer(target.name)
                content_type = VLLM_CONTENT_TYPE
            elif target.kind is TargetKind.DCGM:
                render = self._dcgm_renderer(target.name)
                content_type = DCGM_CONTENT_TYPE
            elif target.kind is TargetKind.GATEWAY and self.gateway is not None:
                render = self.gateway.page
                content_type = GATEWAY_CONTENT_TYPE
            else:
                render = self._engine_renderer(target.name)
                shape = PAGE_SHAPES[target.engine or EngineKind.VLLM]
                content_type = shape.content_type
                paths = tuple(dict.fromkeys((shape.path, METRICS_PATH)))
            self._paths[target.target_id] = paths[0]
            self._endpoints[target.target_id] = _Endpoint(
                fixed.get(target.target_id, 0), render, content_type, paths
            )
        self._started = False

    def _vllm_renderer(self, replica: str) -> Render:
        registry = self.vllm.registry(replica)

        def render() -> bytes | None:
            if not self.vllm.is_up(replica):
                return None
            return generate_latest(registry)

        return render

    def _dcgm_renderer(self, host: str) -> Render:
        return lambda: self.dcgm.page(host)

    def _engine_renderer(self, replica: str) -> Render:
        return lambda: self.engines.page(replica)

    @property
    def targets(self) -> list[LiveTarget]:
        """Every target with its port (ports of never-started targets are 0)."""
        return [
            LiveTarget(
                kind=t.kind,
                name=t.name,
                host=t.host,
                zone=t.zone,
                port=self._endpoints[t.target_id].port,
                namespace=t.namespace,
                path=self._paths[t.target_id],
                gpu_uuids=t.gpu_uuids,
                pool=t.pool if t.kind is TargetKind.GATEWAY else None,
            )
            for t in self._targets
        ]

    def file_sd(self) -> list[dict[str, Any]]:
        """The targets as a Prometheus file_sd list, one group per target."""
        out: list[dict[str, Any]] = []
        for t in self.targets:
            labels = {"job": t.kind.value, **t.labels}
            if t.path != METRICS_PATH:
                labels["__metrics_path__"] = t.path
            out.append({"targets": [t.address], "labels": labels})
        return out

    def serving(self, target_id: str) -> bool:
        return self._endpoints[target_id].serving

    def start(self) -> None:
        """Open every target that is up (ports chosen now stay the target's for good)."""
        with self._lock:
            self._started = True
            self._reconcile()

    def stop(self) -> None:
        with self._lock:
            self._started = False
            for endpoint in self._endpoints.values():
                endpoint.stop()

    def __enter__(self) -> LiveFleetServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _reconcile(self) -> None:
        if not self._started:
            return
        for target in self._targets:
            endpoint = self._endpoints[target.target_id]
            if target.kind is TargetKind.VLLM:
                up = self.vllm.is_up(target.name)
            elif target.kind is TargetKind.DCGM:
                up = self.dcgm.is_up(target.name)
            elif target.kind is TargetKind.GATEWAY:
                up = True  # the gateway outlives every replica behind it
            else:
                up = self.engines.is_up(target.name)
            if up:
                endpoint.start()
            else:
                endpoint.stop()

    def update(self, now_s: float, states: Iterable[ReplicaState]) -> None:
        """The simulation's snapshot at `now_s`: gauges, GPU readings, endpoints up or down."""
        snapshot = list(states)
        self.vllm.set_states(snapshot)
        self.engines.set_states(snapshot)
        self.dcgm.sample(now_s, snapshot)
        if self.gateway is not None:
            self.gateway.set_states(snapshot)
        with self._lock:
            self._reconcile()

    # GatewayObserver (the fleet calls it only when it has an admission limit)
    def gateway_request(self, model: str, error_code: str | None) -> None:
        if self.gateway is not None:
            self.gateway.gateway_request(model, error_code)

    # FleetObserver
    def request_finished(self, record: FinishedRequest) -> None:
        if record.replica in self._engine_replicas:
            self.engines.request_finished(record)
        else:
            self.vllm.request_finished(record)
        if self.spans is not None:
            self.spans.request_finished(record)

    def engine_steps(self, record: EngineSteps) -> None:
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
        if self.spans is not None:
            self.spans.replica_event(event)
        with self._lock:
            self._reconcile()


def run_live(
    simulation: Simulation,
    server: LiveFleetServer,
    *,
    clock: Callable[[], float],
    wait: Callable[[float], bool],
    tick_s: float = 0.25,
) -> None:
    """Keep the simulation at wall-clock time and the endpoints current until `wait` says stop.

    `clock` gives Unix seconds; `wait(tick_s)` blocks up to `tick_s` and returns True to stop
    (`threading.Event().wait` does both).
    """
    if tick_s <= 0:
        raise ValueError(f"tick_s must be positive, got {tick_s}")
    while True:
        now_s = clock()
        simulation.run_until(now_s)
        server.update(now_s, state_list(simulation.states()))
        if wait(tick_s):
            return
