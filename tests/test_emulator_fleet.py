"""The fleet simulation: determinism, vLLM's metric invariants, routing, injected failures."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from servewatch.emulator.engine import EngineParams
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet import (
    DOWN,
    FleetSimulation,
    LeastLoadedRouter,
    PrefixAffinityRouter,
    RoundRobinRouter,
)
from servewatch.emulator.fleet_config import FleetConfig, RouterPolicy, RouterSpec, TopologySpec
from servewatch.emulator.records import (
    EngineSteps,
    FinishedReason,
    FinishedRequest,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaState,
)
from servewatch.emulator.trace_replay import TraceFormat
from servewatch.emulator.workload import (
    ArrivalKind,
    ArrivalSpec,
    ConversationSpec,
    Distribution,
    RateStep,
    ReplaySpec,
    RequestSpec,
    WorkloadSpec,
)

T0 = 1_800_000_000.0


@dataclass
class Recorder:
    finished: list[FinishedRequest] = field(default_factory=list)
    steps: list[EngineSteps] = field(default_factory=list)
    events: list[ReplicaEvent] = field(default_factory=list)

    def request_finished(self, record: FinishedRequest) -> None:
        self.finished.append(record)

    def engine_steps(self, record: EngineSteps) -> None:
        self.steps.append(record)

    def replica_event(self, event: ReplicaEvent) -> None:
        self.events.append(event)

    def decode_iterations(self, replica: str | None = None) -> int:
        return sum(s.iterations * s.decode_seqs for s in self.steps if replica in (None, s.replica))


def simulate(
    config: FleetConfig, *, until_s: float, seed: int = 7
) -> tuple[Recorder, FleetSimulation]:
    recorder = Recorder()
    sim = FleetSimulation(config, observer=recorder, seed=seed, start_s=T0)
    sim.run_until(T0 + until_s)
    return recorder, sim


def finite_workload(workload: WorkloadSpec, *, seconds: float) -> WorkloadSpec:
    """The workload with arrivals stopping after `seconds` (a step down to rate 0)."""
    arrival = ArrivalSpec(
        kind=ArrivalKind.STEPS,
        rate_rps=workload.arrival.rate_rps,
        steps=(RateStep(seconds, 0.0),),
    )
    return replace(workload, arrival=arrival)


# A small, slow engine: a few requests per second saturate it, so tests stay cheap.
SMALL_ENGINE = EngineParams(
    step_base_s=0.02,
    step_per_seq_s=0.002,
    step_per_prefill_token_s=0.0002,
    max_num_batched_tokens=512,
    max_num_seqs=16,
    num_gpu_blocks=2000,
    max_model_len=4096,
    cold_start_s=30.0,
)
FIXED_MIX = WorkloadSpec(
    arrival=ArrivalSpec(rate_rps=8.0),
    user_tokens=Distribution.fixed(200),
    output_tokens=Distribution.fixed(100),
    max_tokens=512,
)


def small_fleet(**changes: object) -> FleetConfig:
    config = FleetConfig(
        topology=TopologySpec(zones=("zone-a", "zone-b"), hosts_per_zone=1, replicas_per_host=2),
        engine=SMALL_ENGINE,
        workload=FIXED_MIX,
    )
    return replace(config, **changes)  # type: ignore[arg-type]


def test_placements_put_replicas_on_hosts_in_zones() -> None:
    config = FleetConfig.default()
    sim = FleetSimulation(config, observer=Recorder(), seed=1, start_s=T0)
    rows = [(p.replica, p.host, p.zone) for p in sim.placements]
    assert rows == [
        ("vllm-0", "host-0", "zone-a"),
        ("vllm-1", "host-0", "zone-a"),
        ("vllm-2", "host-1", "zone-b"),
        ("vllm-3", "host-1", "zone-b"),
        ("vllm-4", "host-2", "zone-c"),
        ("vllm-5", "host-2", "zone-c"),
    ]
    assert {p.model for p in sim.placements} == {config.model}


def test_default_fleet_serves_its_workload() -> None:
    recorder, sim = simulate(FleetConfig.default(), until_s=300)
    assert len(recorder.finished) > 1000
    assert all(not r.failed for r in recorder.finished)
    assert {r.replica for r in recorder.finished} == {p.replica for p in sim.placements}
    assert sum(r.cached_prompt_tokens for r in recorder.finished) > 0  # conversations hit
    states = sim.states()
    assert [s.replica for s in states] == [p.replica for p in sim.placements]
    assert all(s.up and 0 < s.busy_ratio <= 1 and s.tokens_per_s > 0 for s in states)


def test_same_seed_same_records_and_another_seed_differs() -> None:
    first, _ = simulate(FleetConfig.default(), until_s=120, seed=11)
    second, _ = simulate(FleetConfig.default(), until_s=120, seed=11)
    other, _ = simulate(FleetConfig.default(), until_s=120, seed=12)
    assert first.finished == second.finished
    assert first.steps == second.steps
    assert first.events == second.events
    assert first.finished != other.finished


def test_driving_in_small_slices_gives_the_same_requests() -> None:
    config = replace(
        FleetConfig.default(),
        failures=(
            FailureSpec(FailureKind.REPLICA_CRASH, at_s=50.0, target="vllm-1", duration_s=5),
        ),
    )
    whole, _ = simulate(config, until_s=200)
    sliced = Recorder()
    sim = FleetSimulation(config, observer=sliced, seed=7, start_s=T0)
    t = T0
    snapshots: list[list[ReplicaState]] = []
    for i in range(400):
        t += 0.137 + (i % 7) * 0.21
        sim.run_until(min(t, T0 + 200))
        snapshots.append(sim.states())
    sim.run_until(T0 + 200)
    assert sliced.finished == whole.finished
    assert sliced.events == whole.events
    assert sliced.decode_iterations() == whole.decode_iterations()
    assert sum(s.iterations * s.prefill_tokens for s in sliced.steps) == sum(
        s.iterations * s.prefill_tokens for s in whole.steps
    )
    assert any(not state.up for snap in snapshots for state in snap)  # saw the crash


def test_run_until_refuses_to_go_back() -> None:
    sim = FleetSimulation(FleetConfig.default(), observer=Recorder(), seed=1, start_s=T0)
    sim.run_until(T0 + 10)
    with pytest.raises(ValueError, match="back in time"):
        sim.run_until(T0 + 5)


def write_azure(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{T0 + at:.7f},{prompt},{output}" for at, prompt, output in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_vllm_metric_invariants_for_sequential_requests(tmp_path: Path) -> None:
    # REFERENCE section 1: N sequential requests of P prompt tokens and T output tokens.
    n, prompt, output = 12, 300, 40
    trace = write_azure(tmp_path / "seq.csv", [(20.0 * i, prompt, output) for i in range(n)])
    workload = replace(FIXED_MIX, replay=ReplaySpec(trace, TraceFormat.AZURE_CSV))
    recorder, _ = simulate(small_fleet(workload=workload), until_s=20.0 * n + 60)
    records = recorder.finished
    assert len(records) == n  # TTFT, e2e, queue, prefill, decode: one sample each
    assert all(r.finished_reason is FinishedReason.STOP for r in records)
    assert sum(r.prompt_tokens for r in records) == n * prompt
    assert sum(r.completion_tokens for r in records) == n * output
    assert recorder.decode_iterations() == n * (output - 1)  # the ITL histogram's count
    iteration_tokens = sum(
        s.iterations * (s.decode_seqs + s.prefill_tokens) for s in recorder.steps
    )
    assert iteration_tokens == n * prompt + n * (output - 1)
    for r in records:
        assert r.queue_s == 0.0  # idle fleet: scheduled on arrival
        assert r.decode_s == pytest.approx((output - 1) * (0.02 + 0.002))


def test_decode_iterations_match_tokens_through_failures_and_preemption() -> None:
    engine = replace(SMALL_ENGINE, num_gpu_blocks=160, max_model_len=2048)  # tight KV
    config = small_fleet(
        engine=engine,
        workload=finite_workload(
            replace(FIXED_MIX, arrival=ArrivalSpec(rate_rps=10.0)), seconds=120
        ),
        failures=(
            FailureSpec(FailureKind.REPLICA_CRASH, at_s=40.0, target="vllm-0", duration_s=10),
            FailureSpec(FailureKind.HOST_LOSS, at_s=70.0, target="host-1", duration_s=20),
            FailureSpec(FailureKind.ERROR_BURST, at_s=90.0, target="vllm-1", duration_s=10),
        ),
    )
    recorder, sim = simulate(config, until_s=1500)
    assert sum(r.preemptions for r in recorder.finished) > 0
    assert sum(r.failed for r in recorder.finished) > 0
    assert all(s.running == s.waiting == 0 for s in sim.states())  # everything drained
    for replica in {r.replica for r in recorder.finished}:
        mine = [r for r in recorder.finished if r.replica == replica]
        # Per replica and through every restart: each token after a request's first came
        # from one reported decode iteration.
        assert recorder.decode_iterations(replica) == sum(
            max(0, r.completion_tokens - 1) for r in mine
        )


def test_host_loss_fails_its_requests_and_the_survivors_queue_up() -> None:
    loss_s = 300.0
    config = small_fleet(
        failures=(FailureSpec(FailureKind.HOST_LOSS, at_s=loss_s, target="host-0"),),
    )
    recorder = Recorder()
    sim = FleetSimulation(config, observer=recorder, seed=3, start_s=T0)
    waiting_before: list[int] = []
    waiting_after: list[int] = []
    for t in range(200, 420, 5):
        sim.run_until(T0 + t)
        states = {s.replica: s for s in sim.states()}
        survivors = sum(states[r].waiting for r in ("vllm-2", "vllm-3"))
        if t < loss_s:
            waiting_before.append(survivors)
        elif t >= loss_s + 60:
            waiting_after.append(survivors)
            assert not states["vllm-0"].up
            assert not states["vllm-1"].up
    assert max(waiting_before) < 5
    assert min(waiting_after) > 20
    assert waiting_after[-1] > waiting_after[0]  # and keeps growing
    lost = [r for r in recorder.finished if r.replica in ("vllm-0", "vllm-1") and r.failed]
    assert lost
    for r in lost:
        assert r.finished_reason is FinishedReason.ERROR
        assert r.arrival_s + r.e2e_s == pytest.approx(T0 + loss_s)
    assert not [r for r in recorder.finished if r.replica == "vllm-0" and r.arrival_s > T0 + loss_s]
    kinds = [(e.replica, e.kind) for e in recorder.events if e.at_s == T0 + loss_s]
    assert kinds == [
        ("vllm-0", ReplicaEventKind.HOST_LOST),
        ("vllm-1", ReplicaEventKind.HOST_LOST),
    ]


def test_crash_restarts_after_its_cold_start() -> None:
    config = small_fleet(
        failures=(
            FailureSpec(FailureKind.REPLICA_CRASH, at_s=60.0, target="vllm-2", duration_s=5),
        ),
    )
    recorder, _ = simulate(config, until_s=200)
    events = [(e.at_s - T0, e.kind) for e in recorder.events if e.replica == "vllm-2"]
    assert events == [
        (0.0, ReplicaEventKind.STARTED),
        (60.0, ReplicaEventKind.CRASHED),
        (pytest.approx(95.0), ReplicaEventKind.STARTED),  # 5 s to restart, 30 s cold start
    ]
    served = [r.arrival_s - T0 for r in recorder.finished if r.replica == "vllm-2"]
    assert not [t for t in served if 60.0 < t < 95.0]
    assert [t for t in served if t > 95.0]


def test_registry_outage_blocks_replacements_until_it_ends() -> None:
    config = small_fleet(
        failures=(
            FailureSpec(FailureKind.REGISTRY_OUTAGE, at_s=10.0, duration_s=100.0),
            FailureSpec(FailureKind.HOST_LOSS, at_s=20.0, target="host-1", duration_s=30.0),
            FailureSpec(FailureKind.REPLICA_CRASH, at_s=30.0, target="vllm-0", duration_s=0.0),
        ),
    )
    recorder, _ = simulate(config, until_s=300)
    events = [(e.replica, e.at_s - T0, e.kind) for e in recorder.events if e.at_s > T0]
    assert events == [
        ("vllm-2", 20.0, ReplicaEventKind.HOST_LOST),
        ("vllm-3", 20.0, ReplicaEventKind.HOST_LOST),
        ("vllm-0", 30.0, ReplicaEventKind.CRASHED),
        ("vllm-2", 50.0, ReplicaEventKind.START_BLOCKED),
        ("vllm-3", 50.0, ReplicaEventKind.START_BLOCKED),
        # A crashed replica restarts from its own node: no registry needed.
        ("vllm-0", 60.0, ReplicaEventKind.STARTED),
        ("vllm-2", 140.0, ReplicaEventKind.STARTED),
        ("vllm-3", 140.0, ReplicaEventKind.STARTED),
    ]


def test_zone_loss_of_the_whole_fleet_leaves_requests_unroutable() -> None:
    config = small_fleet(
        topology=TopologySpec(zones=("zone-a",), hosts_per_zone=2, replicas_per_host=1),
        failures=(FailureSpec(FailureKind.ZONE_LOSS, at_s=30.0, target="zone-a"),),
    )
    recorder, sim = simulate(config, until_s=60)
    assert sim.counters.unroutable_requests > 100
    assert not [r for r in recorder.finished if r.arrival_s > T0 + 30.0]


def test_slow_replica_steps_take_k_times_longer_while_slowed() -> None:
    config = small_fleet(
        failures=(
            FailureSpec(
                FailureKind.SLOW_REPLICA, at_s=30.0, target="vllm-1", duration_s=30.0, factor=3.0
            ),
        ),
    )
    recorder, _ = simulate(config, until_s=90)
    decode_runs = [s for s in recorder.steps if s.replica == "vllm-1" and s.prefill_tokens == 0]

    def base_s(s: EngineSteps) -> float:
        return SMALL_ENGINE.step_base_s + SMALL_ENGINE.step_per_seq_s * s.decode_seqs

    inside = [s for s in decode_runs if T0 + 30.1 < s.start_s < T0 + 59.0]
    outside = [s for s in decode_runs if s.start_s < T0 + 29.0 or s.start_s > T0 + 60.5]
    assert inside
    assert outside
    assert all(s.step_s == pytest.approx(3.0 * base_s(s)) for s in inside)
    assert all(s.step_s == pytest.approx(base_s(s)) for s in outside)
    kinds = [(e.kind, e.factor) for e in recorder.events if e.replica == "vllm-1" and e.at_s > T0]
    assert kinds == [(ReplicaEventKind.SLOWED, 3.0), (ReplicaEventKind.RECOVERED, 1.0)]


def test_error_burst_fails_the_share_it_names_while_it_lasts() -> None:
    config = small_fleet(
        failures=(
            FailureSpec(
                FailureKind.ERROR_BURST,
                at_s=20.0,
                target="vllm-3",
                duration_s=40.0,
                error_ratio=0.5,
            ),
        ),
    )
    recorder, sim = simulate(config, until_s=100)
    during = [
        r for r in recorder.finished if r.replica == "vllm-3" and T0 + 20 <= r.arrival_s < T0 + 60
    ]
    errors = [r for r in during if r.finished_reason is FinishedReason.ERROR]
    assert 0.35 < len(errors) / len(during) < 0.65
    assert all(r.completion_tokens == 0 and r.e2e_s == 0.0 for r in errors)
    assert not [r for r in recorder.finished if r.failed and r.replica != "vllm-3"]
    assert not [r for r in recorder.finished if r.failed and r.arrival_s >= T0 + 60]
    assert sim.counters.failed_requests == len(errors)


def test_round_robin_spreads_evenly_and_least_loaded_avoids_the_busy() -> None:
    spec = RequestSpec("r", 0.0, 1, 1, 1, None, None, (), False)
    rr = RoundRobinRouter()
    loads = [0, DOWN, 0]
    assert [rr.choose(spec, loads) for _ in range(4)] == [0, 2, 0, 2]
    ll = LeastLoadedRouter(3)
    assert ll.choose(spec, [5, 1, 3]) == 1
    assert ll.choose(spec, [5, DOWN, 3]) == 2
    assert [ll.choose(spec, [0, 0, 0]) for _ in range(3)] == [2, 0, 1]  # ties rotate
    assert ll.choose(spec, [DOWN, DOWN, DOWN]) is None
    assert rr.choose(spec, [DOWN, DOWN, DOWN]) is None


def test_prefix_affinity_sticks_to_the_ring_owner_until_it_is_full() -> None:
    router = PrefixAffinityRouter(
        ["a", "b", "c"], load_factor=1.25, virtual_nodes=16, min_load_cap=2
    )
    turn = RequestSpec("r-1", 0.0, 1, 1, 1, None, "conv-42", (), True)
    owner = router.choose(turn, [0, 0, 0])
    assert owner is not None
    assert all(router.choose(turn, [1, 1, 1]) == owner for _ in range(5))
    full = [0, 0, 0]
    full[owner] = 10  # cap = max(ceil(1.25 * 11 / 3), 2) = 5
    assert router.choose(turn, full) not in (owner, None)
    down = [0, 0, 0]
    down[owner] = DOWN
    assert router.choose(turn, down) not in (owner, None)
    assert router.choose(turn, [DOWN, DOWN, DOWN]) is None


def conversational(policy: RouterPolicy) -> FleetConfig:
    workload = WorkloadSpec(
        arrival=ArrivalSpec(rate_rps=6.0),
        conversation=ConversationSpec(turns_mean=4.0, think_time_s=Distribution.fixed(5.0)),
    )
    return replace(FleetConfig.default(), router=RouterSpec(policy=policy), workload=workload)


def test_prefix_affinity_keeps_conversations_together_and_hits_more() -> None:
    affinity, _ = simulate(conversational(RouterPolicy.PREFIX_AFFINITY), until_s=400)
    spread, _ = simulate(conversational(RouterPolicy.ROUND_ROBIN), until_s=400)
    replicas_per_conversation = Counter(
        len({r.replica for r in affinity.finished if r.conversation_id == c})
        for c in {r.conversation_id for r in affinity.finished}
    )
    assert replicas_per_conversation[1] > 0.95 * sum(replicas_per_conversation.values())

    def hit_share(recorder: Recorder) -> float:
        return sum(r.cached_prompt_tokens for r in recorder.finished) / sum(
            r.prompt_tokens for r in recorder.finished
        )

    assert hit_share(affinity) > 1.5 * hit_share(spread)
    loads = Counter(r.replica for r in affinity.finished)
    assert max(loads.values()) < 2.0 * min(loads.values())  # the load cap spreads them


def test_prompts_longer_than_max_model_len_are_rejected_before_any_replica() -> None:
    workload = replace(FIXED_MIX, user_tokens=Distribution.fixed(5000))
    _, sim = simulate(small_fleet(workload=workload), until_s=10)
    assert sim.counters.rejected_requests > 50
    assert sim.counters.unroutable_requests == 0
    assert all(s.running == s.waiting == 0 for s in sim.states())
