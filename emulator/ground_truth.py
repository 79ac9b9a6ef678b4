"""Ground truth: a replica's capacity at SLO, found by search in virtual time.

Capacity at SLO (DistServe's sense, REFERENCE section 3) is the largest request rate at which
at least `target_ratio` of requests meet both the TTFT and the TPOT limit (limits inclusive;
a failed request never meets them; a one-token answer has no TPOT and meets that limit, as
`vllm bench serve` counts it). One replica gets the workload's mix as a Poisson stream:
`requests` arrivals are judged after a warm-up share, and each rate is simulated with the same
seed, so every probe sees the same requests, only closer together or further apart (common
random numbers keep attainment from jittering between probes). The search doubles the rate
until attainment falls below target, then bisects until the bracket is `tolerance_ratio` wide;
the reported capacity is the bracket's lower end, a rate that was simulated and met the target.

That is one replica's capacity, fed alone. A fleet's replicas each serve less or more than that:
the router spreads a Poisson stream unevenly (round robin) or pools it (least loaded, which
evens out bursts), and prefix affinity keeps conversations on one replica. So the fleet-level
truth (`fleet_capacity_for_config`) runs the same search on the recorded fleet itself, its
topology and router, with the rate per replica searched and the whole fleet's requests judged;
a refit from the fleet's telemetry is judged against that number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from servewatch.emulator.engine import EngineParams
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import (
    FleetConfig,
    RouterPolicy,
    RouterSpec,
    SloSpec,
    TopologySpec,
)
from servewatch.emulator.forwarding_source import ForwardingSource
from servewatch.emulator.records import EngineSteps, FinishedRequest, ReplicaEvent
from servewatch.emulator.sampled_workload import SampledMix
from servewatch.emulator.workload import RequestSource, RequestSpec, SyntheticWorkload, WorkloadSpec

PROBE_START_S = 1_800_000_000.0  # any instant will do; probes never read a wall clock
MIN_RATE_RPS = 1e-3
CONVERSATION_WARMUP_S = 300.0
PROBE_WARMUP_RATIO = 0.1  # of the judged window
SETTLE_LIFETIMES = 2.0  # request lifetimes (request_lifetime_s) a probe warms up and judges
MAX_TTFT_S = 60.0  # a TTFT limit past this counts as this, for a lifetime
MAX_RATE_RPS = 1e6


@dataclass(frozen=True)
class CapacityProbe:
    """Attainment of one simulated rate."""

    rate_rps: float
    judged_requests: int
    good_requests: int
    arrivals_s: float = 0.0  # virtual time of arrivals simulated: the warm-up and the window

    @property
    def attainment_ratio(self) -> float:
        return self.good_requests / self.judged_requests if self.judged_requests else 0.0


@dataclass(frozen=True)
class CapacityAtSlo:
    """The search's answer and every probe it ran, in the order it ran them."""

    capacity_rps: float
    attainment_ratio: float
    slo: SloSpec
    probes: tuple[CapacityProbe, ...]
    requests_per_probe: int
    seed: int


def meets_slo(record: FinishedRequest, slo: SloSpec) -> bool:
    """Whether one finished request is good under `slo` (vLLM bench's goodput rule)."""
    if record.failed or record.ttft_s > slo.ttft_s:
        return False
    if record.completion_tokens <= 1:
        return True
    return record.decode_s / (record.completion_tokens - 1) <= slo.tpot_s


class _Judge(ForwardingSource):
    """Observer and source wrapper: counts requests arriving in the judged window."""

    def __init__(self, source: RequestSource, *, slo: SloSpec, from_s: float, to_s: float) -> None:
        super().__init__(source)
        self._slo = slo
        self._from_s = from_s
        self._to_s = to_s
        self.arrived = 0
        self.finished = 0
        self.good = 0

    def _count(self, spec: RequestSpec | None) -> RequestSpec | None:
        if spec is not None and self._from_s <= spec.arrival_s < self._to_s:
            self.arrived += 1
        return spec

    def next_arrival(self) -> RequestSpec | None:
        return self._count(super().next_arrival())

    def follow_up(
        self,
        finished: RequestSpec,
        *,
        completion_tokens: int,
        end_s: float,
        ok: bool,
        refused: bool = False,
    ) -> RequestSpec | None:
        return self._count(
            super().follow_up(
                finished, completion_tokens=completion_tokens, end_s=end_s, ok=ok, refused=refused
            )
        )

    def request_finished(self, record: FinishedRequest) -> None:
        if self._from_s <= record.arrival_s < self._to_s:
            self.finished += 1
            self.good += meets_slo(record, self._slo)

    def engine_steps(self, record: EngineSteps) -> None:
        pass

    def replica_event(self, event: ReplicaEvent) -> None:
        pass


def request_lifetime_s(
    engine: EngineParams, workload: WorkloadSpec | SampledMix, slo: SloSpec
) -> float:
    """How long a mean request lasts at most while it meets the SLO: its TTFT limit and its
    answer at the TPOT limit (or at a full batch's step time, when that is shorter)."""
    if isinstance(workload, SampledMix):
        completion = workload.completion_tokens_mean
    else:
        completion = workload.output_tokens.typical()
    full_step_s = engine.step_base_s + engine.step_per_seq_s * engine.max_num_seqs
    return min(slo.ttft_s, MAX_TTFT_S) + max(completion - 1.0, 0.0) * min(slo.tpot_s, full_step_s)


def conversation_warmup_s(workload: WorkloadSpec | SampledMix) -> float:
    """The least warm-up before judging `workload`, 0 without follow-up turns, else
    `CONVERSATION_WARMUP_S`, or longer when most recorded conversations take longer from
    their first turn to their last. Not shorter when they are quick: the prefix cache fills
    with their histories and starts evicting only after a while, and a warm-up of one
    conversation's length judged an 8B fleet behind prefix affinity at +50%."""
    if isinstance(workload, WorkloadSpec):
        return CONVERSATION_WARMUP_S if workload.conversation.turns_mean > 1.0 else 0.0
    if workload.turns_mean > 1.0:
        return max(CONVERSATION_WARMUP_S, workload.think_s_p90)
    return 0.0


def attainment_at(
    engine: EngineParams,
    workload: WorkloadSpec | SampledMix,
    *,
    rate_rps: float,
    slo: SloSpec,
    seed: int,
    requests: int,
    warmup_ratio: float = PROBE_WARMUP_RATIO,
    fleet: FleetConfig | None = None,
) -> CapacityProbe:
    """Simulate one replica at `rate_rps` and judge about `requests` requests after a warm-up;
    with `fleet`, its topology and router at `rate_rps` per replica, all replicas judged.

    `workload` is a synthetic mix, or shapes sampled from served requests (a capacity model's
    replay, or the conversations they made). The warm-up is `warmup_ratio` of the judged
    window, and at least `conversation_warmup_s` when conversations have follow-up turns, which
    arrive a think time after earlier turns and so take a while to reach their steady share of
    the load.
    Requests still unfinished when the judged ones should long have drained (the window
    again, at least 120 s, after the last arrival) count as missing the SLO.
    """
    if not rate_rps > 0:
        raise ValueError(f"rate_rps must be > 0, got {rate_rps}")
    replicas = 1 if fleet is None else fleet.topology.replicas
    total_rps = rate_rps * replicas
    # A fleet reaches its steady state (its batch, its KV blocks, its queue) only after a few
    # request lifetimes; a busy fleet's 3000 requests arrive in seconds, so both the warm-up
    # and the judged window last at least `SETTLE_LIFETIMES` lifetimes of a request that
    # meets the SLO, or a short probe passes a load that overloads it a minute later.
    settle_s = SETTLE_LIFETIMES * request_lifetime_s(engine, workload, slo)
    window_s = max(requests / total_rps, settle_s)
    warmup_s = max(warmup_ratio * window_s, settle_s, conversation_warmup_s(workload))
    from_s = PROBE_START_S + warmup_s
    to_s = from_s + window_s
    source: RequestSource
    if isinstance(workload, SampledMix):
        mix = fleet.workload if fleet is not None else WorkloadSpec()
        source = workload.source(total_rps, seed=seed, start_s=PROBE_START_S, until_s=to_s)
    else:
        mix = workload.with_rate(total_rps)
        source = SyntheticWorkload(mix, seed=seed, start_s=PROBE_START_S, until_s=to_s)
    judge = _Judge(source, slo=slo, from_s=from_s, to_s=to_s)
    if fleet is None:
        config = FleetConfig(
            topology=TopologySpec(zones=("zone-a",), hosts_per_zone=1, replicas_per_host=1),
            engine=engine,
            router=RouterSpec(policy=RouterPolicy.ROUND_ROBIN),
            workload=mix,
            slo=slo,
        )
    else:  # the fleet as recorded, without its injected failures
        config = replace(fleet, engine=engine, workload=mix, slo=slo, failures=())
    sim = FleetSimulation(config, observer=judge, seed=seed, start_s=PROBE_START_S, source=judge)
    sim.run_until(to_s)
    deadline_s = to_s + max(120.0, window_s)
    step_s = max(10.0, window_s / 20)
    while judge.finished < judge.arrived and sim.now_s < deadline_s:
        sim.run_until(min(sim.now_s + step_s, deadline_s))
    return CapacityProbe(rate_rps, judge.arrived, judge.good, warmup_s + window_s)


def capacity_at_slo(
    engine: EngineParams,
    workload: WorkloadSpec | SampledMix,
    *,
    slo: SloSpec | None = None,
    seed: int = 0,
    requests: int = 3000,
    tolerance_ratio: float = 0.02,
    first_rate_rps: float = 1.0,
    fleet: FleetConfig | None = None,
    growth_ratio: float = 2.0,
) -> CapacityAtSlo:
    """The largest Poisson request rate one replica serves with attainment >= target; with
    `fleet`, per replica of that fleet, its router spreading the whole stream.

    The bracket grows (or shrinks) by `growth_ratio` a probe from `first_rate_rps`: a search
    that starts near its answer (a resample of a fit already searched) brackets it sooner with
    a small ratio."""
    slo = slo or SloSpec()
    if not 0 < tolerance_ratio < 1:
        raise ValueError(f"tolerance_ratio must be in (0, 1), got {tolerance_ratio}")
    if not growth_ratio > 1:
        raise ValueError(f"growth_ratio must be > 1, got {growth_ratio}")
    probes: list[CapacityProbe] = []

    def probe(rate_rps: float) -> CapacityProbe:
        result = attainment_at(
            engine, workload, rate_rps=rate_rps, slo=slo, seed=seed, requests=requests, fleet=fleet
        )
        probes.append(result)
        return result

    def meets(result: CapacityProbe) -> bool:
        return result.attainment_ratio >= slo.target_ratio

    first = probe(first_rate_rps)
    if meets(first):
        good = first
        while meets(result := probe(good.rate_rps * growth_ratio)):
            if result.rate_rps > MAX_RATE_RPS:
                raise ValueError(f"attainment still meets the target at {result.rate_rps} req/s")
            good = result
        bad = result
    else:
        bad = first
        while not meets(result := probe(bad.rate_rps / growth_ratio)):
            if result.rate_rps < MIN_RATE_RPS:
                return CapacityAtSlo(0.0, 0.0, slo, tuple(probes), requests, seed)
            bad = result
        good = result
    while bad.rate_rps - good.rate_rps > tolerance_ratio * good.rate_rps:
        result = probe(math.sqrt(good.rate_rps * bad.rate_rps))
        if result.attainment_ratio >= slo.target_ratio:
            good = result
        else:
            bad = result
    return CapacityAtSlo(good.rate_rps, good.attainment_ratio, slo, tuple(probes), requests, seed)


def capacity_for_config(config: FleetConfig, *, seed: int, requests: int = 3000) -> CapacityAtSlo:
    """Per-replica capacity at the config's SLO for its engine and workload mix."""
    workload = replace(config.workload, replay=None)
    return capacity_at_slo(config.engine, workload, slo=config.slo, seed=seed, requests=requests)


def fleet_capacity_for_config(
    config: FleetConfig, *, seed: int, requests: int = 3000
) -> CapacityAtSlo:
    """Per-replica capacity at the config's SLO of the fleet itself: its topology and router
    serving the workload mix, the rate per replica searched and every request judged."""
    workload = replace(config.workload, replay=None)
    return capacity_at_slo(
        config.engine, workload, slo=config.slo, seed=seed, requests=requests, fleet=config
    )
