"""Demand: what the fleet must serve at peak, in requests and in decode and prefill tokens.

Two ways to state it. As a peak request rate (observed or planned, times growth). Or as seed
003's chat model: users alternate between receiving an answer and reading and typing, so
- the share of users mid-generation = answer time / (answer time + think-and-read time),
  with answer time = answer tokens x TPOT;
- decode tokens/s = concurrent users x share mid-generation x per-user token rate (1 / TPOT);
- each user sends one request per answer-and-read cycle, so requests/s = users / cycle time;
- prefill tokens/s = requests/s x uncached prompt tokens, uncached = prompt x (1 - hit ratio).
The prefix-cache hit ratio moves prefill demand more than any other input, which is why the risk
analysis looks at its stability and at what losing router affinity would add.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from servewatch.capacity.figure import Figure, Step, derived, fmt

OBSERVED = "observed"


@dataclass(frozen=True)
class RateDemand:
    # None: `req_per_min = "observed"`, to be measured from the store's traced requests
    # (`capacity.recommendation.with_observed_demand`) before the fleet is sized.
    peak_req_per_min: Figure | None
    growth_ratio: Figure


@dataclass(frozen=True)
class TokenDemand:
    concurrent_users: Figure
    answer_tokens: Figure
    tpot_s: Figure
    think_and_read_s: Figure
    prompt_tokens: Figure
    cache_hit_ratio: Figure


@dataclass(frozen=True)
class DemandEstimate:
    """Peak demand with the steps that produced it; token rates only from the token model."""

    req_per_min: Figure
    steps: tuple[Step, ...]
    decode_tokens_per_s: Figure | None = None
    prefill_tokens_per_s: Figure | None = None
    answer_tokens: Figure | None = None
    uncached_prompt_tokens: Figure | None = None


def uncached_prompt_tokens(*, prompt_tokens: float, cache_hit_ratio: float) -> float:
    return prompt_tokens * (1.0 - cache_hit_ratio)


def prefill_tokens_per_s(
    *, req_per_s: float, prompt_tokens: float, cache_hit_ratio: float
) -> float:
    return req_per_s * uncached_prompt_tokens(
        prompt_tokens=prompt_tokens, cache_hit_ratio=cache_hit_ratio
    )


def prefill_share_needed(
    *, prefill_tokens_per_s: float, replicas: float, replica_prefill_tokens_per_s: float
) -> float:
    """Fraction of each replica's time that prefill takes when `replicas` share the demand."""
    return prefill_tokens_per_s / (replicas * replica_prefill_tokens_per_s)


def _rate_demand(demand: RateDemand) -> DemandEstimate:
    peak, growth = demand.peak_req_per_min, demand.growth_ratio
    if peak is None:
        raise ValueError(
            f'demand.req_per_min is "{OBSERVED}", but no traced requests measured it: '
            "`servewatch recommend` measures it from a store; `servewatch size` needs a number"
        )
    req_per_min = derived(
        peak.value * growth.value,
        "req/min",
        f"peak {peak.text()} x growth {fmt(growth.value)}",
    )
    return DemandEstimate(req_per_min=req_per_min, steps=(Step("peak demand", req_per_min),))


def _token_demand(demand: TokenDemand) -> DemandEstimate:
    users, tpot = demand.concurrent_users, demand.tpot_s
    answer_s = demand.answer_tokens.value * tpot.value
    cycle_s = answer_s + demand.think_and_read_s.value
    if cycle_s <= 0:
        raise ValueError(
            f"demand: answer time {fmt(answer_s)} s + think-and-read "
            f"{demand.think_and_read_s.text()} is not positive; a user's cycle must take time"
        )
    answer = derived(answer_s, "s", f"{demand.answer_tokens.text()} x TPOT {tpot.text()} per token")
    share = derived(
        answer_s / cycle_s,
        "ratio",
        f"answer time {answer.text()} / (answer time + think-and-read "
        f"{demand.think_and_read_s.text()})",
    )
    per_user = derived(1.0 / tpot.value, "tokens/s", f"1 / TPOT {tpot.text()}")
    decode = derived(
        users.value * share.value * per_user.value,
        "tokens/s",
        f"{users.text()} x {fmt(share.value)} mid-generation x {per_user.text()} per user",
    )
    req_per_s = derived(
        users.value / cycle_s,
        "req/s",
        f"{users.text()} x one request per {fmt(cycle_s)} s answer-and-read cycle",
    )
    uncached = derived(
        uncached_prompt_tokens(
            prompt_tokens=demand.prompt_tokens.value,
            cache_hit_ratio=demand.cache_hit_ratio.value,
        ),
        "tokens",
        f"{demand.prompt_tokens.text()} x (1 - cache hit ratio "
        f"{fmt(demand.cache_hit_ratio.value)})",
    )
    prefill = derived(
        req_per_s.value * uncached.value,
        "tokens/s",
        f"{req_per_s.text()} x {uncached.text()} uncached per request",
    )
    req_per_min = derived(req_per_s.value * 60.0, "req/min", f"{req_per_s.text()} x 60 s")
    return DemandEstimate(
        req_per_min=req_per_min,
        steps=(
            Step("answer time", answer),
            Step("share of users mid-generation", share),
            Step("per-user token rate", per_user),
            Step("decode demand", decode),
            Step("request rate", req_per_s),
            Step("uncached prompt tokens per request", uncached),
            Step("prefill demand", prefill),
            Step("request rate per minute", req_per_min),
        ),
        decode_tokens_per_s=decode,
        prefill_tokens_per_s=prefill,
        answer_tokens=demand.answer_tokens,
        uncached_prompt_tokens=uncached,
    )


def estimate_demand(demand: RateDemand | TokenDemand) -> DemandEstimate:
    if isinstance(demand, RateDemand):
        return _rate_demand(demand)
    return _token_demand(demand)


def affinity_loss_prefill(demand: TokenDemand, *, affinity_loss_hit_ratio: float) -> Figure:
    """Extra prefill tokens/s if the router lost affinity and the hit ratio fell to the given one.

    Seed 003: "The router loses affinity (a replica restarts, the hash ring moves): prefill
    demand jumps as caches miss".
    """
    estimate = _token_demand(demand)
    assert estimate.prefill_tokens_per_s is not None
    lost = _token_demand(
        replace(demand, cache_hit_ratio=demand.cache_hit_ratio.with_value(affinity_loss_hit_ratio))
    ).prefill_tokens_per_s
    assert lost is not None
    return derived(
        lost.value - estimate.prefill_tokens_per_s.value,
        "tokens/s",
        f"prefill at hit ratio {fmt(affinity_loss_hit_ratio)} ({lost.text()}) - prefill at "
        f"{fmt(demand.cache_hit_ratio.value)} ({estimate.prefill_tokens_per_s.text()})",
    )
