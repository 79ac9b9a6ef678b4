"""Risk: which assumption the fleet size is most sensitive to, and how to find out if it is wrong.

Two views, as seed 000 asks ("Close with the highest-risk assumption and a measurement plan"):
- A tornado: every figure that carries a range (stated, a bootstrap interval, or p10-p90 across
  windows) is moved to each end of it with everything else held, the fleet is sized again, and
  the figures are ranked by how far the required replica count moves.
- Structural flags, risks no range captures: a capacity knee extrapolated beyond the data; all
  hosts in one zone while zone loss is in scope; an unstable cache hit ratio (and the prefill
  demand that losing router affinity would add); replacements that cannot start within the
  recovery interval or depend on a service that may be down with the failure.
Flags also widen ranges where the structure says the observed range is too kind: an extrapolated
knee's low end is the highest load actually observed (see capacity_fit), and an unstable hit
ratio's low end is the ratio with router affinity lost. So the riskiest assumption follows the
data: the top of the tornado, unless no fleet meets the requirement at all, when the placement
itself is the risk.

The measurement plan names, for the riskiest assumption, the value at which the recommended fleet
stops meeting the requirement (found by bisection), so a measurement can disprove the answer;
and it always ends with the seed's failure drill.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from servewatch.capacity.cache_hit_rate import HitRatioSpread
from servewatch.capacity.capacity_fit import KneeFit
from servewatch.capacity.demand import TokenDemand, affinity_loss_prefill
from servewatch.capacity.figure import Figure, fmt
from servewatch.capacity.fleet_size import FleetSize
from servewatch.capacity.placement import NO_LAYOUT, FailureUnit, Layout
from servewatch.capacity.requirement import Requirement, figures, replace_figure
from servewatch.capacity.sizing import RateCapacity, prefill_rate

_BISECTION_STEPS = 60
_TINY = 1e-9


class FleetSizer(Protocol):
    def __call__(self, requirement: Requirement) -> FleetSize: ...


class FlagKind(Enum):
    EXTRAPOLATED_KNEE = "extrapolated knee"
    SINGLE_ZONE = "single zone"
    UNSTABLE_CACHE_HIT_RATE = "unstable cache hit rate"
    STARTUP_DEPENDENCY = "startup dependency"


@dataclass(frozen=True)
class RiskFlag:
    kind: FlagKind
    path: str
    message: str


@dataclass(frozen=True)
class TornadoBar:
    """One assumption moved over its range; replicas None where no fleet meets the requirement."""

    path: str
    figure: Figure
    low: float
    high: float
    replicas_at_low: int | None
    replicas_at_high: int | None
    replicas_exact_at_low: float
    replicas_exact_at_high: float

    @property
    def swing_replicas(self) -> float:
        if self.replicas_at_low is None or self.replicas_at_high is None:
            return math.inf if self.replicas_at_low != self.replicas_at_high else 0.0
        return float(abs(self.replicas_at_high - self.replicas_at_low))

    @property
    def swing_exact(self) -> float:
        return abs(self.replicas_exact_at_high - self.replicas_exact_at_low)


@dataclass(frozen=True)
class Riskiest:
    path: str
    reason: str
    break_even: float | None
    measurement_plan: tuple[str, ...]


@dataclass(frozen=True)
class RiskAssessment:
    tornado: tuple[TornadoBar, ...]
    unranged: tuple[str, ...]
    flags: tuple[RiskFlag, ...]
    riskiest: Riskiest | None


def capacity_path(requirement: Requirement) -> str:
    if isinstance(requirement.replica, RateCapacity):
        return "replica.capacity_req_per_min"
    return "replica.decode_tokens_per_s"


def _resize(
    requirement: Requirement, path: str, value: float, sizer: FleetSizer
) -> tuple[int | None, float]:
    figure = figures(requirement)[path]
    fleet = sizer(replace_figure(requirement, path, figure.with_value(value)))
    return fleet.replicas, fleet.chain.replicas_with_headroom.value


def tornado(requirement: Requirement, *, sizer: FleetSizer) -> tuple[TornadoBar, ...]:
    """Bars for every ranged figure, widest swing first. An unbounded end is not evaluated."""
    bars = []
    for path, figure in figures(requirement).items():
        if figure.low is None or figure.high is None:
            continue
        ends = [end if math.isfinite(end) else figure.value for end in (figure.low, figure.high)]
        (low_r, low_x), (high_r, high_x) = (_resize(requirement, path, e, sizer) for e in ends)
        bars.append(TornadoBar(path, figure, ends[0], ends[1], low_r, high_r, low_x, high_x))
    return tuple(sorted(bars, key=lambda bar: (-bar.swing_replicas, -bar.swing_exact)))


def break_even(
    requirement: Requirement, bar: TornadoBar, *, replicas: int, sizer: FleetSizer
) -> float | None:
    """The value of `bar`'s figure at which `replicas` stop meeting the requirement.

    Searched from the stated value toward the end of the range that needs more replicas, on to
    the figure's limit (0 or 1 for a ratio, 0 or unbounded otherwise); None if it never flips.
    """

    def fails(value: float) -> bool:
        needed, _ = _resize(requirement, bar.path, value, sizer)
        return needed is None or needed > replicas

    worse_high = (bar.replicas_exact_at_high, bar.replicas_at_high or 0) > (
        bar.replicas_exact_at_low,
        bar.replicas_at_low or 0,
    )
    holds = bar.figure.value
    if worse_high:
        limit = 1.0 - _TINY if bar.figure.unit == "ratio" else max(holds, 1.0) * 2.0
        while not fails(limit):
            if bar.figure.unit == "ratio" or limit > 1e12:
                return None
            limit *= 2.0
    else:
        limit = _TINY if bar.figure.unit == "ratio" else holds * _TINY
        if not fails(limit):
            return None
    for _ in range(_BISECTION_STEPS):
        middle = (holds + limit) / 2.0
        if fails(middle):
            limit = middle
        else:
            holds = middle
    return holds


def structural_flags(
    requirement: Requirement,
    fleet: FleetSize,
    *,
    fit: KneeFit | None,
    hit_ratio: HitRatioSpread | None,
    layout: Layout,
) -> tuple[RiskFlag, ...]:
    flags: list[RiskFlag] = []
    if fit is not None and fit.extrapolated:
        if math.isinf(fit.knee_load):
            message = (
                f"the fit located no knee up to {fmt(fit.load_max)} {fit.load_unit.value} "
                "(extrapolated without bound), so the data bounds no capacity: the stated "
                "capacity stands unmeasured"
            )
        else:
            message = (
                f"the capacity knee ({fmt(fit.knee_load)} {fit.load_unit.value}) is "
                f"extrapolated {fit.extrapolation_ratio:.1f}x beyond the highest observed load "
                f"({fmt(fit.load_max)} {fit.load_unit.value}): the fit was never seen to hold "
                "there"
            )
        flags.append(RiskFlag(FlagKind.EXTRAPOLATED_KNEE, capacity_path(requirement), message))
    zones = sorted(set(requirement.placement.zones) | set(layout.zones))
    if len(zones) == 1 and requirement.failure_unit is not FailureUnit.NONE:
        if requirement.failure_unit is FailureUnit.ZONE:
            message = fleet.table.infeasible_reason or f"all hosts sit in zone {zones[0]!r}"
        else:
            message = (
                f"all hosts sit in zone {zones[0]!r}: the table shows "
                f"{requirement.failure_unit.value} loss only; a zone outage takes the whole fleet "
                "and is outside this requirement"
            )
        flags.append(RiskFlag(FlagKind.SINGLE_ZONE, "placement.zones", message))
    if hit_ratio is not None:
        flag = _hit_ratio_flag(requirement, fleet, hit_ratio)
        if flag is not None:
            flags.append(flag)
    flag = _startup_flag(requirement)
    if flag is not None:
        flags.append(flag)
    return tuple(flags)


def _hit_ratio_flag(
    requirement: Requirement, fleet: FleetSize, hit_ratio: HitRatioSpread
) -> RiskFlag | None:
    threshold = requirement.risk.unstable_hit_spread_ratio.value
    if hit_ratio.spread_ratio <= threshold:
        return None
    head = (
        f"the cache hit ratio is unstable: {hit_ratio.summary()}, p90 - p10 = "
        f"{fmt(hit_ratio.spread_ratio)} > {fmt(threshold)}"
    )
    demand, replica = requirement.demand, requirement.replica
    if not isinstance(demand, TokenDemand):
        return RiskFlag(
            FlagKind.UNSTABLE_CACHE_HIT_RATE,
            "demand.cache_hit_ratio",
            f"{head}; demand is stated in requests, so the prefill it adds cannot be counted: "
            "state the token model to size for it",
        )
    lost = requirement.risk.affinity_loss_hit_ratio.value
    extra = affinity_loss_prefill(demand, affinity_loss_hit_ratio=lost)
    message = (
        f"{head}; losing router affinity (hit ratio {fmt(lost)}) would add {extra.text()} of "
        "prefill"
    )
    if not isinstance(replica, RateCapacity) and fleet.demand.prefill_tokens_per_s is not None:
        budget = prefill_rate(replica).value * replica.prefill_share_ratio.value
        total = fleet.demand.prefill_tokens_per_s.value + extra.value
        message += (
            f", {fmt(total / budget)} replicas' worth at the budgeted prefill share against "
            f"{fmt(fleet.chain.replicas_before_headroom.value)} sized for demand before headroom"
        )
    return RiskFlag(FlagKind.UNSTABLE_CACHE_HIT_RATE, "demand.cache_hit_ratio", message)


def _startup_flag(requirement: Requirement) -> RiskFlag | None:
    recovery = requirement.recovery
    startup = recovery.replacement_startup_s
    slow = startup is not None and startup.value > recovery.interval_s.value
    if not slow and not recovery.startup_dependencies:
        return None
    parts = []
    if startup is not None and slow:
        parts.append(
            f"replacements take {startup.text()} to start, longer than the "
            f"{recovery.interval_s.text()} recovery interval: until they are ready the fleet "
            "runs on its reserve and a second failure is not covered"
        )
    if recovery.startup_dependencies:
        deps = ", ".join(recovery.startup_dependencies)
        parts.append(
            f"replacements cannot start without {deps}: ready replicas keep serving through an "
            f"outage of it, but recovery stops, so a {requirement.failure_unit.value} loss "
            f"together with that outage is outside the requirement"
        )
    return RiskFlag(FlagKind.STARTUP_DEPENDENCY, "recovery.replacement_startup_s", "; ".join(parts))


def _plan_for(requirement: Requirement, path: str, threshold: str, fit: KneeFit | None) -> str:
    leaf = path.rsplit(".", 1)[-1]
    plans: dict[str, Callable[[], str]] = {
        "cache_hit_ratio": lambda: (
            "Measure increase(vllm:prefix_cache_hits_total) / "
            "increase(vllm:prefix_cache_queries_total) per replica and hour at peak for a week "
            "that includes a rollout and a replica restart (router affinity lost); the answer "
            f"is wrong if the peak-hour ratio {threshold}."
        ),
        "capacity_req_per_min": lambda: _capacity_plan(requirement, threshold, fit),
        "decode_tokens_per_s": lambda: _capacity_plan(requirement, threshold, fit),
        "prefill_share_ratio": lambda: (
            "Measure prefill's share of replica time (sum of vllm:request_prefill_time_seconds "
            f"per replica over wall time) at peak; the answer is wrong if it {threshold}."
        ),
        "headroom_ratio": lambda: (
            "Compare the peak minute with the peak-hour mean of arrivals over 30 days; the "
            f"answer is wrong if the spike needs headroom that {threshold}."
        ),
    }
    default = f"Measure {path} directly under peak traffic; the answer is wrong if it {threshold}."
    return plans.get(leaf, lambda: default)()


def _capacity_plan(requirement: Requirement, threshold: str, fit: KneeFit | None) -> str:
    observed = ""
    if fit is not None and fit.extrapolated:
        observed = (
            f"Observed load reached only {fmt(fit.load_max)} {fit.load_unit.value}, "
            f"{fit.extrapolation_ratio:.1f}x short of the fitted knee. "
        )
    return (
        f"{observed}Step one replica's load under a matched workload (the measured prompt and "
        f"output mix) up to and past the knee, recording {requirement.slo.latency} at each step; "
        f"the answer is wrong if per-replica capacity at the SLO {threshold}."
    )


def failure_drill(requirement: Requirement, fleet: FleetSize) -> str:
    """Seed 000's verification: remove the failure unit under matched load and measure."""
    unit = requirement.failure_unit
    demand = f"{fmt(fleet.demand.req_per_min.value)} req/min"
    if unit is FailureUnit.NONE:
        return (
            f"Run a matched workload at {demand} on the recommended fleet and measure "
            f"{requirement.slo.latency}, queue age and useful completions; the answer is "
            "disproved if useful completions fall below the demand. No failure is in scope, "
            "so any lost replica breaks the promise."
        )
    drill = (
        f"Remove one {unit.value} during a matched workload at {demand}; measure ready "
        "capacity, routing skew, retries, queue age and useful completions, then observe "
        "replacement warm-up. The answer is disproved if useful completions fall below the "
        f"demand within the {requirement.recovery.interval_s.text()} recovery interval."
    )
    if requirement.recovery.startup_dependencies:
        deps = ", ".join(requirement.recovery.startup_dependencies)
        drill += f" Repeat with {deps} unavailable if that combination is in scope."
    return drill


def _threshold_text(bar: TornadoBar, value: float | None, replicas: int) -> str:
    if value is None:
        return f"moves far enough to need more than {replicas} replicas (no single value does)"
    worse_high = bar.replicas_exact_at_high > bar.replicas_exact_at_low
    direction = "rises above" if worse_high else "falls below"
    return f"{direction} {fmt(value)} {bar.figure.unit} (where {replicas} replicas stop sufficing)"


def assess_risk(
    requirement: Requirement,
    fleet: FleetSize,
    *,
    sizer: FleetSizer,
    fit: KneeFit | None = None,
    hit_ratio: HitRatioSpread | None = None,
    layout: Layout = NO_LAYOUT,
) -> RiskAssessment:
    bars = tornado(requirement, sizer=sizer)
    unranged = tuple(path for path, f in figures(requirement).items() if not f.has_range)
    flags = structural_flags(requirement, fleet, fit=fit, hit_ratio=hit_ratio, layout=layout)
    drill = failure_drill(requirement, fleet)
    replicas = fleet.replicas
    if replicas is None:
        reason = fleet.table.infeasible_reason or "no candidate fleet meets the requirement"
        riskiest = Riskiest("placement.zones", reason, None, (drill,))
    elif bars and bars[0].swing_exact > 0:
        top = bars[0]
        value = break_even(requirement, top, replicas=replicas, sizer=sizer)
        reason = (
            f"moving {top.path} over its range {fmt(top.low)} to {fmt(top.high)} "
            f"{top.figure.unit} moves the fleet from {_count(top.replicas_at_low)} to "
            f"{_count(top.replicas_at_high)} replicas, the widest swing of {len(bars)} ranged "
            "assumptions"
        )
        related = [flag.message for flag in flags if flag.path == top.path]
        if related:
            reason += "; " + "; ".join(related)
        plan = _plan_for(requirement, top.path, _threshold_text(top, value, replicas), fit)
        riskiest = Riskiest(top.path, reason, value, (plan, drill))
    elif flags:
        riskiest = Riskiest(flags[0].path, flags[0].message, None, (drill,))
    else:
        riskiest = None
    return RiskAssessment(tornado=bars, unranged=unranged, flags=flags, riskiest=riskiest)


def _count(replicas: int | None) -> str:
    return "no feasible fleet" if replicas is None else str(replicas)
