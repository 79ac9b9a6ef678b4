"""Knee search: capacity at the SLO of the fitted engine, found by simulating it.

The fitted step time (engine_fit.py) runs in the emulator's continuous-batching engine, fed the
request shapes the pool served (prompt and answer lengths drawn jointly, with replacement) as a
Poisson stream, or, when the requests name their conversations, those conversations turn by
turn through the engine's prefix cache, on the pool's own replica count behind its router; the
emulator's capacity search (emulator/ground_truth.py) bisects on the rate per replica for the
largest one at which `target_ratio` of requests meet both limits. The limits on the engine the
spans cannot show (sequences per step, the token budget per step, KV blocks) are the engine's
defaults unless the requirement or the scrape states them; the largest batch seen is reported
as a lower bound.

What the engine model leaves out, the fleet's own latencies show: a request's TTFT also holds
time outside the engine's steps (the HTTP server, tokenization, the router). The model is run at
the load the pool actually carried and its median TTFT compared with the observed median; the
difference is the TTFT offset, taken off the TTFT limit the simulated requests are judged by.
The same run's p90 TTFT and TPOT against the observed ones say how well the model reproduces
the fleet.

The interval: every bootstrap resample of the engine fit is searched again, with its own
simulation seed, so both the fit's uncertainty and the simulation's noise widen it.

Size: over 500 lines on purpose: the replayed shapes, the shared-prefix calibration and the
bisection use one fitted engine and one check against the observed load.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from enum import Enum

import polars as pl

from servewatch.capacity.bootstrap import outward_interval
from servewatch.capacity.conversation_turns import conversation_turns
from servewatch.capacity.engine_fit import EngineFit, StepTime
from servewatch.capacity.figure import fmt
from servewatch.capacity.parallel import Mapper, serial_map
from servewatch.capacity.prefill_fit import PrefillFit, fit_first_turn_prefill
from servewatch.emulator.engine_params import EngineParams
from servewatch.emulator.fleet import FleetSimulation
from servewatch.emulator.fleet_config import (
    FleetConfig,
    RouterPolicy,
    RouterSpec,
    SloSpec,
    TopologySpec,
)
from servewatch.emulator.ground_truth import (
    PROBE_START_S,
    capacity_at_slo,
    conversation_warmup_s,
    meets_slo,
)
from servewatch.emulator.records import FinishedRequests
from servewatch.emulator.sampled_workload import SampledMix
from servewatch.emulator.workload import WorkloadSpec
from servewatch.pipeline.request_sli import with_tpot

UNLIMITED_S = 1e9  # a limit the requirement does not state
MAX_SHAPES = 20_000
CHECK_REQUESTS = 3000
# A resample's knee lies near the point estimate: bracket it in small steps from there.
RESAMPLE_GROWTH_RATIO = 1.15
# A replay is preferred over the plain one only when its attainment at the observed load is
# nearer the observed by more than this (simulation noise at CHECK_REQUESTS is about 0.5%).
CHECK_MARGIN_RATIO = 0.01
MIN_HIT_RATIO = 0.05
# Conversations are replayed when at least this share of the served requests follow up an
# earlier turn of theirs; below it a workload is single-turn for the cache's purposes.
MIN_FOLLOW_UP_RATIO = 0.05
# A replay of conversations whose hit ratio falls short of the scraped one by more than this
# gets a prefix all its conversations share (`_shared_prefix_tokens`).
MIN_HIT_SHORTFALL = 0.01
# The engine model's own error, which no resample of the data shows: simulators of a fitted
# engine reach 7-9% against real vLLM (Vidur, BLIS); this model, with a step time fitted from
# spans, is off by up to about 13% on emulated fleets of known capacity (docs/capacity.md).
MODEL_ERROR_RATIO = 0.1


@dataclass(frozen=True)
class KneeSearchSpec:
    """What the search judges by and how hard it looks."""

    ttft_limit_s: float | None
    tpot_limit_s: float | None
    target_ratio: float
    replicas: int
    router: RouterPolicy
    seed: int
    resamples: int = 24
    requests_per_probe: int = 3000
    tolerance_ratio: float = 0.02
    confidence_ratio: float = 0.9
    limits: EngineParams = field(default_factory=EngineParams)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas is {self.replicas}; allowed: 1 or more")
        if self.resamples < 0:
            raise ValueError(f"resamples is {self.resamples}; allowed: 0 or more")


class PrefillShape(Enum):
    """How a replayed request's prefill work is set."""

    SERVED = "served prompt tokens at the fitted cost per token"
    FROM_TTFT = "each request's own prefill time, from its TTFT, at the cost per uncached token"
    CONVERSATIONS = (
        "the recorded conversations replayed turn by turn, the engine's prefix cache deciding "
        "the hits, at the cost per uncached token"
    )


@dataclass(frozen=True)
class ModelCheck:
    """The fitted model run at the load the pool carried, against what the pool showed."""

    prefill: PrefillShape
    load_rps: float
    observed_attainment_ratio: float
    simulated_attainment_ratio: float
    observed_ttft_p50_s: float
    simulated_ttft_p50_s: float
    observed_ttft_p90_s: float
    simulated_ttft_p90_s: float
    observed_tpot_p90_s: float
    simulated_tpot_p90_s: float
    ttft_offset_s: float  # observed median TTFT less the model's, at least 0
    # Prefix-cache hits over prompt tokens: the simulated engine's (a replay of conversations
    # only) and the scraped counters' (when scraped).
    simulated_hit_ratio: float | None = None
    observed_hit_ratio: float | None = None

    def summary(self) -> str:
        hits = (
            ""
            if self.simulated_hit_ratio is None
            else f", prefix-cache hit ratio {self.simulated_hit_ratio:.1%}"
            + (
                ""
                if self.observed_hit_ratio is None
                else f" (observed {self.observed_hit_ratio:.1%})"
            )
        )
        return (
            f"prefill as {self.prefill.value}; at the observed {fmt(self.load_rps)} req/s per "
            f"replica the model meets the SLO for {self.simulated_attainment_ratio:.1%} of "
            f"requests (observed {self.observed_attainment_ratio:.1%}), p90 TTFT "
            f"{fmt(self.simulated_ttft_p90_s)} s (observed {fmt(self.observed_ttft_p90_s)}) and "
            f"p90 TPOT {fmt(self.simulated_tpot_p90_s)} s "
            f"(observed {fmt(self.observed_tpot_p90_s)}){hits}; "
            f"TTFT outside the engine {fmt(self.ttft_offset_s)} s"
        )


@dataclass(frozen=True)
class ModelKnee:
    """The knee of the fitted engine under the observed workload, with its interval."""

    knee_rps: float
    low_rps: float  # the bootstrap's end widened by MODEL_ERROR_RATIO
    high_rps: float
    bootstrap_low_rps: float
    bootstrap_high_rps: float
    # Behind prefix-affinity routing, the knee with no prompt cached: the low end reaches it.
    cache_lost_knee_rps: float | None
    # The replay that knee was searched at: every served prompt token prefilled, uncached.
    cache_lost_replay: Replay | None
    engine: EngineFit
    step: StepTime  # the step time searched: the fit's, per uncached token when FROM_TTFT
    check: ModelCheck
    resampled_knees_rps: tuple[float, ...]
    replicas: int
    router: RouterPolicy
    confidence_ratio: float
    probed_virtual_s: float  # what every probe of every search simulated, warm-ups included
    # What a drill of this engine needs besides `step`: the requests searched, the limits.
    mix: SampledMix
    limits: EngineParams
    first_turn_prefill: PrefillFit | None = None  # the replay's prefill cost, when measured

    def summary(self) -> str:
        return (
            f"the fitted engine ({self.step.summary()}) simulated on {self.replicas} "
            f"replicas behind {self.router.value.replace('_', '-')} routing reaches the SLO's "
            f"target up to {fmt(self.knee_rps)} req/s per replica ({self.confidence_ratio:.0%} "
            f"interval {fmt(self.low_rps)} to {fmt(self.high_rps)}: "
            f"{len(self.resampled_knees_rps)} refits on resampled minutes give "
            f"{fmt(self.bootstrap_low_rps)} to "
            f"{fmt(self.bootstrap_high_rps)}, widened by the model's own "
            f"{MODEL_ERROR_RATIO:.0%}{self._cache_lost_text()}); {self.check.summary()}"
            + ("" if self.first_turn_prefill is None else f"; {self.first_turn_prefill.summary()}")
        )

    def _cache_lost_text(self) -> str:
        if self.cache_lost_knee_rps is None:
            return ""
        return (
            f"; the low end reaches {fmt(self.cache_lost_knee_rps)} req/s, the knee with no "
            "prompt cached, because prefix-affinity routing spills conversations off their "
            "replicas as load grows and the hit ratio seen below the knee need not hold at it"
        )


def engine_params(step: StepTime, *, limits: EngineParams, mix: SampledMix) -> EngineParams:
    """The emulator's engine with the fitted step time and the stated (or default) limits;
    the cache is on only for a replay of conversations: a replay of shapes already counts the
    hits in its prefill work."""
    return replace(
        limits,
        step_base_s=step.base_s,
        step_per_seq_s=step.per_seq_s,
        step_per_prefill_token_s=step.per_prefill_token_s,
        enable_prefix_caching=mix.replays_prefixes,
    )


@dataclass(frozen=True)
class Replay:
    """One way to replay the pool's requests: their shapes and the step time to run them at."""

    prefill: PrefillShape
    mix: SampledMix
    step: StepTime
    resampled: tuple[StepTime, ...]
    # Where the step's prefill cost came from, when first turns measured it (CONVERSATIONS).
    first_turn_prefill: PrefillFit | None = None


def _shapes(frame: pl.DataFrame, prompt: pl.Expr, *, seed: int) -> SampledMix:
    shapes = frame.select(
        prompt.round().cast(pl.Int64).clip(lower_bound=1).alias("prompt"),
        pl.col("completion_tokens").fill_null(1).clip(lower_bound=1),
    ).sort("prompt", "completion_tokens")
    if shapes.height > MAX_SHAPES:
        shapes = shapes.sample(MAX_SHAPES, seed=seed).sort("prompt", "completion_tokens")
    return SampledMix(tuple((int(p), int(c)) for p, c in shapes.iter_rows()))


def _conversations(
    frame: pl.DataFrame, *, seed: int
) -> tuple[tuple[tuple[int, int, float], ...], ...]:
    """The conversations of `frame` (served requests) begun inside it, each its turns in
    arrival order as (prompt, completion tokens, think time s after the turn before); none
    when fewer than `MIN_FOLLOW_UP_RATIO` of the requests follow up an earlier turn."""
    turns = conversation_turns(frame)
    if not _has_follow_ups(turns, requests=frame.height):
        return ()
    grouped = turns.group_by("conversation_id", maintain_order=True).agg(
        pl.col("prompt_tokens").clip(lower_bound=1),
        pl.col("completion_tokens").fill_null(1).clip(lower_bound=1),
        pl.col("think_s"),
    )
    if grouped.height > MAX_SHAPES:
        grouped = grouped.sample(MAX_SHAPES, seed=seed).sort("conversation_id")
    return tuple(
        tuple(zip(prompts, completions, thinks, strict=True))
        for prompts, completions, thinks in grouped.select(
            "prompt_tokens", "completion_tokens", "think_s"
        ).iter_rows()
    )


def _uncached(step: StepTime, *, hit_ratio: float | None) -> StepTime | None:
    """The step time per uncached prompt token, from the fitted cost per served token and a
    measured hit ratio; None when no usable hit ratio was measured."""
    if hit_ratio is None or not MIN_HIT_RATIO <= hit_ratio < 1.0:
        return None
    return replace(step, per_prefill_token_s=step.per_prefill_token_s / (1.0 - hit_ratio))


def _conversation_replay(
    fit: EngineFit,
    served: pl.DataFrame,
    *,
    shapes: SampledMix,
    conversations: tuple[tuple[tuple[int, int, float], ...], ...],
    seed: int,
) -> Replay:
    """The conversations replayed at the cost per uncached token: measured on first turns
    when there are enough, else the fitted cost (per computed token: `replays`)."""
    mix = replace(shapes, conversations=conversations)
    first_turns = fit_first_turn_prefill(served, seed=seed, resamples=len(fit.resampled))
    if first_turns is not None:
        costs = first_turns.resampled or (first_turns.per_token_s,)
        return Replay(
            PrefillShape.CONVERSATIONS,
            mix,
            replace(fit.step, per_prefill_token_s=first_turns.per_token_s),
            tuple(
                replace(s, per_prefill_token_s=costs[i % len(costs)])
                for i, s in enumerate(fit.resampled)
            ),
            first_turns,
        )
    return Replay(PrefillShape.CONVERSATIONS, mix, fit.step, fit.resampled)


def _served(requests: pl.DataFrame) -> pl.DataFrame:
    return requests.filter(
        pl.col("ok").fill_null(value=False) & pl.col("ttft_s").is_not_null()
    ).with_columns(pl.col("prompt_tokens").fill_null(1))


def replays_conversations(requests: pl.DataFrame) -> bool:
    """Whether `replays` replays the conversations of `requests` (one pool's), so the engine
    fit should count each prompt's computed tokens (conversation_turns.py), not its served."""
    return _has_follow_ups(conversation_turns(_served(requests)), requests=requests.height)


def _has_follow_ups(turns: pl.DataFrame, *, requests: int) -> bool:
    return bool((turns.get_column("turn") > 0).sum() >= MIN_FOLLOW_UP_RATIO * max(requests, 1))


def replays(
    fit: EngineFit, requests: pl.DataFrame, *, hit_ratio: float | None, seed: int
) -> tuple[Replay, ...]:
    """The candidate replays of `requests` (one pool's served requests).

    Always the served prompts at the fitted cost per prompt token, which spreads the cache's
    savings evenly. With a measured prefix-cache hit ratio, also each request's own prefill:
    the fitted cost is per served token, so per uncached token it is that over the miss ratio,
    and a request's uncached tokens are its TTFT less the step it was prefilled in, at that
    cost, within its prompt. That keeps the long uncached prompts (a conversation that moved
    replica) that a mean hides, and that miss the TTFT limit at any load.

    When the requests name their conversations and enough of them follow up an earlier turn
    (`replays_conversations`), the conversations are the one replay: with the engine's prefix
    cache on, at the cost per uncached token measured on their first turns (else the fitted
    one, which `fit` then measured per computed token), so the hits fall as the router
    spreads conversations.
    """
    served = _served(requests)
    shapes = _shapes(served, pl.col("prompt_tokens"), seed=seed)
    conversations = _conversations(served, seed=seed)
    if conversations:
        replay = _conversation_replay(
            fit, served, shapes=shapes, conversations=conversations, seed=seed
        )
        return (replay,)
    found = [Replay(PrefillShape.SERVED, shapes, fit.step, fit.resampled)]
    step = _uncached(fit.step, hit_ratio=hit_ratio)
    if step is not None and step.per_prefill_token_s > 0:
        in_step_s = step.step_s(sequences=fit.mean_batch + 1.0)
        tokens = ((pl.col("ttft_s") - in_step_s) / step.per_prefill_token_s).clip(
            lower_bound=1.0, upper_bound=pl.col("prompt_tokens").cast(pl.Float64)
        )
        resampled = (_uncached(s, hit_ratio=hit_ratio) for s in fit.resampled)
        found.append(
            Replay(
                PrefillShape.FROM_TTFT,
                _shapes(served, tokens, seed=seed),
                step,
                tuple(s for s in resampled if s is not None),
            )
        )
    return tuple(found)


def _fleet(engine: EngineParams, spec: KneeSearchSpec, slo: SloSpec) -> FleetConfig:
    return FleetConfig(
        topology=TopologySpec(zones=("zone-a",), hosts_per_zone=spec.replicas, replicas_per_host=1),
        engine=engine,
        router=RouterSpec(policy=spec.router),
        workload=WorkloadSpec(),
        slo=slo,
    )


def _rank(q: float, n: int) -> int:
    # Nearest rank: the smallest value with at least q of the values at or below it.
    return min(n - 1, max(0, math.ceil(q * n) - 1))


def nearest_rank_quantile(values: list[float], q: float) -> float:
    """The smallest value with at least `q` of the values at or below it; NaN when empty."""
    return sorted(values)[_rank(q, len(values))] if values else math.nan


def _column_quantile(column: pl.Series, q: float) -> float:
    """`nearest_rank_quantile` of a column, sorted by Polars (a pool's day holds millions)."""
    values = column.drop_nulls()
    return float(values.sort()[_rank(q, values.len())]) if values.len() else math.nan


def _slo(spec: KneeSearchSpec, *, ttft_offset_s: float) -> SloSpec | None:
    """The SLO simulated requests are judged by, None when the offset alone breaks it."""
    ttft_s = UNLIMITED_S if spec.ttft_limit_s is None else spec.ttft_limit_s - ttft_offset_s
    if ttft_s <= 0:
        return None
    return SloSpec(
        ttft_s=ttft_s,
        tpot_s=UNLIMITED_S if spec.tpot_limit_s is None else spec.tpot_limit_s,
        target_ratio=spec.target_ratio,
    )


def check_model(
    replay: Replay,
    observed: pl.DataFrame,
    *,
    load_rps: float,
    observed_attainment_ratio: float,
    spec: KneeSearchSpec,
    observed_hit_ratio: float | None = None,
) -> ModelCheck:
    """Run `replay` at `load_rps` per replica and compare its latencies, attainment and (for
    a replay of conversations) prefix-cache hit ratio with `observed` (the pool's requests,
    failed ones included, their attainment and the scraped hit ratio)."""
    total_rps = load_rps * spec.replicas
    window_s = CHECK_REQUESTS / total_rps
    from_s = PROBE_START_S + max(0.1 * window_s, conversation_warmup_s(replay.mix))
    to_s = from_s + window_s
    collect = FinishedRequests(from_s=from_s)
    open_slo = SloSpec(ttft_s=UNLIMITED_S, tpot_s=UNLIMITED_S, target_ratio=spec.target_ratio)
    engine = engine_params(replay.step, limits=spec.limits, mix=replay.mix)
    sim = FleetSimulation(
        _fleet(engine, spec, open_slo),
        observer=collect,
        seed=spec.seed,
        start_s=PROBE_START_S,
        source=replay.mix.source(total_rps, seed=spec.seed, start_s=PROBE_START_S, until_s=to_s),
    )
    sim.run_until(to_s + max(120.0, window_s))
    finished = collect.finished
    done = [r for r in finished if not r.failed]
    ttft = [r.ttft_s for r in done]
    tpot = [r.decode_s / (r.completion_tokens - 1) for r in done if r.completion_tokens > 1]
    served = observed.lazy().filter(pl.col("ok").fill_null(value=False)).pipe(with_tpot).collect()
    observed_ttft, observed_tpot = served.get_column("ttft_s"), served.get_column("tpot_s")
    observed_p50_s = _column_quantile(observed_ttft, 0.5)
    simulated_p50_s = nearest_rank_quantile(ttft, 0.5)
    offset_s = max(0.0, observed_p50_s - simulated_p50_s)
    slo = _slo(spec, ttft_offset_s=offset_s)
    simulated = (
        sum(meets_slo(r, slo) for r in finished) / len(finished)
        if slo is not None and finished
        else 0.0
    )
    simulated_hits = None
    if replay.mix.replays_prefixes and done:
        prompt_tokens = sum(r.prompt_tokens for r in done)
        simulated_hits = sum(r.cached_prompt_tokens for r in done) / max(prompt_tokens, 1)
    return ModelCheck(
        simulated_hit_ratio=simulated_hits,
        observed_hit_ratio=observed_hit_ratio,
        prefill=replay.prefill,
        load_rps=load_rps,
        observed_attainment_ratio=observed_attainment_ratio,
        simulated_attainment_ratio=simulated,
        observed_ttft_p50_s=observed_p50_s,
        simulated_ttft_p50_s=simulated_p50_s,
        observed_ttft_p90_s=_column_quantile(observed_ttft, 0.9),
        simulated_ttft_p90_s=nearest_rank_quantile(ttft, 0.9),
        observed_tpot_p90_s=_column_quantile(observed_tpot, 0.9),
        simulated_tpot_p90_s=nearest_rank_quantile(tpot, 0.9),
        ttft_offset_s=offset_s,
    )


def _shared_prefix_tokens(mix: SampledMix, check: ModelCheck) -> int:
    """The prompt tokens all replayed conversations should share (0: none) so the replay's
    prefix-cache hit ratio at the observed load reaches the scraped one. A fleet's hits also
    come from prompts shared across conversations (a tenant's system prompt), which the
    conversations' own turns cannot show: each conversation then opens with that many shared
    tokens, found once from the shortfall over the mean prompt tokens of a conversation, at
    most the median first prompt."""
    simulated, observed = check.simulated_hit_ratio, check.observed_hit_ratio
    if simulated is None or observed is None or observed - simulated <= MIN_HIT_SHORTFALL:
        return 0
    conversations = mix.conversations
    per_conversation = sum(p for turns in conversations for p, _, _ in turns) / len(conversations)
    first = sorted(turns[0][0] for turns in conversations)
    return round(min((observed - simulated) * per_conversation, first[len(first) // 2]))


def _search(
    step: StepTime,
    mix: SampledMix,
    *,
    spec: KneeSearchSpec,
    ttft_offset_s: float,
    seed: int,
    first_rate_rps: float,
    growth_ratio: float,
) -> tuple[float, float]:
    """The knee, and the virtual seconds its probes simulated (judged window and warm-up)."""
    slo = _slo(spec, ttft_offset_s=ttft_offset_s)
    if slo is None:
        return 0.0, 0.0  # the time outside the engine alone exceeds the TTFT limit
    engine = engine_params(step, limits=spec.limits, mix=mix)
    found = capacity_at_slo(
        engine,
        mix,
        slo=slo,
        seed=seed,
        requests=spec.requests_per_probe,
        tolerance_ratio=spec.tolerance_ratio,
        first_rate_rps=first_rate_rps,
        fleet=_fleet(engine, spec, slo),
        growth_ratio=growth_ratio,
    )
    probed_s = sum(p.arrivals_s for p in found.probes)
    return found.capacity_rps, probed_s


def _search_resample(
    item: tuple[StepTime, int],
    *,
    mix: SampledMix,
    spec: KneeSearchSpec,
    ttft_offset_s: float,
    first_rate_rps: float,
) -> tuple[float, float]:
    """One resampled fit's search (step time, seed): a unit a `Mapper` can spread."""
    step, seed = item
    return _search(
        step,
        mix,
        spec=spec,
        ttft_offset_s=ttft_offset_s,
        seed=seed,
        first_rate_rps=first_rate_rps,
        growth_ratio=RESAMPLE_GROWTH_RATIO,
    )


def _widened(knee: float, end: float, *, upper: bool) -> float:
    """An interval end moved out by the model's own error, in quadrature with the bootstrap's
    half-width on that side (both relative to the knee)."""
    if not knee > 0:
        return end
    wide = math.hypot(abs(end - knee) / knee, MODEL_ERROR_RATIO)
    return knee * (1.0 + wide) if upper else max(0.0, knee * (1.0 - wide))


def search_knee(
    fit: EngineFit,
    requests: pl.DataFrame,
    *,
    load_rps: float,
    spec: KneeSearchSpec,
    observed_attainment_ratio: float,
    hit_ratio: float | None = None,
    mapper: Mapper = serial_map,
) -> ModelKnee:
    """The fitted engine's knee under the workload of `requests` (one pool's), with the
    bootstrap interval. Each candidate replay (`replays`) is first run at `load_rps` per
    replica (the pool's mean observed load); the one whose attainment there is nearest
    `observed_attainment_ratio` is searched (the plain replay unless another is clearly
    nearer).

    Behind prefix-affinity routing the interval's low end also reaches the knee with every
    served prompt prefilled in full: bounded-load hashing spills conversations off their
    replicas as load grows, so the hit ratio seen at low load need not hold at the knee."""
    load_rps = max(load_rps, 1e-3)
    check_at_load = functools.partial(
        check_model,
        observed=requests,
        load_rps=load_rps,
        observed_attainment_ratio=observed_attainment_ratio,
        spec=spec,
        observed_hit_ratio=hit_ratio,
    )
    checked = [
        (replay, check_at_load(replay))
        for replay in replays(fit, requests, hit_ratio=hit_ratio, seed=spec.seed)
    ]

    def miss(check: ModelCheck) -> float:
        return abs(check.simulated_attainment_ratio - check.observed_attainment_ratio)

    replay, check = checked[0]
    for other, other_check in checked[1:]:
        if miss(other_check) < miss(check) - CHECK_MARGIN_RATIO:
            replay, check = other, other_check
    shared = _shared_prefix_tokens(replay.mix, check)
    if shared:
        replay = replace(replay, mix=replace(replay.mix, shared_prefix_tokens=shared))
        check = check_at_load(replay)
    knee, probed_s = _search(
        replay.step,
        replay.mix,
        spec=spec,
        ttft_offset_s=check.ttft_offset_s,
        seed=spec.seed,
        first_rate_rps=load_rps,
        growth_ratio=2.0,
    )
    resample = functools.partial(
        _search_resample,
        mix=replay.mix,
        spec=spec,
        ttft_offset_s=check.ttft_offset_s,
        first_rate_rps=knee if knee > 0 else load_rps,
    )
    searched = mapper(
        resample,
        [(step, spec.seed + 1 + i) for i, step in enumerate(replay.resampled[: spec.resamples])],
    )
    knees = sorted(k for k, _ in searched)
    probed_s += sum(seconds for _, seconds in searched)
    low, high = outward_interval(knees, spec.confidence_ratio) if knees else (knee, knee)
    cache_lost = cache_lost_replay = None
    uncached = _uncached(fit.step, hit_ratio=hit_ratio)
    # A replay of conversations loses its hits itself, as its router spreads them.
    served = next((r for r, _ in checked if r.prefill is PrefillShape.SERVED), None)
    if spec.router is RouterPolicy.PREFIX_AFFINITY and uncached is not None and served:
        # The served prompts, every token now prefilled.
        cache_lost_replay = Replay(PrefillShape.SERVED, served.mix, uncached, ())
        cache_lost, cache_lost_s = _search(
            uncached,
            cache_lost_replay.mix,
            spec=spec,
            ttft_offset_s=check.ttft_offset_s,
            seed=spec.seed,
            first_rate_rps=max(fit.mean_batch, 1.0) / 10.0,
            growth_ratio=2.0,
        )
        probed_s += cache_lost_s
    widened_low = _widened(knee, min(low, knee), upper=False)
    return ModelKnee(
        knee_rps=knee,
        low_rps=widened_low if cache_lost is None else min(widened_low, cache_lost),
        cache_lost_knee_rps=cache_lost,
        cache_lost_replay=cache_lost_replay,
        high_rps=_widened(knee, max(high, knee), upper=True),
        bootstrap_low_rps=min(low, knee),
        bootstrap_high_rps=max(high, knee),
        engine=fit,
        step=replay.step,
        check=check,
        resampled_knees_rps=tuple(knees),
        replicas=spec.replicas,
        router=spec.router,
        confidence_ratio=spec.confidence_ratio,
        probed_virtual_s=probed_s,
        mix=replay.mix,
        limits=spec.limits,
        first_turn_prefill=replay.first_turn_prefill,
    )
