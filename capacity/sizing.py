"""Sizing chain: replicas = demand / capacity at the SLO, with prefill share and headroom.

Seed 003's chain, step by step, each step a derived figure naming its inputs:
- decode replicas if decode had the GPUs to itself = decode tokens/s / decode goodput per replica;
- prefill takes a budgeted share of every replica, so decode gets (1 - share) of it:
  decode replicas = decode tokens/s / (goodput x (1 - share));
- prefill check: prefill tokens/s / (prefill rate x share) replicas' worth of prefill; if that is
  larger, prefill binds and sets the count instead;
- headroom multiplies the count: replicas x (1 + headroom).
Counts stay fractional here (37.6, not 38): rounding to whole replicas happens once, in the
failure table, where hosts and failure units make the count whole.

A replica's capacity is stated in requests (req/min at the SLO) or in tokens (decode goodput,
prefill rate and prefill share). The prefill rate can be derived from compute, as the seed does:
GPUs x peak TFLOPS x MFU / (2 x parameters) FLOPs per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from servewatch.capacity.demand import DemandEstimate, prefill_share_needed
from servewatch.capacity.failure_table import RateUnit
from servewatch.capacity.figure import Figure, Step, derived, fmt


class Binding(Enum):
    """Which demand sets the replica count."""

    REQUESTS = "requests"
    DECODE = "decode"
    PREFILL = "prefill"


@dataclass(frozen=True)
class PrefillCompute:
    """Prefill rate from compute: prefill is compute-bound at about 2 x parameters FLOPs/token."""

    gpu_tflops: Figure
    mfu_ratio: Figure
    model_params: Figure


@dataclass(frozen=True)
class RateCapacity:
    gpus: int
    capacity_req_per_min: Figure


@dataclass(frozen=True)
class TokenCapacity:
    """Decode goodput at the SLO, prefill rate (stated, or from compute) and prefill's share."""

    gpus: int
    decode_tokens_per_s: Figure
    prefill_share_ratio: Figure
    prefill_tokens_per_s: Figure | None = None
    prefill_compute: PrefillCompute | None = None

    def __post_init__(self) -> None:
        if (self.prefill_tokens_per_s is None) == (self.prefill_compute is None):
            raise ValueError("a token capacity needs prefill_tokens_per_s or prefill_compute")


ReplicaCapacity = RateCapacity | TokenCapacity


@dataclass(frozen=True)
class SizingChain:
    """The chain's steps and its result; `demand_rate` and `replica_rate` are in `unit`.

    `demand_rate` is the binding demand with headroom, `replica_rate` one replica's capacity for
    it: the two numbers the failure table divides.
    """

    steps: tuple[Step, ...]
    replicas_before_headroom: Figure
    replicas_with_headroom: Figure
    binding: Binding
    unit: RateUnit
    demand_rate: Figure
    replica_rate: Figure


def prefill_rate(capacity: TokenCapacity) -> Figure:
    if capacity.prefill_tokens_per_s is not None:
        return capacity.prefill_tokens_per_s
    prefill = capacity.prefill_compute
    assert prefill is not None
    flops_per_s = capacity.gpus * prefill.gpu_tflops.value * 1e12 * prefill.mfu_ratio.value
    return derived(
        flops_per_s / (2.0 * prefill.model_params.value),
        "tokens/s",
        f"{capacity.gpus} GPUs x {prefill.gpu_tflops.text()} x MFU {fmt(prefill.mfu_ratio.value)}"
        f" / (2 FLOPs x {prefill.model_params.text()} per token)",
    )


def _with_headroom(before: Figure, headroom_ratio: Figure) -> Figure:
    return derived(
        before.value * (1.0 + headroom_ratio.value),
        "replicas",
        f"{fmt(before.value)} x (1 + headroom {fmt(headroom_ratio.value)})",
    )


def _rate_chain(
    demand: DemandEstimate, capacity: RateCapacity, headroom_ratio: Figure
) -> SizingChain:
    per_replica = capacity.capacity_req_per_min
    before = derived(
        demand.req_per_min.value / per_replica.value,
        "replicas",
        f"{demand.req_per_min.text()} / {per_replica.text()} per replica",
    )
    after = _with_headroom(before, headroom_ratio)
    demand_rate = derived(
        demand.req_per_min.value * (1.0 + headroom_ratio.value),
        "req/min",
        f"{demand.req_per_min.text()} x (1 + headroom {fmt(headroom_ratio.value)})",
    )
    return SizingChain(
        steps=(
            *demand.steps,
            Step("replicas for demand", before),
            Step("replicas with headroom", after),
        ),
        replicas_before_headroom=before,
        replicas_with_headroom=after,
        binding=Binding.REQUESTS,
        unit=RateUnit.REQ_PER_MIN,
        demand_rate=demand_rate,
        replica_rate=per_replica,
    )


def _token_chain(
    demand: DemandEstimate, capacity: TokenCapacity, headroom_ratio: Figure
) -> SizingChain:
    decode, prefill = demand.decode_tokens_per_s, demand.prefill_tokens_per_s
    if decode is None or prefill is None:
        raise ValueError(
            "a replica capacity in tokens needs demand in tokens: give demand as the token "
            "model (concurrent users, answer and prompt tokens), or replica capacity in req/min"
        )
    goodput, share = capacity.decode_tokens_per_s, capacity.prefill_share_ratio
    if not 0 < share.value < 1:
        raise ValueError(
            f"prefill share of a replica is {fmt(share.value)}; allowed: strictly between 0 and 1"
        )
    rate = prefill_rate(capacity)
    decode_only = derived(
        decode.value / goodput.value,
        "replicas",
        f"{decode.text()} decode / {goodput.text()} decode goodput per replica",
    )
    decode_replica_rate = derived(
        goodput.value * (1.0 - share.value),
        "tokens/s",
        f"{goodput.text()} x (1 - prefill share {fmt(share.value)})",
    )
    decode_replicas = derived(
        decode.value / decode_replica_rate.value,
        "replicas",
        f"{fmt(decode_only.value)} / (1 - prefill share {fmt(share.value)})",
    )
    prefill_replica_rate = derived(
        rate.value * share.value,
        "tokens/s",
        f"{rate.text()} prefill rate x share {fmt(share.value)}",
    )
    prefill_replicas = derived(
        prefill.value / prefill_replica_rate.value,
        "replicas",
        f"{prefill.text()} prefill / ({rate.text()} x {fmt(share.value)})",
    )
    prefill_binds = prefill_replicas.value > decode_replicas.value
    binding = Binding.PREFILL if prefill_binds else Binding.DECODE
    larger = prefill_replicas if prefill_binds else decode_replicas
    before = derived(
        larger.value,
        "replicas",
        f"the larger of decode {fmt(decode_replicas.value)} and prefill "
        f"{fmt(prefill_replicas.value)}: {binding.value} binds",
    )
    needed_share = derived(
        prefill_share_needed(
            prefill_tokens_per_s=prefill.value,
            replicas=before.value,
            replica_prefill_tokens_per_s=rate.value,
        ),
        "ratio",
        f"{prefill.text()} / ({fmt(before.value)} replicas x {rate.text()}); "
        f"budgeted {fmt(share.value)}",
    )
    after = _with_headroom(before, headroom_ratio)
    binding_demand = prefill if prefill_binds else decode
    demand_rate = derived(
        binding_demand.value * (1.0 + headroom_ratio.value),
        "tokens/s",
        f"{binding_demand.text()} {binding.value} x (1 + headroom {fmt(headroom_ratio.value)})",
    )
    return SizingChain(
        steps=(
            *demand.steps,
            *(() if capacity.prefill_compute is None else (Step("prefill rate", rate),)),
            Step("decode replicas if decode had the GPUs to itself", decode_only),
            Step("decode replicas with prefill's share set aside", decode_replicas),
            Step(
                "prefill check: replicas' worth of prefill at the budgeted share", prefill_replicas
            ),
            Step("replicas for demand", before),
            Step("prefill's share of each replica actually needed", needed_share),
            Step("replicas with headroom", after),
        ),
        replicas_before_headroom=before,
        replicas_with_headroom=after,
        binding=binding,
        unit=RateUnit.PREFILL_TOKENS_PER_S if prefill_binds else RateUnit.DECODE_TOKENS_PER_S,
        demand_rate=demand_rate,
        replica_rate=prefill_replica_rate if prefill_binds else decode_replica_rate,
    )


def size_chain(
    demand: DemandEstimate, capacity: ReplicaCapacity, *, headroom_ratio: Figure
) -> SizingChain:
    if headroom_ratio.value < 0:
        raise ValueError(f"headroom is {fmt(headroom_ratio.value)}; allowed: 0 or more")
    if isinstance(capacity, RateCapacity):
        return _rate_chain(demand, capacity, headroom_ratio)
    return _token_chain(demand, capacity, headroom_ratio)
