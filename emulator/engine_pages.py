"""The metrics pages of emulated replicas that run an engine other than vLLM.

Each replica's placement names its engine (`EngineKind`); this module picks the page shape for
it (emulator/sglang_metrics.py, trtllm_metrics.py, tgi_metrics.py, llamacpp_metrics.py) and
keeps every such replica's metric state current from the simulation's records, as
`VllmMetricsObserver` does for vLLM replicas: the same finished requests and engine steps, so
two replicas that saw the same work report the same TTFT, queue time, token counts and cache
hits, each in its own engine's names, units and buckets. The path and content type each engine
serves its page with are here too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from servewatch.emulator.llamacpp_metrics import PAGE_CONTENT_TYPE as LLAMACPP_CONTENT_TYPE
from servewatch.emulator.llamacpp_metrics import LlamacppReplicaMetrics
from servewatch.emulator.records import (
    EngineKind,
    EngineSteps,
    FinishedRequest,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaPlacement,
    ReplicaState,
)
from servewatch.emulator.sglang_metrics import SglangReplicaMetrics
from servewatch.emulator.tgi_metrics import PAGE_CONTENT_TYPE as TGI_CONTENT_TYPE
from servewatch.emulator.tgi_metrics import TgiReplicaMetrics
from servewatch.emulator.trtllm_metrics import PROMETHEUS_PATH, TrtllmReplicaMetrics
from servewatch.emulator.vllm_metrics import PAGE_CONTENT_TYPE as CLIENT_CONTENT_TYPE
from servewatch.emulator.vllm_metrics import EngineSettings

METRICS_PATH = "/metrics"


@dataclass(frozen=True)
class PageShape:
    """Where and how an engine serves its page: `path` is the engine's own, and every
    emulated engine also answers on /metrics."""

    path: str
    content_type: str


PAGE_SHAPES = {
    EngineKind.VLLM: PageShape(METRICS_PATH, CLIENT_CONTENT_TYPE),
    EngineKind.SGLANG: PageShape(METRICS_PATH, CLIENT_CONTENT_TYPE),
    EngineKind.TRTLLM: PageShape(PROMETHEUS_PATH, CLIENT_CONTENT_TYPE),
    EngineKind.TRTLLM_DYNAMO: PageShape(METRICS_PATH, CLIENT_CONTENT_TYPE),
    EngineKind.TGI: PageShape(METRICS_PATH, TGI_CONTENT_TYPE),
    EngineKind.LLAMACPP: PageShape(METRICS_PATH, LLAMACPP_CONTENT_TYPE),
}


class EngineReplicaMetrics(Protocol):
    """One engine process's metric state: fed by records, rendered as its page's bytes."""

    def observe_request(self, record: FinishedRequest) -> None: ...

    def observe_steps(self, record: EngineSteps) -> None: ...

    def page(self, state: ReplicaState | None) -> bytes: ...


def replica_metrics(
    engine: EngineKind,
    *,
    model_name: str,
    created_s: float,
    settings: EngineSettings,
    gpus: int = 1,
) -> EngineReplicaMetrics:
    """A fresh process's metric state for `engine` (vLLM has its own observer)."""
    match engine:
        case EngineKind.SGLANG:
            return SglangReplicaMetrics(
                model_name=model_name, created_s=created_s, settings=settings, gpus=gpus
            )
        case EngineKind.TRTLLM | EngineKind.TRTLLM_DYNAMO:
            return TrtllmReplicaMetrics(
                model_name=model_name,
                created_s=created_s,
                settings=settings,
                gpus=gpus,
                dynamo=engine is EngineKind.TRTLLM_DYNAMO,
            )
        case EngineKind.TGI:
            return TgiReplicaMetrics(
                model_name=model_name, created_s=created_s, settings=settings, gpus=gpus
            )
        case EngineKind.LLAMACPP:
            return LlamacppReplicaMetrics(
                model_name=model_name, created_s=created_s, settings=settings, gpus=gpus
            )
        case EngineKind.VLLM:
            raise ValueError(
                "vLLM replicas are rendered by VllmMetricsObserver, not by engine_pages; "
                f"allowed here: {[e.value for e in EngineKind if e is not EngineKind.VLLM]}"
            )


class EnginePagesObserver:
    """The pages of a fleet's non-vLLM replicas, kept current from simulation records.

    The same lifecycle as `VllmMetricsObserver`: `STARTED` starts a new process (counters from
    zero), `CRASHED` and `HOST_LOST` take the page away until the next start. Records of
    replicas it does not hold are an error, so a misrouted record cannot pass unnoticed.
    Safe to call from the simulation's thread while HTTP threads render pages.
    """

    def __init__(
        self,
        placements: Iterable[ReplicaPlacement],
        *,
        started_s: float,
        settings: EngineSettings | None = None,
    ) -> None:
        self.settings = settings or EngineSettings()
        self.placements = {p.replica: p for p in placements}
        vllm = sorted(r for r, p in self.placements.items() if p.engine is EngineKind.VLLM)
        if vllm:
            raise ValueError(f"vLLM replicas {vllm} belong to VllmMetricsObserver")
        self._lock = threading.Lock()
        self._metrics = {
            replica: self._fresh(p, p.model, started_s) for replica, p in self.placements.items()
        }
        self._up = dict.fromkeys(self.placements, True)
        self._states: dict[str, ReplicaState] = {}

    def _fresh(
        self, placement: ReplicaPlacement, model: str, created_s: float
    ) -> EngineReplicaMetrics:
        return replica_metrics(
            placement.engine,
            model_name=model,
            created_s=created_s,
            settings=self.settings,
            gpus=placement.gpus,
        )

    def _replica(self, replica: str) -> EngineReplicaMetrics:
        try:
            return self._metrics[replica]
        except KeyError:
            raise KeyError(
                f"record for replica {replica!r}, which this observer does not hold "
                f"(known: {sorted(self._metrics)})"
            ) from None

    def request_finished(self, record: FinishedRequest) -> None:
        with self._lock:
            self._replica(record.replica).observe_request(record)

    def engine_steps(self, record: EngineSteps) -> None:
        with self._lock:
            self._replica(record.replica).observe_steps(record)

    def replica_event(self, event: ReplicaEvent) -> None:
        with self._lock:
            self._replica(event.replica)
            placement = self.placements[event.replica]
            if event.kind is ReplicaEventKind.STARTED:
                self._metrics[event.replica] = self._fresh(
                    placement, event.model or placement.model, event.at_s
                )
                self._up[event.replica] = True
            elif event.kind in (ReplicaEventKind.CRASHED, ReplicaEventKind.HOST_LOST):
                self._up[event.replica] = False

    def set_states(self, states: Iterable[ReplicaState]) -> None:
        """The simulation's latest snapshot (states of replicas not held are ignored)."""
        with self._lock:
            for state in states:
                if state.replica in self._metrics:
                    self._states[state.replica] = state

    def is_up(self, replica: str) -> bool:
        with self._lock:
            return self._is_up(replica)

    def _is_up(self, replica: str) -> bool:
        state = self._states.get(replica)
        return self._up[replica] and (state is None or state.up)

    def page(self, replica: str) -> bytes | None:
        """The replica's page now, or None while it is down."""
        with self._lock:
            metrics = self._replica(replica)
            if not self._is_up(replica):
                return None
            return metrics.page(self._states.get(replica))
