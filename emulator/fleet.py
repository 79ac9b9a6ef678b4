"""The emulated fleet: replicas on hosts in zones, a router, failures, and the driver.

`FleetSimulation` advances virtual time event by event (arrivals, follow-up turns, the end of
each replica's current run of engine steps, failure actions), always taking the earliest next;
it reports to a `FleetObserver` as things happen and answers `states()` at any instant. It does
no I/O and reads no clock: the caller picks the start time and how far to run, so the same seed
and config give the same records whether it is driven in one call or in many.

Routing sees only replicas that are up (a perfect health check). Requests are refused before
any replica sees them when nothing is up (`unroutable_requests`) or their prompt does not fit
max_model_len (`rejected_requests`), as a gateway and vLLM's frontend would, and when the
gateway's admission limit is exhausted (`shed_requests`, config.admission); none reaches the
observer, and the source hears of each as refused (a retrying client may send it again).
With an admission limit, an observer that is also a `GatewayObserver` hears of every request
that reaches the gateway and what the gateway answered (emulator/gateway_metrics.py).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from servewatch.emulator.engine import ReplicaEngine
from servewatch.emulator.failures import ActionKind, FailureAction, failure_timeline
from servewatch.emulator.fleet_config import FleetConfig, RouterPolicy, RouterSpec
from servewatch.emulator.gateway_metrics import (
    MODEL_SERVER_ERROR,
    NO_ENDPOINT,
    SHED,
    GatewayObserver,
)
from servewatch.emulator.records import (
    FinishedReason,
    FinishedRequest,
    FleetObserver,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaPlacement,
    ReplicaState,
)
from servewatch.emulator.workload import RequestSource, RequestSpec, request_source

DOWN = 1 << 62
"""The load a router sees for a replica that is down: larger than any real load."""


class Router(Protocol):
    def choose(self, request: RequestSpec, loads: Sequence[int]) -> int | None:
        """Index of the replica for `request` given each replica's load (requests it holds,
        `DOWN` when it is down); None when every replica is down."""
        ...


class RoundRobinRouter:
    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RequestSpec, loads: Sequence[int]) -> int | None:
        n = len(loads)
        for _ in range(n):
            i = self._next
            self._next = i + 1 if i + 1 < n else 0
            if loads[i] < DOWN:
                return i
        return None


class LeastLoadedRouter:
    """Fewest requests held; ties go round-robin so an idle fleet is used evenly."""

    def __init__(self, replicas: int) -> None:
        self._replicas = replicas
        self._start = 0

    def choose(self, request: RequestSpec, loads: Sequence[int]) -> int | None:
        start = self._start
        self._start = start + 1 if start + 1 < self._replicas else 0
        least = min(loads)
        if least >= DOWN:
            return None
        # Of the replicas holding the least, the first at or after the rotating start.
        try:
            return loads.index(least, start)
        except ValueError:
            return loads.index(least)


def stable_hash(text: str) -> int:
    """A hash that is the same in every process (Python's str hash is salted per process)."""
    return zlib.crc32(text.encode())


class PrefixAffinityRouter:
    """Consistent hashing by conversation with bounded load.

    A conversation's turns go to the first replica clockwise of its hash on a ring of
    `virtual_nodes` points per replica, skipping replicas that are down or full: holding
    max(ceil(load_factor * mean load), min_load_cap) requests (consistent hashing with
    bounded loads, with a floor so light load never scatters conversations).
    """

    def __init__(
        self,
        replicas: Sequence[str],
        *,
        load_factor: float,
        virtual_nodes: int,
        min_load_cap: int = 1,
    ) -> None:
        ring = sorted(
            (stable_hash(f"{name}#{v}"), i)
            for i, name in enumerate(replicas)
            for v in range(virtual_nodes)
        )
        self._points = [point for point, _ in ring]
        self._owners = [owner for _, owner in ring]
        self._load_factor = load_factor
        self._min_cap = min_load_cap

    def choose(self, request: RequestSpec, loads: Sequence[int]) -> int | None:
        up_loads = [load for load in loads if load < DOWN]
        if not up_loads:
            return None
        cap = max(math.ceil(self._load_factor * (sum(up_loads) + 1) / len(up_loads)), self._min_cap)
        key = request.conversation_id or request.request_id
        owners = self._owners
        n = len(owners)
        start = bisect.bisect_left(self._points, stable_hash(key))
        for j in range(n):
            i = owners[(start + j) % n]
            if loads[i] < cap:
                return i
        return None


def make_router(spec: RouterSpec, replicas: Sequence[str]) -> Router:
    match spec.policy:
        case RouterPolicy.ROUND_ROBIN:
            return RoundRobinRouter()
        case RouterPolicy.LEAST_LOADED:
            return LeastLoadedRouter(len(replicas))
        case RouterPolicy.PREFIX_AFFINITY:
            return PrefixAffinityRouter(
                replicas,
                load_factor=spec.load_factor,
                virtual_nodes=spec.virtual_nodes,
                min_load_cap=spec.min_load_cap,
            )


class _Kind(Enum):
    ARRIVAL = 1  # an open-loop arrival
    FOLLOW_UP = 2  # the next turn of a conversation
    ACTION = 3  # a failure-timeline action
    STARTED = 4  # a replica finished its cold start


_ARRIVAL, _FOLLOW_UP, _ACTION, _STARTED = (
    _Kind.ARRIVAL,
    _Kind.FOLLOW_UP,
    _Kind.ACTION,
    _Kind.STARTED,
)


@dataclass(frozen=True)
class FleetCounters:
    """Requests the fleet refused before any replica saw them, and requests that failed."""

    rejected_requests: int
    unroutable_requests: int
    failed_requests: int
    shed_requests: int = 0


class FleetSimulation:
    """A fleet in virtual time. Times are Unix seconds; `start_s` is the first instant."""

    def __init__(
        self,
        config: FleetConfig,
        *,
        observer: FleetObserver,
        seed: int,
        start_s: float,
        source: RequestSource | None = None,
    ) -> None:
        self.config = config
        self.now_s = start_s
        self.placements: list[ReplicaPlacement] = config.placements()
        self._observer = observer
        self._request_finished = observer.request_finished
        self._engines = [
            ReplicaEngine(
                p.replica,
                config.engine,
                observer=observer,
                on_finished=functools.partial(self._finished, i),
            )
            for i, p in enumerate(self.placements)
        ]
        self._index = {p.replica: i for i, p in enumerate(self.placements)}
        # Requests each replica holds, as the router counts them; DOWN while a replica is down.
        self._loads = [0] * len(self._engines)
        self._router = make_router(config.router, [p.replica for p in self.placements])
        self._source = source or request_source(config.workload, seed=seed, start_s=start_s)
        self._error_rng = random.Random(f"{seed}:errors")  # noqa: S311 (simulation, not secrets)
        self._error_ratio: dict[int, float] = {}
        self._registry_up = True
        self._blocked: set[int] = set()
        self._generation = [0] * len(self._engines)
        # Model names of replicas a rollout moved to another version; the rest serve their own.
        self._models: dict[int, str] = {}
        # Replica run ends wait in their own small heap (at most one live entry per replica,
        # `_queued` holds its time; older entries are stale and skipped); everything else
        # (arrivals, follow-up turns, failure actions, cold starts) waits in `_heap`.
        self._queued = [math.inf] * len(self._engines)
        self._replica_heap: list[tuple[float, int]] = []
        self._heap: list[tuple[float, int, _Kind, Any]] = []
        self._seq = 0
        self._started = False
        self._rejected = 0
        self._unroutable = 0
        self._failed = 0
        self._shed = 0
        admission = config.admission
        self._admit_rps = admission.rate_rps if admission is not None else 0.0
        self._burst = admission.burst if admission is not None else 0.0
        self._tokens = self._burst
        self._tokens_s = start_s
        # Only a fleet with an admission limit has a gateway page (gateway_metrics.py).
        self._gateway = (
            observer if admission is not None and isinstance(observer, GatewayObserver) else None
        )
        self._max_prompt = config.engine.max_model_len - 1
        for engine in self._engines:
            engine.restart(start_s)
        for action in failure_timeline(config.failures, self.placements, start_s=start_s):
            self._push(action.at_s, _ACTION, action)
        first = self._source.next_arrival()
        if first is not None:
            self._push(first.arrival_s, _ARRIVAL, first)

    # -- public ----------------------------------------------------------------------------

    @property
    def counters(self) -> FleetCounters:
        return FleetCounters(self._rejected, self._unroutable, self._failed, self._shed)

    def run_until(self, t_s: float) -> None:  # noqa: PLR0912 (the event loop, one branch per kind)
        """Advance virtual time to `t_s`, reporting everything that happens up to it."""
        if t_s < self.now_s:
            raise ValueError(f"run_until({t_s}) would go back in time; now is {self.now_s}")
        if not self._started:
            self._started = True
            for p in self.placements:
                self._observer.replica_event(
                    ReplicaEvent(p.replica, self.now_s, ReplicaEventKind.STARTED, "fleet start")
                )
        heap = self._heap
        replica_heap = self._replica_heap
        engines = self._engines
        queued = self._queued
        pop = heapq.heappop
        push = heapq.heappush
        inf = math.inf
        while True:
            replica_s = replica_heap[0][0] if replica_heap else inf
            other_s = heap[0][0] if heap else inf
            # At equal times arrivals and actions go first, so a step starting at that
            # instant sees every request that arrived at it.
            if replica_s < other_s:
                if replica_s > t_s:
                    break
                at_s, i = pop(replica_heap)
                if at_s != queued[i]:
                    continue  # superseded by a later plan
                engine = engines[i]
                engine.end_run()
                at_s = queued[i] = engine.next_event_s
                if at_s != inf:
                    push(replica_heap, (at_s, i))
                continue
            if other_s > t_s:
                break
            at_s, _, kind, payload = pop(heap)
            if kind is _ARRIVAL:
                self._route(payload, at_s)
                following = self._source.next_arrival()
                if following is not None:
                    self._push(following.arrival_s, _ARRIVAL, following)
            elif kind is _FOLLOW_UP:
                self._route(payload, at_s)
            elif kind is _ACTION:
                self._apply(payload, at_s)
            else:
                i, generation, detail = payload
                self._finish_start(i, generation, detail, at_s)
        for engine in engines:
            engine.flush(t_s)
        self.now_s = t_s

    def states(self) -> list[ReplicaState]:
        """Each replica's state now; busy and token rates are since the previous call."""
        return [engine.snapshot(self.now_s) for engine in self._engines]

    # -- internals -------------------------------------------------------------------------

    def _push(self, at_s: float, kind: _Kind, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at_s, self._seq, kind, payload))

    def _requeue(self, i: int) -> None:
        at_s = self._engines[i].next_event_s
        if at_s != self._queued[i]:
            self._queued[i] = at_s
            if at_s != math.inf:
                heapq.heappush(self._replica_heap, (at_s, i))

    def _refuse(self, spec: RequestSpec, at_s: float) -> None:
        self._source.follow_up(spec, completion_tokens=0, end_s=at_s, ok=False, refused=True)

    def _admitted(self, at_s: float) -> bool:
        """Take a token from the gateway's bucket, refilled at the admission rate."""
        self._tokens = min(self._burst, self._tokens + (at_s - self._tokens_s) * self._admit_rps)
        self._tokens_s = at_s
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _route(self, spec: RequestSpec, at_s: float) -> None:
        gateway = self._gateway
        if self._admit_rps and not self._admitted(at_s):
            self._shed += 1
            if gateway is not None:
                gateway.gateway_request(self.config.model, SHED)
            self._refuse(spec, at_s)
            return
        if spec.prompt_tokens > self._max_prompt:
            self._rejected += 1
            if gateway is not None:
                gateway.gateway_request(self.config.model, MODEL_SERVER_ERROR)
            self._refuse(spec, at_s)
            return
        i = self._router.choose(spec, self._loads)
        if i is None:
            self._unroutable += 1
            if gateway is not None:
                gateway.gateway_request(self.config.model, NO_ENDPOINT)
            self._refuse(spec, at_s)
            return
        if gateway is not None:
            gateway.gateway_request(self.config.model, None)
        ratio = self._error_ratio.get(i) if self._error_ratio else None
        if ratio is not None and self._error_rng.random() < ratio:
            record = FinishedRequest(
                self._engines[i].name,
                spec.request_id,
                spec.conversation_id,
                spec.tenant,
                spec.arrival_s,
                0.0,
                0.0,
                0.0,
                spec.prompt_tokens,
                0,
                0,
                spec.max_tokens,
                FinishedReason.ERROR,
            )
            self._loads[i] += 1
            self._finished(i, spec, record, at_s)
            return
        engine = self._engines[i]
        self._loads[i] += 1
        engine.submit(spec, at_s)
        next_s = engine.next_event_s
        if next_s != self._queued[i]:  # _requeue, inlined: once per request
            self._queued[i] = next_s
            if next_s != math.inf:
                heapq.heappush(self._replica_heap, (next_s, i))

    def _finished(self, i: int, spec: RequestSpec, record: FinishedRequest, end_s: float) -> None:
        self._loads[i] -= 1
        self._request_finished(record)
        reason = record.finished_reason
        failed = reason is FinishedReason.ERROR or reason is FinishedReason.ABORT
        if failed:
            self._failed += 1
        following = self._source.follow_up(
            spec, completion_tokens=record.completion_tokens, end_s=end_s, ok=not failed
        )
        if following is not None:
            self._push(following.arrival_s, _FOLLOW_UP, following)

    def _event(
        self,
        i: int,
        at_s: float,
        kind: ReplicaEventKind,
        detail: str,
        *,
        factor: float = 1.0,
        model: str | None = None,
    ) -> None:
        self._observer.replica_event(
            ReplicaEvent(self._engines[i].name, at_s, kind, detail, factor, model)
        )

    def _take_down(self, i: int, at_s: float, kind: ReplicaEventKind, detail: str) -> None:
        engine = self._engines[i]
        self._generation[i] += 1  # a cold start in progress will not complete
        self._blocked.discard(i)
        self._event(i, at_s, kind, detail)
        if engine.up:
            engine.advance(at_s)
            engine.fail_all(at_s)
            engine.up = False
            self._loads[i] = DOWN
            self._queued[i] = math.inf

    def _begin_start(self, i: int, at_s: float, *, needs_registry: bool, detail: str) -> None:
        if self._engines[i].up:
            return
        self._generation[i] += 1
        if needs_registry and not self._registry_up:
            self._blocked.add(i)
            self._event(i, at_s, ReplicaEventKind.START_BLOCKED, "artifact registry unavailable")
            return
        ready_s = at_s + self.config.engine.cold_start_s
        self._push(ready_s, _STARTED, (i, self._generation[i], detail))

    def _finish_start(self, i: int, generation: int, detail: str, at_s: float) -> None:
        if generation != self._generation[i] or self._engines[i].up:
            return
        self._engines[i].restart(at_s)
        self._loads[i] = 0
        self._event(i, at_s, ReplicaEventKind.STARTED, detail, model=self._models.get(i))

    def _apply(self, action: FailureAction, at_s: float) -> None:  # noqa: PLR0912 (one per kind)
        indices = [self._index[name] for name in action.replicas]
        match action.kind:
            case ActionKind.CRASH:
                for i in indices:
                    self._take_down(i, at_s, ReplicaEventKind.CRASHED, action.detail)
            case ActionKind.LOSE_HOST:
                for i in indices:
                    self._take_down(i, at_s, ReplicaEventKind.HOST_LOST, action.detail)
            case ActionKind.START:
                for i in indices:
                    self._begin_start(
                        i, at_s, needs_registry=action.needs_registry, detail=action.detail
                    )
            case ActionKind.SLOW | ActionKind.RESTORE_SPEED:
                kind = (
                    ReplicaEventKind.SLOWED
                    if action.kind is ActionKind.SLOW
                    else ReplicaEventKind.RECOVERED
                )
                for i in indices:
                    engine = self._engines[i]
                    engine.advance(at_s)
                    engine.set_slow_factor(action.factor, at_s)
                    self._requeue(i)
                    self._event(i, at_s, kind, action.detail, factor=action.factor)
            case ActionKind.ERRORS_ON:
                for i in indices:
                    self._error_ratio[i] = action.factor
                    self._event(i, at_s, ReplicaEventKind.ERROR_BURST, action.detail)
            case ActionKind.ERRORS_OFF:
                for i in indices:
                    self._error_ratio.pop(i, None)
                    self._event(i, at_s, ReplicaEventKind.RECOVERED, action.detail)
            case ActionKind.ROLL_OUT:
                for i in indices:
                    self._take_down(i, at_s, ReplicaEventKind.CRASHED, action.detail)
                    self._engines[i].set_slow_factor(action.factor, at_s)
                    placement = self.placements[i]
                    if action.version:
                        self._models[i] = f"{placement.model}@{action.version}"
                    else:
                        self._models.pop(i, None)
                    self._begin_start(i, at_s, needs_registry=False, detail=action.detail)
            case ActionKind.SQUEEZE_KV:
                for i in indices:
                    engine = self._engines[i]
                    engine.advance(at_s)
                    engine.set_kv_squeeze(action.factor, at_s)
                    self._requeue(i)
                    kind = (
                        ReplicaEventKind.KV_SQUEEZED
                        if action.factor > 1
                        else ReplicaEventKind.RECOVERED
                    )
                    self._event(i, at_s, kind, action.detail, factor=action.factor)
            case ActionKind.REGISTRY_DOWN:
                self._registry_up = False
            case ActionKind.REGISTRY_UP:
                self._registry_up = True
                for i in sorted(self._blocked):
                    self._begin_start(i, at_s, needs_registry=True, detail="artifact registry back")
                self._blocked.clear()
