"""Requirement: what the fleet must do, written down before any topology is chosen.

Seed 000: a useful requirement "names the traffic mix, latency objective, tolerated failure unit
and allowed recovery interval". Here that is demand (a request rate, or the chat token model),
one replica's capacity at the SLO, the failure unit, where hosts may go (replicas per host,
zones), the recovery interval during which no replacement may be counted, the backlog to clear,
headroom and price. Every number is a `Figure`, so the record can say where each came from, and
any figure may carry a range (`{ value = .., low = .., high = .. }`) for the risk analysis.

Loaded from TOML; every error names the file, the dotted path of the field, what was found and
what is allowed. Unknown keys are errors: a misspelt assumption silently ignored would be a
silent guess. Figures are addressed by the same dotted paths (`demand.cache_hit_ratio`) in the
record and in the tornado.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from servewatch.capacity.cost import CostSpec, default_hours_per_month
from servewatch.capacity.demand import OBSERVED, RateDemand, TokenDemand
from servewatch.capacity.figure import Figure, SourceKind, assumed
from servewatch.capacity.placement import FailureUnit
from servewatch.capacity.sizing import PrefillCompute, RateCapacity, ReplicaCapacity, TokenCapacity
from servewatch.emulator.fleet_config import RouterPolicy
from servewatch.slo.fields import Fields, read_toml

DEFAULT_RECOVERY_INTERVAL_S = 180.0


class RequirementError(ValueError):
    """The requirement cannot be used; the message says where and why."""


@dataclass(frozen=True)
class SloTarget:
    """What a capacity fit solves for. With TTFT and/or TPOT limits, capacity is the load at which
    `target_ratio` of requests meet all of them (the attainment knee, the ground truth's sense);
    with only `latency_limit_s`, it is where a p95 latency line meets that limit."""

    latency_limit_s: float | None
    latency: str
    ttft_limit_s: float | None = None
    tpot_limit_s: float | None = None
    target_ratio: float = 0.9

    @property
    def attainment(self) -> bool:
        return self.ttft_limit_s is not None or self.tpot_limit_s is not None


@dataclass(frozen=True)
class PlacementSpec:
    replicas_per_host: int
    zones: tuple[str, ...]
    candidate_hosts: tuple[int, ...] = ()
    # The router the knee search simulates the pool behind (knee_search.py).
    router: RouterPolicy = RouterPolicy.ROUND_ROBIN


@dataclass(frozen=True)
class Recovery:
    interval_s: Figure
    backlog_requests: Figure
    replacement_startup_s: Figure | None = None
    startup_dependencies: tuple[str, ...] = ()
    # Whether the named failure during a startup dependency's outage (no replacement starts)
    # is inside the contract; if not, it is drilled and reported as an accepted risk.
    combined_in_contract: bool = False


@dataclass(frozen=True)
class ClientSpec:
    """How the fleet's clients behave when a request is refused or fails (the drill's)."""

    max_retries: int = 0
    backoff_s: float = 1.0


@dataclass(frozen=True)
class TrafficStep:
    """Seed 003's "traffic doubles in five minutes": the step the warm pool is sized for."""

    ratio: float
    over_s: float
    autoscaler_lag_s: float


@dataclass(frozen=True)
class RiskSettings:
    unstable_hit_spread_ratio: Figure
    affinity_loss_hit_ratio: Figure


@dataclass(frozen=True)
class Requirement:
    name: str
    source: str
    failure_unit: FailureUnit
    headroom_ratio: Figure
    demand: RateDemand | TokenDemand
    replica: ReplicaCapacity
    placement: PlacementSpec
    recovery: Recovery
    cost: CostSpec
    risk: RiskSettings
    slo: SloTarget
    pool: str | None = None  # whose measured capacity replaces the stated one
    # The engine's limit on running sequences, which spans cannot show (the knee search's
    # engine uses the emulator's default, 256, unless stated).
    max_num_seqs: int | None = None
    clients: ClientSpec = ClientSpec()
    traffic_step: TrafficStep | None = None


def default_recovery_interval() -> Figure:
    return assumed(
        DEFAULT_RECOVERY_INTERVAL_S,
        "s",
        "default: no replacement counted for the first 3 minutes (seed 000's example)",
    )


def default_risk_settings() -> RiskSettings:
    return RiskSettings(
        unstable_hit_spread_ratio=assumed(
            0.1, "ratio", "default: p90 - p10 of the windowed hit ratio above 0.1 is unstable"
        ),
        affinity_loss_hit_ratio=assumed(
            0.0, "ratio", "default: with router affinity lost no prompt prefix is cached"
        ),
    )


def figures(spec: object, prefix: str = "") -> dict[str, Figure]:
    """Every figure in a spec, by dotted path, in declaration order."""
    found: dict[str, Figure] = {}
    if not is_dataclass(spec) or isinstance(spec, type):
        return found
    for item in fields(spec):
        value = getattr(spec, item.name)
        path = f"{prefix}{item.name}"
        if isinstance(value, Figure):
            found[path] = value
        else:
            found.update(figures(value, f"{path}."))
    return found


Spec = TypeVar("Spec")


def replace_figure(spec: Spec, path: str, figure: Figure) -> Spec:
    """A copy of `spec` with the figure at dotted `path` replaced."""
    if path not in figures(spec):
        raise KeyError(f"no figure at {path!r} in {type(spec).__name__}")
    head, _, rest = path.partition(".")
    current = getattr(spec, head)
    new = replace_figure(current, rest, figure) if rest else figure
    return replace(spec, **{head: new})  # type: ignore[type-var]


class _Fields(Fields):
    """A TOML table of a requirement file being read; figures carry their source."""

    error = RequirementError
    mapping_word = "table"
    key_word = "setting"

    def checked(self, key: str, value: Any, check: _Check) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"must be a number, got {value!r}")
        number = float(value)
        if not math.isfinite(number) or not check.ok(number):
            raise self.fail(key, f"must be {check.allowed}, got {value!r}")
        return number

    def figure(self, key: str, unit: str, check: _Check, default: Figure | None = None) -> Figure:
        value = self.raw(key)
        if value is None:
            if default is None:
                raise self.fail(key, f"is required ({check.allowed}, in {unit})")
            return default
        basis = f"stated in {self.where} at {self.name(key)}"
        if not isinstance(value, dict):
            return assumed(self.checked(key, value, check), unit, basis)
        inner = _Fields(value, where=self.where, path=self.name(key))
        if "value" not in value:
            raise inner.fail("value", f"is required ({check.allowed}, in {unit})")
        number = inner.checked("value", inner.raw("value"), check)
        kind_text = inner.text("kind", default=SourceKind.ASSUMED.value)
        kinds = (SourceKind.ASSUMED.value, SourceKind.MEASURED.value)
        if kind_text not in kinds:
            raise inner.fail("kind", f"is {kind_text!r}; allowed: {', '.join(kinds)}")
        basis = inner.text("basis", default=basis)
        low_raw, high_raw = inner.raw("low"), inner.raw("high")
        inner.done()
        if (low_raw is None) != (high_raw is None):
            missing = "high" if high_raw is None else "low"
            raise inner.fail(missing, "is required when the other end of the range is given")
        low = high = None
        if low_raw is not None:
            low = inner.checked("low", low_raw, check)
            high = inner.checked("high", high_raw, check)
            if not low <= number <= high:
                raise inner.fail("value", f"{number:g} lies outside its range [{low:g}, {high:g}]")
        return Figure(number, unit, SourceKind(kind_text), basis, low, high)


@dataclass(frozen=True)
class _Check:
    allowed: str
    minimum: float
    maximum: float = math.inf
    open_minimum: bool = False
    open_maximum: bool = False

    def ok(self, value: float) -> bool:
        above = value > self.minimum if self.open_minimum else value >= self.minimum
        below = value < self.maximum if self.open_maximum else value <= self.maximum
        return above and below


POSITIVE = _Check("a positive number", 0.0, open_minimum=True)
NON_NEGATIVE = _Check("a number >= 0", 0.0)
AT_LEAST_ONE = _Check("a number >= 1", 1.0)
RATIO = _Check("a ratio from 0 to 1", 0.0, 1.0)
OPEN_RATIO = _Check("a ratio strictly between 0 and 1", 0.0, 1.0, True, True)


TOKEN_DEMAND_KEYS: tuple[str, ...] = (
    "concurrent_users",
    "answer_tokens",
    "tpot_s",
    "think_and_read_s",
    "prompt_tokens",
    "cache_hit_ratio",
)


def _demand(section: _Fields) -> RateDemand | TokenDemand:
    token_keys = TOKEN_DEMAND_KEYS
    rate_given = section.has("req_per_min")
    token_given = [key for key in token_keys if section.has(key)]
    if rate_given and token_given:
        raise section.fail(
            token_given[0], "cannot be given with req_per_min: state demand one way, not both"
        )
    if rate_given:
        raw = section.raw("req_per_min")
        if isinstance(raw, str) and raw != OBSERVED:
            raise section.fail(
                "req_per_min",
                f'must be a number, or "{OBSERVED}" to measure it from the store, got {raw!r}',
            )
        observed = raw == OBSERVED
        return RateDemand(
            peak_req_per_min=None
            if observed
            else section.figure("req_per_min", "req/min", POSITIVE),
            growth_ratio=section.figure(
                "growth_ratio",
                "ratio",
                POSITIVE,
                assumed(1.0, "ratio", "default: no growth over the observed or stated peak"),
            ),
        )
    if not token_given:
        raise section.fail(
            "req_per_min", f"demand is missing: give req_per_min, or {', '.join(token_keys)}"
        )
    return TokenDemand(
        concurrent_users=section.figure("concurrent_users", "users", POSITIVE),
        answer_tokens=section.figure("answer_tokens", "tokens", POSITIVE),
        tpot_s=section.figure("tpot_s", "s", POSITIVE),
        think_and_read_s=section.figure("think_and_read_s", "s", NON_NEGATIVE),
        prompt_tokens=section.figure("prompt_tokens", "tokens", POSITIVE),
        cache_hit_ratio=section.figure("cache_hit_ratio", "ratio", RATIO),
    )


def _replica(section: _Fields) -> ReplicaCapacity:
    gpus = section.positive_whole("gpus", default=1)
    if section.has("capacity_req_per_min"):
        for key in ("decode_tokens_per_s", "prefill_tokens_per_s", "prefill_compute"):
            if section.has(key):
                raise section.fail(key, "cannot be given with capacity_req_per_min")
        return RateCapacity(
            gpus=gpus,
            capacity_req_per_min=section.figure("capacity_req_per_min", "req/min", POSITIVE),
        )
    if not section.has("decode_tokens_per_s"):
        raise section.fail(
            "capacity_req_per_min",
            "replica capacity is missing: give capacity_req_per_min, or decode_tokens_per_s "
            "with prefill_tokens_per_s (or [replica.prefill_compute]) and prefill_share_ratio",
        )
    compute: PrefillCompute | None = None
    prefill: Figure | None = None
    if section.has("prefill_compute"):
        if section.has("prefill_tokens_per_s"):
            raise section.fail("prefill_tokens_per_s", "cannot be given with prefill_compute")
        table = section.table("prefill_compute")
        compute = PrefillCompute(
            gpu_tflops=table.figure("gpu_tflops", "TFLOPS", POSITIVE),
            mfu_ratio=table.figure("mfu_ratio", "ratio", OPEN_RATIO),
            model_params=table.figure("model_params", "parameters", POSITIVE),
        )
        table.done()
    else:
        prefill = section.figure("prefill_tokens_per_s", "tokens/s", POSITIVE)
    return TokenCapacity(
        gpus=gpus,
        decode_tokens_per_s=section.figure("decode_tokens_per_s", "tokens/s", POSITIVE),
        prefill_share_ratio=section.figure("prefill_share_ratio", "ratio", OPEN_RATIO),
        prefill_tokens_per_s=prefill,
        prefill_compute=compute,
    )


def _clients(section: _Fields) -> ClientSpec:
    retries = section.raw("max_retries")
    if retries is not None and (
        isinstance(retries, bool) or not isinstance(retries, int) or retries < 0
    ):
        raise section.fail("max_retries", f"must be a whole number >= 0, got {retries!r}")
    backoff = section.raw("backoff_s")
    return ClientSpec(
        max_retries=0 if retries is None else retries,
        backoff_s=1.0 if backoff is None else section.checked("backoff_s", backoff, NON_NEGATIVE),
    )


def _traffic_step(section: _Fields) -> TrafficStep | None:
    if not section.has("ratio"):
        if section.has("over_s") or section.has("autoscaler_lag_s"):
            raise section.fail("ratio", "is required with over_s or autoscaler_lag_s (e.g. 2.0)")
        return None

    def value(key: str, default: float, check: _Check) -> float:
        raw = section.raw(key)
        return default if raw is None else section.checked(key, raw, check)

    return TrafficStep(
        ratio=value("ratio", 2.0, AT_LEAST_ONE),
        over_s=value("over_s", 300.0, POSITIVE),
        autoscaler_lag_s=value("autoscaler_lag_s", 60.0, NON_NEGATIVE),
    )


def parse_requirement(data: Mapping[str, Any], *, where: str) -> Requirement:
    """A requirement from parsed TOML; `where` names the source in error messages."""
    root = _Fields(data, where=where)
    name = root.text("name", default=Path(where).stem)
    failure_unit = root.choice("failure_unit", FailureUnit)
    headroom = root.figure(
        "headroom_ratio",
        "ratio",
        NON_NEGATIVE,
        assumed(0.0, "ratio", "default: no headroom stated"),
    )

    demand_section = root.table("demand")
    demand = _demand(demand_section)
    demand_section.done()

    replica_section = root.table("replica")
    replica = _replica(replica_section)
    pool = replica_section.text("pool")
    max_num_seqs = (
        replica_section.positive_whole("max_num_seqs", default=1)
        if replica_section.has("max_num_seqs")
        else None
    )
    replica_section.done()

    placement_section = root.table("placement")
    placement = PlacementSpec(
        replicas_per_host=placement_section.positive_whole("replicas_per_host", default=1),
        zones=placement_section.strings("zones") or ("zone-1",),
        candidate_hosts=placement_section.positive_wholes("candidate_hosts"),
        router=placement_section.choice("router", RouterPolicy, default=RouterPolicy.ROUND_ROBIN),
    )
    if len(set(placement.zones)) != len(placement.zones):
        raise placement_section.fail("zones", f"lists a zone twice: {list(placement.zones)}")
    placement_section.done()

    recovery_section = root.table("recovery")
    recovery = Recovery(
        interval_s=recovery_section.figure(
            "interval_s", "s", POSITIVE, default_recovery_interval()
        ),
        backlog_requests=recovery_section.figure(
            "backlog_requests",
            "requests",
            NON_NEGATIVE,
            assumed(0.0, "requests", "default: no queued or retried work stated at failure"),
        ),
        replacement_startup_s=(
            recovery_section.figure("replacement_startup_s", "s", POSITIVE)
            if recovery_section.has("replacement_startup_s")
            else None
        ),
        startup_dependencies=recovery_section.strings("startup_dependencies") or (),
        combined_in_contract=recovery_section.flag("combined_in_contract", default=False),
    )
    recovery_section.done()

    clients_section = root.table("clients")
    clients = _clients(clients_section)
    clients_section.done()

    step_section = root.table("traffic_step")
    traffic_step = _traffic_step(step_section)
    step_section.done()

    cost_section = root.table("cost")
    cost = CostSpec(
        usd_per_gpu_hour=(
            cost_section.figure("usd_per_gpu_hour", "usd/GPU-hour", NON_NEGATIVE)
            if cost_section.has("usd_per_gpu_hour")
            else None
        ),
        hours_per_month=cost_section.figure(
            "hours_per_month", "h/month", POSITIVE, default_hours_per_month()
        ),
    )
    cost_section.done()

    risk_section = root.table("risk")
    defaults = default_risk_settings()
    risk = RiskSettings(
        unstable_hit_spread_ratio=risk_section.figure(
            "unstable_hit_spread_ratio", "ratio", RATIO, defaults.unstable_hit_spread_ratio
        ),
        affinity_loss_hit_ratio=risk_section.figure(
            "affinity_loss_hit_ratio", "ratio", RATIO, defaults.affinity_loss_hit_ratio
        ),
    )
    risk_section.done()

    slo_section = root.table("slo")

    def optional_limit(key: str) -> float | None:
        value = slo_section.raw(key)
        return None if value is None else slo_section.checked(key, value, POSITIVE)

    limit = optional_limit("latency_limit_s")
    ttft_limit, tpot_limit = optional_limit("ttft_limit_s"), optional_limit("tpot_limit_s")
    target = slo_section.raw("target_ratio")
    target_ratio = (
        0.9 if target is None else slo_section.checked("target_ratio", target, OPEN_RATIO)
    )
    default_latency = "p95 latency"
    if ttft_limit is not None or tpot_limit is not None:
        named = [
            f"{what} <= {value:g} s"
            for what, value in (("TTFT", ttft_limit), ("TPOT", tpot_limit))
            if value is not None
        ]
        default_latency = f"{target_ratio:.0%} of requests with {' and '.join(named)}"
    slo = SloTarget(
        latency_limit_s=limit,
        latency=slo_section.text("latency", default=default_latency),
        ttft_limit_s=ttft_limit,
        tpot_limit_s=tpot_limit,
        target_ratio=target_ratio,
    )
    slo_section.done()
    root.done()
    return Requirement(
        name=name,
        source=where,
        failure_unit=failure_unit,
        headroom_ratio=headroom,
        demand=demand,
        replica=replica,
        placement=placement,
        recovery=recovery,
        cost=cost,
        risk=risk,
        slo=slo,
        pool=pool,
        max_num_seqs=max_num_seqs,
        clients=clients,
        traffic_step=traffic_step,
    )


def load_requirement(path: Path) -> Requirement:
    return parse_requirement(read_toml(path, error=RequirementError), where=str(path))
