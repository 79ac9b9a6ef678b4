"""What an emulated fleet reports: the interface between the simulation and its wire outputs.

The simulation (virtual time, no I/O) calls a `FleetObserver` as things happen and answers
`states()` at any instant; the output layers (vLLM `/metrics`, DCGM pages, OTLP spans, fixture
folders) are observers. Times are seconds on the simulation's clock, which in fixture mode is
Unix time of the recorded day and in live mode is wall-clock Unix time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class FinishedReason(Enum):
    """vLLM's `finished_reason` label values."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """One request as the engine saw it when it finished (or failed)."""

    replica: str
    request_id: str
    conversation_id: str | None
    tenant: str | None
    arrival_s: float
    queue_s: float  # arrival -> first scheduled
    prefill_s: float  # first scheduled -> first token
    decode_s: float  # first token -> last token
    prompt_tokens: int
    cached_prompt_tokens: int  # prompt tokens served from the prefix cache
    completion_tokens: int
    max_tokens: int
    finished_reason: FinishedReason
    preemptions: int = 0

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.prefill_s

    @property
    def e2e_s(self) -> float:
        return self.queue_s + self.prefill_s + self.decode_s

    @property
    def failed(self) -> bool:
        return self.finished_reason in (FinishedReason.ERROR, FinishedReason.ABORT)


@dataclass(frozen=True, slots=True)
class EngineSteps:
    """A run of identical engine steps on one replica (the batch did not change meanwhile).

    `iterations` steps of `step_s` seconds each, with `decode_seqs` requests producing a token
    per step and `prefill_tokens` prompt tokens computed per step. vLLM's inter-token latency
    histogram gets `decode_seqs * iterations` observations of `step_s`; its iteration-tokens
    histogram gets `iterations` observations of `decode_seqs + prefill_tokens`.
    """

    replica: str
    start_s: float
    step_s: float
    iterations: int
    decode_seqs: int
    prefill_tokens: int


class ReplicaEventKind(Enum):
    STARTED = "started"  # serving; counters start from zero (a restart resets them)
    CRASHED = "crashed"  # process gone: /metrics stops answering, in-flight requests fail
    HOST_LOST = "host_lost"
    SLOWED = "slowed"  # step time multiplied by `factor`
    RECOVERED = "recovered"  # back to normal speed
    ERROR_BURST = "error_burst"  # requests fail with finished_reason=error for a while
    START_BLOCKED = "start_blocked"  # a replacement could not start (artifact registry down)
    KV_SQUEEZED = "kv_squeezed"  # usable KV blocks divided by `factor` (1: all back)


@dataclass(frozen=True, slots=True)
class ReplicaEvent:
    """`model` on a STARTED event: the model name the new process reports, when a rollout
    changed it from the placement's (None: the placement's)."""

    replica: str
    at_s: float
    kind: ReplicaEventKind
    detail: str = ""
    factor: float = 1.0
    model: str | None = None


class EngineKind(Enum):
    """The inference server a replica runs, which decides the shape of its metrics page.

    TRTLLM is trtllm-serve's own page (`trtllm_` prefix); TRTLLM_DYNAMO the early NVIDIA
    Dynamo worker page, which re-exported TensorRT-LLM's first five families as `trtllm:`.
    """

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    TRTLLM_DYNAMO = "trtllm_dynamo"
    TGI = "tgi"
    LLAMACPP = "llamacpp"


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    replica: str
    host: str
    zone: str
    model: str
    pool: str
    gpus: int
    # The replica runs on one MIG slice of this profile (e.g. "1g.10gb"), sharing its host's
    # MIG GPU with the host's other MIG replicas; gpus is then 1.
    mig_profile: str | None = None
    # The replica is a Kubernetes pod named as the replica in this namespace: its DCGM GPUs
    # carry pod, namespace and container labels, as dcgm-exporter's Kubernetes mapping writes.
    namespace: str | None = None
    engine: EngineKind = EngineKind.VLLM


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A replica's state at one instant, for gauges and GPU signals."""

    replica: str
    up: bool
    running: int
    waiting: int
    kv_usage_ratio: float  # 0-1 of KV blocks in use
    busy_ratio: float  # share of time the engine was stepping since the previous snapshot
    tokens_per_s: float  # tokens processed per second since the previous snapshot


class FleetObserver(Protocol):
    def request_finished(self, record: FinishedRequest) -> None: ...

    def engine_steps(self, record: EngineSteps) -> None: ...

    def replica_event(self, event: ReplicaEvent) -> None: ...


class FinishedRequests:
    """An observer keeping the finished requests that arrived at or after `from_s`, in the
    order they finished (a capacity check's or a test's whole record of a run)."""

    def __init__(self, *, from_s: float = -math.inf) -> None:
        self._from_s = from_s
        self.finished: list[FinishedRequest] = []

    def request_finished(self, record: FinishedRequest) -> None:
        if record.arrival_s >= self._from_s:
            self.finished.append(record)

    def engine_steps(self, record: EngineSteps) -> None:
        pass

    def replica_event(self, event: ReplicaEvent) -> None:
        pass
