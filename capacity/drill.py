"""Failure drill: a candidate fleet simulated through its named failure, judged phase by phase.

Seed 000 closes with a verification plan (remove one host under a matched workload; measure
ready capacity, routing skew, retries, queue age and useful completions; watch the replacement
warm up). A drill runs that plan in the emulator, on the fleet the recommendation would buy:
the fitted engine (or a fleet config's), the candidate's hosts and zones, the pool's router,
driven at the requirement's demand by clients that retry, through four phases:

1. steady: the healthy fleet (after a warm-up that is not judged);
2. failed: the worst unit of the named kind is lost (the host or zone holding the most
   replicas); the survivors carry everything through the recovery interval, with no
   replacement counted; a stated backlog (queued and retried work) lands at the failure;
3. replacement: the lost replicas start again (`replacement_startup_s`, cold), or never when a
   startup dependency is out too (the registry);
4. recovered: the replacements serve.

Each attempt a client makes is judged by the SLO (a refused or failed attempt never meets
it; an attempt still unfinished when the run ends neither), in the phase it arrived in. The
drill holds when every phase's attainment reaches the target and the queue is back at its
steady level within the drain bound (the recovery interval unless stated).

It does no I/O and reads no clock: the same fleet, spec and seed give the same result.

Size: over 500 lines on purpose: the drill's phases, their judges and its verdict read one
timeline of one simulated fleet.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

from servewatch.capacity.figure import fmt
from servewatch.capacity.knee_search import nearest_rank_quantile
from servewatch.capacity.placement import FailureUnit
from servewatch.emulator.clients import AttemptOutcome, RetryingClients, RetryPolicy
from servewatch.emulator.engine_params import EngineParams
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import (
    AdmissionSpec,
    FleetConfig,
    RouterSpec,
    SloSpec,
    TopologySpec,
)
from servewatch.emulator.forwarding_source import ForwardingSource
from servewatch.emulator.ground_truth import meets_slo
from servewatch.emulator.records import FinishedRequest, FinishedRequests, ReplicaPlacement
from servewatch.emulator.workload import RequestSource, RequestSpec, WorkloadSpec, request_source

DRILL_START_S = 1_700_000_000.0
WARMUP_S = 60.0
SAMPLE_S = 10.0
MINUTE_S = 60.0
UNLIMITED_S = 1e9
# Unfinished attempts are waited for this long after the last arrival before they count bad.
GRACE_S = 120.0

_FAILURE_KIND = {
    FailureUnit.REPLICA: FailureKind.REPLICA_CRASH,
    FailureUnit.HOST: FailureKind.HOST_LOSS,
    FailureUnit.ZONE: FailureKind.ZONE_LOSS,
}


def judged_slo(
    ttft_limit_s: float | None,
    tpot_limit_s: float | None,
    target_ratio: float,
    *,
    ttft_offset_s: float,
) -> SloSpec:
    """The SLO simulated requests are judged by: the TTFT limit less the time spent outside
    the engine (nothing meets it when that is all of it), an absent limit unlimited."""
    ttft_s = UNLIMITED_S if ttft_limit_s is None else ttft_limit_s - ttft_offset_s
    return SloSpec(
        ttft_s=max(ttft_s, 1e-9),
        tpot_s=UNLIMITED_S if tpot_limit_s is None else tpot_limit_s,
        target_ratio=target_ratio,
    )


class DrillWorkload(Protocol):
    """Requests to drive a drill with, at a total rate over a window (a `SampledMix`, say)."""

    def source(
        self, rate_rps: float, *, seed: int, start_s: float, until_s: float
    ) -> RequestSource: ...


@dataclass(frozen=True)
class ConfiguredWorkload:
    """A fleet config's workload (tenants, conversations, lengths) at the drill's rate."""

    spec: WorkloadSpec

    def source(
        self, rate_rps: float, *, seed: int, start_s: float, until_s: float
    ) -> RequestSource:
        return request_source(
            self.spec.with_rate(rate_rps), seed=seed, start_s=start_s, until_s=until_s
        )


@dataclass(frozen=True)
class DrillFleet:
    """What is drilled: the engine, where its replicas sit, the router and the requests."""

    engine: EngineParams
    topology: TopologySpec
    router: RouterSpec
    workload: DrillWorkload
    # TTFT spent outside the engine (the HTTP server, the router): taken off the TTFT limit,
    # as the knee search does (knee_search.check_model measures it).
    ttft_offset_s: float = 0.0


@dataclass(frozen=True)
class DrillSpec:
    """The drill's demand, failure, SLO, timeline and clients."""

    demand_rps: float  # what arrives at the fleet in total, headroom included
    failure_unit: FailureUnit
    ttft_limit_s: float | None
    tpot_limit_s: float | None
    target_ratio: float
    recovery_interval_s: float
    replacement_startup_s: float
    steady_s: float = 300.0
    after_s: float = 300.0
    retries: RetryPolicy = field(default_factory=RetryPolicy)
    admission_rps: float | None = None
    replacement_blocked: bool = False  # a startup dependency is out: no replacement starts
    backlog_requests: int = 0
    drain_bound_s: float | None = None  # default: the recovery interval
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {
            "demand_rps": self.demand_rps > 0,
            "recovery_interval_s": self.recovery_interval_s > 0,
            "replacement_startup_s": self.replacement_startup_s >= 0,
            "steady_s": self.steady_s > 0,
            "after_s": self.after_s > 0,
            "target_ratio": 0 < self.target_ratio < 1,
            "backlog_requests": self.backlog_requests >= 0,
            "admission_rps": self.admission_rps is None or self.admission_rps > 0,
            "drain_bound_s": self.drain_bound_s is None or self.drain_bound_s >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"drill: {name} is {getattr(self, name)!r}; out of range")
        if self.ttft_limit_s is None and self.tpot_limit_s is None:
            raise ValueError("drill: needs a TTFT or a TPOT limit to judge requests by")

    @property
    def drain_limit_s(self) -> float:
        return self.recovery_interval_s if self.drain_bound_s is None else self.drain_bound_s

    def slo(self, *, ttft_offset_s: float) -> SloSpec:
        return judged_slo(
            self.ttft_limit_s, self.tpot_limit_s, self.target_ratio, ttft_offset_s=ttft_offset_s
        )


class DrillPhase(Enum):
    STEADY = "steady"
    FAILED = "failed"
    REPLACEMENT = "replacement"
    RECOVERED = "recovered"


@dataclass(frozen=True)
class PhaseStats:
    """One phase's numbers; times are seconds after the failure."""

    phase: DrillPhase
    from_s: float
    to_s: float
    attempts: int
    attainment_ratio: float
    ttft_p95_s: float
    tpot_p95_s: float
    ready_replicas_min: int
    routing_skew_ratio: float  # max / mean requests served per replica that served
    retries: int
    refused: int  # shed at the gateway, or nothing up or free
    failed: int
    unfinished: int
    effective_arrival_rps: float  # every attempt, retries included
    queue_depth_max: int
    oldest_queue_s: float  # the longest any attempt waited to be scheduled
    useful_per_min: float  # distinct requests completed, a retried one once
    demand_per_min: float

    def holds(self, target_ratio: float) -> bool:
        return self.attainment_ratio >= target_ratio


@dataclass(frozen=True)
class DrillMinute:
    """One minute of the timeline, `minute` counted from the failure (negative before)."""

    minute: int
    attempts: int
    attainment_ratio: float
    useful: int
    ready_replicas: int
    queue_depth_max: int
    retries: int
    refused: int


@dataclass(frozen=True)
class DrillResult:
    spec: DrillSpec
    hosts: int
    replicas: int
    lost: str  # what the failure took, e.g. "host host-0 (2 replicas)"
    phases: tuple[PhaseStats, ...]
    minutes: tuple[DrillMinute, ...]
    drain_s: float | None  # failure until the queue is back at its steady level; None: never
    recover_s: float | None  # failure until attainment stays at target; None: never
    holds: bool
    failed_phase: DrillPhase | None
    failed_minute: int | None

    def verdict(self) -> str:
        head = f"{self.hosts} hosts ({self.replicas} replicas), {self.lost} lost"
        if self.holds:
            return (
                f"{head}: holds; every phase meets {self.spec.target_ratio:.0%} "
                f"(lowest {min(p.attainment_ratio for p in self.phases):.1%}), backlog drained "
                f"in {fmt(self.drain_s or 0.0)} s"
            )
        first = next((p for p in self.phases if p.phase is self.failed_phase), None)
        where = (
            f" in phase {first.phase.value} ({first.attainment_ratio:.1%} against "
            f"{self.spec.target_ratio:.0%})"
            if first is not None and not first.holds(self.spec.target_ratio)
            else ""
        )
        minute = f", first at minute {self.failed_minute:+d}" if self.failed_minute else ""
        drain = (
            "the backlog never drains"
            if self.drain_s is None
            else f"backlog drained in {fmt(self.drain_s)} s"
        )
        worst = min(self.phases, key=lambda p: p.attainment_ratio)
        return (
            f"{head}: fails{where}{minute}; lowest attainment {worst.attainment_ratio:.1%} in "
            f"{worst.phase.value}; {drain} (bound {fmt(self.spec.drain_limit_s)} s)"
        )

    def markdown_lines(self, title: str) -> list[str]:
        """The verdict and the phase table, as the decision record and `drill` print them."""
        lines = [
            f"{title}: {self.verdict()}.",
            "",
            (
                "| phase | from s | to s | attainment | p95 TTFT s | p95 TPOT s "
                "| ready replicas | skew | retries | refused | queue max | oldest queue s "
                "| useful/min | demand/min |"
            ),
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {p.phase.value} | {fmt(p.from_s)} | {fmt(p.to_s)} | {p.attainment_ratio:.1%} "
            f"| {fmt(p.ttft_p95_s)} | {fmt(p.tpot_p95_s)} | {p.ready_replicas_min} "
            f"| {fmt(p.routing_skew_ratio)} | {p.retries} | {p.refused} | {p.queue_depth_max} "
            f"| {fmt(p.oldest_queue_s)} | {fmt(p.useful_per_min)} | {fmt(p.demand_per_min)} |"
            for p in self.phases
        ]
        return lines

    def to_json(self) -> dict[str, Any]:
        def clean(value: float | None) -> float | None:
            return None if value is None or not math.isfinite(value) else round(value, 6)

        return {
            "hosts": self.hosts,
            "replicas": self.replicas,
            "lost": self.lost,
            "holds": self.holds,
            "verdict": self.verdict(),
            "failed_phase": None if self.failed_phase is None else self.failed_phase.value,
            "failed_minute": self.failed_minute,
            "drain_s": clean(self.drain_s),
            "recover_s": clean(self.recover_s),
            "demand_rps": self.spec.demand_rps,
            "phases": [
                {
                    key: (
                        value.value
                        if isinstance(value, Enum)
                        else clean(value)
                        if isinstance(value, float)
                        else value
                    )
                    for key, value in vars(phase).items()
                }
                for phase in self.phases
            ],
            "minutes": [vars(minute) for minute in self.minutes],
        }


def _worst_unit(unit: FailureUnit, placements: Sequence[ReplicaPlacement]) -> tuple[str, int]:
    """The unit of that kind holding the most replicas (the first such by name), and its size."""
    if unit is FailureUnit.REPLICA:
        return placements[0].replica, 1
    key = "host" if unit is FailureUnit.HOST else "zone"
    sizes = Counter(getattr(p, key) for p in placements)
    name = min(sizes, key=lambda n: (-sizes[n], n))
    return name, sizes[name]


class _Burst:
    """`count` requests of `workload` arriving within a second of `at_s` (a stated backlog)."""

    def __init__(self, workload: DrillWorkload, *, count: int, at_s: float, seed: int) -> None:
        self._inner = workload.source(count * 1000.0, seed=seed, start_s=at_s, until_s=at_s + 1)
        self._left = count

    def next_arrival(self) -> RequestSpec | None:
        if self._left <= 0:
            return None
        spec = self._inner.next_arrival()
        if spec is None:
            return None
        self._left -= 1
        return spec._replace(request_id=f"backlog-{spec.request_id}")


class _Merged(ForwardingSource):
    """Two arrival streams in time order; follow-ups go to the first (the backlog has none)."""

    def __init__(self, main: RequestSource, burst: _Burst) -> None:
        super().__init__(main)
        self._main = main
        self._burst = burst
        self._next_main = main.next_arrival()
        self._next_burst = burst.next_arrival()

    def next_arrival(self) -> RequestSpec | None:
        a, b = self._next_main, self._next_burst
        if a is None and b is None:
            return None
        if b is None or (a is not None and a.arrival_s <= b.arrival_s):
            self._next_main = self._main.next_arrival()
            return a
        self._next_burst = self._burst.next_arrival()
        return b


class SentLog(ForwardingSource):
    """A source wrapper that logs every attempt sent (request id, arrival), retries and turns
    included: what arrived, finished or not, so an attempt still queued at the end counts."""

    def __init__(self, source: RequestSource) -> None:
        super().__init__(source)
        self.sent: list[tuple[str, float]] = []

    def _log(self, spec: RequestSpec | None) -> RequestSpec | None:
        if spec is not None:
            self.sent.append((spec.request_id, spec.arrival_s))
        return spec

    def next_arrival(self) -> RequestSpec | None:
        return self._log(self._source.next_arrival())

    def follow_up(
        self,
        finished: RequestSpec,
        *,
        completion_tokens: int,
        end_s: float,
        ok: bool,
        refused: bool = False,
    ) -> RequestSpec | None:
        return self._log(
            super().follow_up(
                finished, completion_tokens=completion_tokens, end_s=end_s, ok=ok, refused=refused
            )
        )


def run_sampled(
    sim: FleetSimulation, *, start_s: float, stop_s: float
) -> list[tuple[float, int, int]]:
    """Advance `sim` to `stop_s` in `SAMPLE_S` steps: at each, waiting requests and replicas up."""
    samples: list[tuple[float, int, int]] = []
    t_s = start_s
    while t_s < stop_s:
        t_s = min(t_s + SAMPLE_S, stop_s)
        sim.run_until(t_s)
        states = sim.states()
        samples.append((t_s, sum(s.waiting for s in states), sum(s.up for s in states)))
    return samples


@dataclass(frozen=True)
class _Marks:
    """The drill's timeline in Unix seconds of virtual time."""

    start_s: float
    fail_s: float
    back_s: float  # the recovery interval ends: replacements may start
    ready_s: float  # replacements serve (inf when blocked)
    end_s: float  # the last arrival

    @classmethod
    def of(cls, spec: DrillSpec) -> _Marks:
        start_s = DRILL_START_S
        fail_s = start_s + WARMUP_S + spec.steady_s
        back_s = fail_s + spec.recovery_interval_s
        ready_s = math.inf if spec.replacement_blocked else back_s + spec.replacement_startup_s
        end_s = (back_s if spec.replacement_blocked else ready_s) + spec.after_s
        return cls(start_s, fail_s, back_s, ready_s, end_s)

    def phases(self, unit: FailureUnit) -> list[tuple[DrillPhase, float, float]]:
        judged_s = self.start_s + WARMUP_S
        if unit is FailureUnit.NONE:
            return [(DrillPhase.STEADY, judged_s, self.end_s)]
        found = [
            (DrillPhase.STEADY, judged_s, self.fail_s),
            (DrillPhase.FAILED, self.fail_s, self.back_s),
            (DrillPhase.REPLACEMENT, self.back_s, min(self.ready_s, self.end_s)),
        ]
        if self.ready_s < self.end_s:
            found.append((DrillPhase.RECOVERED, self.ready_s, self.end_s))
        return found


@dataclass(frozen=True)
class _Judged:
    """One attempt a client sent: when, whether it met the SLO, how it ended (None: never)."""

    arrival_s: float
    good: bool
    retry: bool
    outcome: AttemptOutcome | None
    record: FinishedRequest | None


@dataclass(frozen=True)
class _Run:
    attempts: tuple[_Judged, ...]  # in arrival order
    served_end_s: tuple[float, ...]  # when each served attempt ended
    samples: tuple[tuple[float, int, int], ...]  # time, backlog (waiting + retrying), up
    lost: str


def _failures(
    spec: DrillSpec, placements: Sequence[ReplicaPlacement], marks: _Marks
) -> tuple[tuple[FailureSpec, ...], str]:
    if spec.failure_unit is FailureUnit.NONE:
        return (), "nothing"
    name, size = _worst_unit(spec.failure_unit, placements)
    at_s = marks.fail_s - marks.start_s
    found = [
        FailureSpec(
            _FAILURE_KIND[spec.failure_unit],
            at_s=at_s,
            target=name,
            duration_s=spec.recovery_interval_s,
        )
    ]
    if spec.replacement_blocked:
        found.append(FailureSpec(FailureKind.REGISTRY_OUTAGE, at_s=at_s))
    return tuple(found), f"{spec.failure_unit.value} {name} ({size} replica{'s' * (size != 1)})"


def _simulate(fleet: DrillFleet, spec: DrillSpec, marks: _Marks) -> _Run:
    placements = fleet.topology.placements(model="drill", pool="drill")
    failures, lost = _failures(spec, placements, marks)
    source: RequestSource = fleet.workload.source(
        spec.demand_rps, seed=spec.seed, start_s=marks.start_s, until_s=marks.end_s
    )
    if spec.backlog_requests:
        burst = _Burst(
            fleet.workload, count=spec.backlog_requests, at_s=marks.fail_s, seed=spec.seed
        )
        source = _Merged(source, burst)
    policy = spec.retries
    if spec.admission_rps is not None:
        policy = replace(policy, retry_after_s=max(policy.retry_after_s, 1.0))
    clients = RetryingClients(source, policy, seed=spec.seed)
    sent = SentLog(clients)
    config = FleetConfig(
        model="drill",
        pool="drill",
        topology=fleet.topology,
        engine=replace(fleet.engine, cold_start_s=spec.replacement_startup_s),
        router=fleet.router,
        workload=WorkloadSpec(),
        failures=failures,
        admission=None if spec.admission_rps is None else AdmissionSpec(spec.admission_rps),
    )
    records = FinishedRequests()
    sim = FleetSimulation(
        config, observer=records, seed=spec.seed, start_s=marks.start_s, source=sent
    )
    waits = run_sampled(sim, start_s=marks.start_s, stop_s=marks.end_s + GRACE_S)
    # A retry waiting out its backoff is backlog too: the storm hides there.
    backoffs = sorted((a.end_s, a.retry_at_s) for a in clients.attempts if a.retry_at_s is not None)
    samples = tuple(
        (t, waiting + sum(1 for ended, again in backoffs if ended <= t < again), up)
        for t, waiting, up in waits
    )
    slo = spec.slo(ttft_offset_s=fleet.ttft_offset_s)
    served = {(r.request_id, r.arrival_s): r for r in records.finished}
    ends = {(a.request_id, a.arrival_s): a for a in clients.attempts}
    attempts = []
    for request_id, arrival_s in sorted(sent.sent, key=lambda sent: sent[1]):
        if arrival_s >= marks.end_s:
            continue
        attempt = ends.get((request_id, arrival_s))
        record = served.get((request_id, arrival_s))
        outcome = None if attempt is None else attempt.outcome
        attempts.append(
            _Judged(
                arrival_s=arrival_s,
                good=record is not None
                and outcome is AttemptOutcome.SERVED
                and meets_slo(record, slo),
                retry=attempt is not None and attempt.attempt > 0,
                outcome=outcome,
                record=record,
            )
        )
    served_end_s = tuple(
        sorted(a.end_s for a in clients.attempts if a.outcome is AttemptOutcome.SERVED)
    )
    return _Run(tuple(attempts), served_end_s, samples, lost)


def _arrival(attempt: _Judged) -> float:
    return attempt.arrival_s


def _window(run: _Run, from_s: float, to_s: float) -> dict[str, Any]:
    """Every measure of the attempts arriving in [from_s, to_s) and the samples taken then."""
    # Attempts are in arrival order and served ends sorted: a window is a slice of each.
    rows = run.attempts[
        bisect.bisect_left(run.attempts, from_s, key=_arrival) : bisect.bisect_left(
            run.attempts, to_s, key=_arrival
        )
    ]
    done = [a.record for a in rows if a.record is not None and a.outcome is AttemptOutcome.SERVED]
    per_replica = Counter(r.replica for r in done)
    window = [s for s in run.samples if from_s <= s[0] < to_s]
    return {
        "attempts": len(rows),
        "attainment_ratio": sum(a.good for a in rows) / len(rows) if rows else 1.0,
        "ttft_p95_s": nearest_rank_quantile([r.ttft_s for r in done], 0.95),
        "tpot_p95_s": nearest_rank_quantile(
            [r.decode_s / (r.completion_tokens - 1) for r in done if r.completion_tokens > 1],
            0.95,
        ),
        "ready_replicas_min": min((s[2] for s in window), default=0),
        "routing_skew_ratio": (
            max(per_replica.values()) * len(per_replica) / sum(per_replica.values())
            if per_replica
            else math.nan
        ),
        "retries": sum(a.retry for a in rows),
        "refused": sum(a.outcome is AttemptOutcome.REFUSED for a in rows),
        "failed": sum(a.outcome is AttemptOutcome.FAILED for a in rows),
        "unfinished": sum(a.outcome is None for a in rows),
        "queue_depth_max": max((s[1] for s in window), default=0),
        "oldest_queue_s": max((r.queue_s for r in done), default=0.0),
        "useful": bisect.bisect_left(run.served_end_s, to_s)
        - bisect.bisect_left(run.served_end_s, from_s),
    }


def _drain_s(run: _Run, marks: _Marks, replicas: int) -> float | None:
    """Failure until the backlog has drained: the first sample after the backlog's peak at
    which it is back near its steady level (twice the steady peak, or two waiting requests
    per replica: a queue sampled every 10 s spikes that much with no backlog at all); 0 when
    it never rose above that; None when it never falls back within the run."""
    steady = max((s[1] for s in run.samples if s[0] < marks.fail_s), default=0)
    level = 2 * max(steady, replicas)
    judged = [s for s in run.samples if marks.fail_s <= s[0] < marks.end_s]
    if not judged or max(s[1] for s in judged) <= level:
        return 0.0
    peak = max(range(len(judged)), key=lambda i: (judged[i][1], -i))
    return next((t_s - marks.fail_s for t_s, depth, _ in judged[peak:] if depth <= level), None)


def _first_failed_minute(
    minutes: Sequence[DrillMinute], phases: Sequence[PhaseStats], spec: DrillSpec
) -> int | None:
    """The first minute under target from the start of the first phase that fails."""
    failing = [p for p in phases if not p.holds(spec.target_ratio)]
    from_s = failing[0].from_s if failing else 0.0
    return next(
        (
            m.minute
            for m in minutes
            if m.minute * MINUTE_S >= from_s and m.attainment_ratio < spec.target_ratio
        ),
        None,
    )


def run_drill(fleet: DrillFleet, spec: DrillSpec) -> DrillResult:
    """Drill `fleet` through `spec`'s failure and judge every phase (module docstring)."""
    marks = _Marks.of(spec)
    run = _simulate(fleet, spec, marks)
    phases = []
    for phase, from_s, to_s in marks.phases(spec.failure_unit):
        if to_s <= from_s:
            continue
        stats = _window(run, from_s, to_s)
        useful = stats.pop("useful")
        phases.append(
            PhaseStats(
                phase=phase,
                from_s=from_s - marks.fail_s,
                to_s=to_s - marks.fail_s,
                effective_arrival_rps=stats["attempts"] / (to_s - from_s),
                useful_per_min=useful / ((to_s - from_s) / MINUTE_S),
                demand_per_min=spec.demand_rps * MINUTE_S,
                **stats,
            )
        )
    minutes = []
    first = math.ceil((marks.start_s + WARMUP_S - marks.fail_s) / MINUTE_S)
    for m in range(first, math.floor((marks.end_s - marks.fail_s) / MINUTE_S)):
        from_s = marks.fail_s + m * MINUTE_S
        stats = _window(run, from_s, from_s + MINUTE_S)
        minutes.append(
            DrillMinute(
                minute=m,
                attempts=stats["attempts"],
                attainment_ratio=round(stats["attainment_ratio"], 6),
                useful=stats["useful"],
                ready_replicas=stats["ready_replicas_min"],
                queue_depth_max=stats["queue_depth_max"],
                retries=stats["retries"],
                refused=stats["refused"],
            )
        )
    drain_s = (
        0.0
        if spec.failure_unit is FailureUnit.NONE
        else _drain_s(run, marks, fleet.topology.replicas)
    )
    after = [m for m in minutes if m.minute >= 0]
    recover_s = next(
        (
            float(minute.minute * MINUTE_S)
            for i, minute in enumerate(after)
            if all(m.attainment_ratio >= spec.target_ratio for m in after[i:])
        ),
        None,
    )
    failing = [p for p in phases if not p.holds(spec.target_ratio)]
    drained = drain_s is not None and drain_s <= spec.drain_limit_s
    holds = not failing and drained
    return DrillResult(
        spec=spec,
        hosts=fleet.topology.hosts,
        replicas=fleet.topology.replicas,
        lost=run.lost,
        phases=tuple(phases),
        minutes=tuple(minutes),
        drain_s=drain_s,
        recover_s=recover_s,
        holds=holds,
        failed_phase=None if holds else failing[0].phase if failing else DrillPhase.FAILED,
        failed_minute=None if holds else _first_failed_minute(minutes, phases, spec),
    )
