"""Traffic step: demand multiplied within minutes, the autoscaler late, and the warm pool that
keeps the SLO meanwhile.

Seed 003 holds back "traffic doubles in five minutes; what happens?" An autoscaler sees the
step only after its lag and its replicas serve only after a cold start, so until then the
fleet that was sized for the old demand carries the ramp alone. The step drill runs that in the
emulator: the fleet (`DrillFleet`, its replicas in any placement) plus `warm` ready spare
replicas, demand ramping linearly from `demand_rps` to `ratio` times it over `over_s` and held,
and the autoscaler starting at `lag_s` after the step the replicas the new demand needs at
`replica_rps` each, each serving `cold_start_s` later. Every minute from the step on must meet
the SLO's target.

`warm_pool` finds the fewest warm replicas that hold, by drilling 0, 1, 2, ... ; the drill of
one fewer is kept as its evidence. Without a warm pool, the gateway must shed what the ramp
brings above the fleet's capacity until the autoscaled replicas serve: `shed_without_pool`
gives the peak rate and how long.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, replace
from typing import Any

from servewatch.capacity.drill import (
    DRILL_START_S,
    MINUTE_S,
    WARMUP_S,
    DrillFleet,
    SentLog,
    judged_slo,
    run_sampled,
)
from servewatch.capacity.figure import fmt
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import FleetConfig, TopologySpec
from servewatch.emulator.forwarding_source import ForwardingSource
from servewatch.emulator.ground_truth import meets_slo
from servewatch.emulator.records import FinishedRequests
from servewatch.emulator.workload import RequestSource, RequestSpec, WorkloadSpec

MAX_WARM = 64


@dataclass(frozen=True)
class TrafficStepSpec:
    demand_rps: float  # before the step, the whole fleet's
    ratio: float  # demand after the step, as a multiple of before
    over_s: float  # the ramp's length
    lag_s: float  # step start until the autoscaler starts replicas
    cold_start_s: float  # until a started replica serves
    replica_rps: float  # what the autoscaler counts one replica for
    ttft_limit_s: float | None
    tpot_limit_s: float | None
    target_ratio: float
    steady_s: float = 120.0
    after_s: float = 300.0  # judged after the ramp ends
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {
            "demand_rps": self.demand_rps > 0,
            "ratio": self.ratio >= 1.0,
            "over_s": self.over_s > 0,
            "lag_s": self.lag_s >= 0,
            "cold_start_s": self.cold_start_s >= 0,
            "replica_rps": self.replica_rps > 0,
            "target_ratio": 0 < self.target_ratio < 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"traffic step: {name} is {getattr(self, name)!r}; out of range")
        if self.ttft_limit_s is None and self.tpot_limit_s is None:
            raise ValueError("traffic step: needs a TTFT or a TPOT limit to judge requests by")

    def rate_rps(self, since_step_s: float) -> float:
        """The demand `since_step_s` after the step starts (before it: the old demand)."""
        grown = min(max(since_step_s / self.over_s, 0.0), 1.0)
        return self.demand_rps * (1.0 + (self.ratio - 1.0) * grown)


@dataclass(frozen=True)
class StepMinute:
    minute: int  # from the step's start
    attempts: int
    attainment_ratio: float
    demand_rps: float
    ready_replicas: int


@dataclass(frozen=True)
class StepDrill:
    warm: int
    replicas: int  # the fleet's own, before the step
    autoscaled: int
    minutes: tuple[StepMinute, ...]
    holds: bool
    failed_minute: int | None

    def verdict(self) -> str:
        head = f"{self.replicas} replicas with {self.warm} warm, {self.autoscaled} more autoscaled"
        lowest = min(self.minutes, key=lambda m: m.attainment_ratio)
        if self.holds:
            return f"{head}: holds; lowest minute {lowest.attainment_ratio:.1%}"
        return (
            f"{head}: fails from minute {self.failed_minute:+d} after the step; lowest "
            f"minute {lowest.attainment_ratio:.1%} (minute {lowest.minute:+d})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "warm": self.warm,
            "replicas": self.replicas,
            "autoscaled": self.autoscaled,
            "holds": self.holds,
            "failed_minute": self.failed_minute,
            "verdict": self.verdict(),
            "minutes": [vars(m) for m in self.minutes],
        }


@dataclass(frozen=True)
class Shedding:
    """What the gateway must shed without a warm pool: the ramp above the fleet's capacity."""

    peak_rps: float
    peak_ratio: float  # of the demand then
    seconds: float

    def summary(self) -> str:
        if self.seconds <= 0:
            return (
                "nothing to shed: the fleet carries the ramp until the autoscaler's replicas serve"
            )
        return (
            f"without a warm pool the gateway must shed up to {fmt(self.peak_rps)} req/s "
            f"({self.peak_ratio:.0%} of the demand then) for {fmt(self.seconds)} s"
        )


@dataclass(frozen=True)
class WarmPool:
    spec: TrafficStepSpec
    warm: int | None  # None: no pool up to MAX_WARM holds
    holding: StepDrill | None
    one_fewer: StepDrill | None
    shedding: Shedding

    def summary(self) -> str:
        step = f"a {self.spec.ratio:g}x step over {fmt(self.spec.over_s)} s"
        if self.warm is None or self.holding is None:
            return (
                f"no warm pool of up to {MAX_WARM} replicas holds {step}; {self.shedding.summary()}"
            )
        text = f"{step}: a warm pool of {self.warm} replicas holds ({self.holding.verdict()})"
        if self.one_fewer is not None:
            text += f"; {self.warm - 1} do not ({self.one_fewer.verdict()})"
        return f"{text}; {self.shedding.summary()}"

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "ratio": self.spec.ratio,
            "over_s": self.spec.over_s,
            "lag_s": self.spec.lag_s,
            "cold_start_s": self.spec.cold_start_s,
            "warm_replicas": self.warm,
            "holding": None if self.holding is None else self.holding.to_json(),
            "one_fewer": None if self.one_fewer is None else self.one_fewer.to_json(),
            "shed_peak_rps": self.shedding.peak_rps,
            "shed_seconds": self.shedding.seconds,
        }


class _Ramped(ForwardingSource):
    """A source thinned from `peak_rps` to the step's rate at each instant (Lewis-Shedler)."""

    def __init__(self, inner: RequestSource, *, spec: TrafficStepSpec, step_s: float) -> None:
        super().__init__(inner)
        self._spec = spec
        self._step_s = step_s
        self._peak_rps = spec.demand_rps * spec.ratio
        self._rng = random.Random(f"{spec.seed}:ramp")  # noqa: S311 (simulation, not secrets)

    def next_arrival(self) -> RequestSpec | None:
        while True:
            spec = self._source.next_arrival()
            if spec is None:
                return None
            rate = self._spec.rate_rps(spec.arrival_s - self._step_s)
            if self._rng.random() * self._peak_rps < rate:
                return spec


def autoscaled_replicas(spec: TrafficStepSpec, *, replicas: int, warm: int) -> int:
    """What the autoscaler starts: the new demand's replicas less those already up."""
    needed = math.ceil(spec.demand_rps * spec.ratio / spec.replica_rps - 1e-9)
    return max(0, needed - replicas - warm)


def shed_without_pool(spec: TrafficStepSpec, *, replicas: int) -> Shedding:
    """The ramp's excess over `replicas` x `replica_rps` until autoscaled replicas serve."""
    capacity = replicas * spec.replica_rps
    serve_s = spec.lag_s + spec.cold_start_s
    steps = 1000
    excess = [
        (t, spec.rate_rps(t) - capacity) for t in (serve_s * i / steps for i in range(steps + 1))
    ]
    over = [(t, e) for t, e in excess if e > 0]
    if not over:
        return Shedding(0.0, 0.0, 0.0)
    t_peak, peak = max(over, key=lambda item: item[1])
    return Shedding(peak, peak / spec.rate_rps(t_peak), serve_s - over[0][0])


def step_drill(fleet: DrillFleet, spec: TrafficStepSpec, *, warm: int) -> StepDrill:
    """The fleet plus `warm` ready replicas through the step, the autoscaler's replicas added
    after its lag and cold start."""
    replicas = fleet.topology.replicas
    extra = autoscaled_replicas(spec, replicas=replicas, warm=warm)
    total = replicas + warm + extra
    start_s = DRILL_START_S
    step_s = start_s + WARMUP_S + spec.steady_s
    end_s = step_s + spec.over_s + spec.after_s
    ready_at_s = step_s + spec.lag_s  # the autoscaler starts them; they serve a cold start later
    # Replicas sit one per host: without a failure in scope, placement does not matter.
    topology = TopologySpec(zones=("zone-a",), hosts_per_zone=total, replicas_per_host=1)
    failures = tuple(
        FailureSpec(
            FailureKind.REPLICA_CRASH,
            at_s=0.0,
            target=f"vllm-{i}",
            duration_s=ready_at_s - start_s,
        )
        for i in range(replicas + warm, total)
    )
    config = FleetConfig(
        model="drill",
        pool="drill",
        topology=topology,
        engine=replace(fleet.engine, cold_start_s=spec.cold_start_s),
        router=fleet.router,
        workload=WorkloadSpec(),
        failures=failures,
    )
    inner = fleet.workload.source(
        spec.demand_rps * spec.ratio, seed=spec.seed, start_s=start_s, until_s=end_s
    )
    sent = SentLog(_Ramped(inner, spec=spec, step_s=step_s))
    records = FinishedRequests()
    sim = FleetSimulation(config, observer=records, seed=spec.seed, start_s=start_s, source=sent)
    up = [(t_s, ready) for t_s, _, ready in run_sampled(sim, start_s=start_s, stop_s=end_s + 120.0)]
    slo = judged_slo(
        spec.ttft_limit_s, spec.tpot_limit_s, spec.target_ratio, ttft_offset_s=fleet.ttft_offset_s
    )
    good = {(r.request_id, r.arrival_s): meets_slo(r, slo) for r in records.finished}
    minutes = []
    first = math.ceil(-spec.steady_s / MINUTE_S)
    by_arrival = sorted(sent.sent, key=lambda k: k[1])
    for m in range(first, math.floor((end_s - step_s) / MINUTE_S)):
        from_s = step_s + m * MINUTE_S
        arrived = by_arrival[
            bisect.bisect_left(by_arrival, from_s, key=lambda k: k[1]) : bisect.bisect_left(
                by_arrival, from_s + MINUTE_S, key=lambda k: k[1]
            )
        ]
        met = sum(good.get(k, False) for k in arrived)
        minutes.append(
            StepMinute(
                minute=m,
                attempts=len(arrived),
                attainment_ratio=round(met / len(arrived), 6) if arrived else 1.0,
                demand_rps=round(spec.rate_rps((m + 0.5) * MINUTE_S), 6),
                ready_replicas=min(
                    (n for t, n in up if from_s <= t < from_s + MINUTE_S), default=0
                ),
            )
        )
    failing = [m for m in minutes if m.minute >= 0 and m.attainment_ratio < spec.target_ratio]
    return StepDrill(
        warm=warm,
        replicas=replicas,
        autoscaled=extra,
        minutes=tuple(minutes),
        holds=not failing,
        failed_minute=failing[0].minute if failing else None,
    )


def warm_pool(fleet: DrillFleet, spec: TrafficStepSpec) -> WarmPool:
    """The fewest warm replicas through which the step holds, and the drill of one fewer."""
    previous: StepDrill | None = None
    for warm in range(MAX_WARM + 1):
        drilled = step_drill(fleet, spec, warm=warm)
        if drilled.holds:
            return WarmPool(
                spec,
                warm,
                drilled,
                previous,
                shed_without_pool(spec, replicas=fleet.topology.replicas),
            )
        previous = drilled
    return WarmPool(
        spec, None, None, previous, shed_without_pool(spec, replicas=fleet.topology.replicas)
    )
