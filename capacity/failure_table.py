"""Failure table: for candidate host counts, capacity healthy and after the named failure.

This is seed 000's worksheet made executable. For each candidate fleet (today's layout grown
host by host into the allowed zones, or with hosts taken away) it gives healthy capacity;
capacity after losing one replica, one host and one zone, counted from where replicas actually
sit; the maximum admission that keeps the failure promise; how long the backlog takes to drain
after the failure; the monthly cost; and the cost of the reserve (what is bought beyond the
smallest fleet that meets healthy demand, which may be smaller than today's).

The promise: after losing the named unit, with no replacement counted during the recovery
interval, the survivors carry the demand and clear the backlog within that interval. So the
admission that keeps it is the failed-state capacity less the rate that clears the backlog in
time, and a fleet meets the requirement when that admission still covers the demand. Admitting
more than that in healthy times sells capacity the failure would take away (seed 000: "If the
service admits 240 and then loses one host, surviving 160 capacity is insufficient").

Rates are in one `RateUnit` per table (req/min for the seed's worksheet; decode or prefill
tokens/s when the sizing chain is bound by tokens), so demand and capacity cannot be mixed up.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from servewatch.capacity.cost import usd_per_month
from servewatch.capacity.figure import fmt
from servewatch.capacity.placement import NO_LAYOUT, FailureUnit, Footprint, Layout

# Float sums such as 4 x 30 - 30 must meet a demand of exactly 90.
_TOLERANCE = 1e-9
ANOTHER_ZONE = "another zone"
# Far beyond the fleets this sizes; a requirement needing more is reported as not met.
MAX_HOSTS = 100_000
_POSITIVE = frozenset(
    {"replica_rate", "replicas_per_host", "gpus_per_replica", "hours_per_month"}
    | {"recovery_interval_s"}
)


class RateUnit(Enum):
    REQ_PER_MIN = "req/min"
    DECODE_TOKENS_PER_S = "decode tokens/s"
    PREFILL_TOKENS_PER_S = "prefill tokens/s"

    @property
    def seconds(self) -> float:
        """Length of the rate's time unit in seconds."""
        return 60.0 if self is RateUnit.REQ_PER_MIN else 1.0

    @property
    def work(self) -> str:
        """What one unit of backlog is."""
        return {
            RateUnit.REQ_PER_MIN: "requests",
            RateUnit.DECODE_TOKENS_PER_S: "decode tokens",
            RateUnit.PREFILL_TOKENS_PER_S: "prefill tokens",
        }[self]


@dataclass(frozen=True)
class FailureTableSpec:
    """Inputs of the table; `demand_rate` and `replica_rate` are in `unit`.

    `demand_rate` is what arrives and must be carried (headroom included); `replica_rate` is one
    replica's capacity at the SLO; `backlog_work` is what is queued or being retried when the
    failure strikes, in `unit.work`.
    """

    demand_rate: float
    replica_rate: float
    unit: RateUnit
    failure_unit: FailureUnit
    zones: tuple[str, ...]
    replicas_per_host: int
    gpus_per_replica: int
    usd_per_gpu_hour: float | None
    hours_per_month: float
    recovery_interval_s: float
    backlog_work: float = 0.0
    initial: Layout = NO_LAYOUT
    candidate_hosts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        checks = {
            "demand_rate": self.demand_rate >= 0,
            "replica_rate": self.replica_rate > 0,
            "replicas_per_host": self.replicas_per_host >= 1,
            "gpus_per_replica": self.gpus_per_replica >= 1,
            "usd_per_gpu_hour": self.usd_per_gpu_hour is None or self.usd_per_gpu_hour >= 0,
            "hours_per_month": self.hours_per_month > 0,
            "recovery_interval_s": self.recovery_interval_s > 0,
            "backlog_work": self.backlog_work >= 0,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if not ok or (value is not None and not math.isfinite(float(value))):
                raise ValueError(
                    f"failure table: {name} is {value!r}; allowed: a finite "
                    f"number, {'> 0' if name in _POSITIVE else '>= 0'}"
                )
        if not self.zones:
            raise ValueError("failure table: zones is empty; name at least one zone to add hosts")
        for hosts in self.candidate_hosts:
            if hosts < 1:
                raise ValueError(f"failure table: candidate of {hosts} hosts; allowed: 1 or more")

    @property
    def backlog_clear_rate(self) -> float:
        """Extra rate (in `unit`) that clears the backlog within the recovery interval."""
        return self.backlog_work / self.recovery_interval_s * self.unit.seconds


@dataclass(frozen=True)
class FailureRow:
    hosts: int
    replicas: int
    zones: int
    healthy_capacity: float
    after_replica_loss: float
    after_host_loss: float
    after_zone_loss: float
    failed_capacity: float
    max_admission: float
    drain_rate: float
    drain_s: float | None
    meets_healthy: bool
    meets_failure: bool
    usd_per_month: float | None
    reserve_usd_per_month: float | None


@dataclass(frozen=True)
class FailureTable:
    spec: FailureTableSpec
    rows: tuple[FailureRow, ...]
    minimum: FailureRow | None
    healthy_minimum: FailureRow | None
    infeasible_reason: str | None


def _meets(rate: float, demand: float) -> bool:
    return rate >= demand - _TOLERANCE * max(1.0, demand)


def failure_row(
    spec: FailureTableSpec, footprint: Footprint, *, healthy_replicas: int
) -> FailureRow:
    """One candidate fleet; `healthy_replicas` is the smallest fleet meeting healthy demand."""
    rate = float(spec.replica_rate)
    failed = footprint.replicas_after_loss(spec.failure_unit) * rate
    max_admission = max(0.0, failed - spec.backlog_clear_rate)
    drain_rate = failed - spec.demand_rate
    drain_s: float | None
    if drain_rate > 0:
        drain_s = spec.backlog_work / drain_rate * spec.unit.seconds
    elif drain_rate == 0 and spec.backlog_work == 0:
        drain_s = 0.0
    else:
        drain_s = None
    per_replica_usd = (
        None
        if spec.usd_per_gpu_hour is None
        else usd_per_month(
            replicas=1,
            gpus_per_replica=spec.gpus_per_replica,
            usd_per_gpu_hour=spec.usd_per_gpu_hour,
            hours_per_month=spec.hours_per_month,
        )
    )
    reserve = max(0, footprint.replicas - healthy_replicas)
    return FailureRow(
        hosts=footprint.hosts,
        replicas=footprint.replicas,
        zones=footprint.zones,
        healthy_capacity=footprint.replicas * rate,
        after_replica_loss=footprint.replicas_after_loss(FailureUnit.REPLICA) * rate,
        after_host_loss=footprint.replicas_after_loss(FailureUnit.HOST) * rate,
        after_zone_loss=footprint.replicas_after_loss(FailureUnit.ZONE) * rate,
        failed_capacity=failed,
        max_admission=max_admission,
        drain_rate=drain_rate,
        drain_s=drain_s,
        meets_healthy=_meets(footprint.replicas * rate, spec.demand_rate),
        meets_failure=_meets(max_admission, spec.demand_rate),
        usd_per_month=None if per_replica_usd is None else footprint.replicas * per_replica_usd,
        reserve_usd_per_month=None if per_replica_usd is None else reserve * per_replica_usd,
    )


def _search_bound(spec: FailureTableSpec) -> int:
    # With hosts spread over two or more zones, losing any one unit keeps at least half of the
    # hosts minus one, so this many hosts always suffice when any number does.
    per_host = spec.replica_rate * spec.replicas_per_host
    needed = (spec.demand_rate + spec.backlog_clear_rate) / per_host
    bound = len(spec.initial.hosts) + 2 * min(needed, MAX_HOSTS) + 2 * len(spec.zones) + 2
    return min(math.ceil(bound), MAX_HOSTS)


def _footprint(spec: FailureTableSpec, hosts: int) -> Footprint:
    return spec.initial.resized(
        hosts=hosts, zones=spec.zones, replicas_per_host=spec.replicas_per_host
    )


def _first(start: int, bound: int, meets: Callable[[int], bool]) -> int | None:
    """Smallest host count in [start, bound] that meets; capacity only grows with hosts."""
    if not meets(bound):
        return None
    low, high = start, bound
    while low < high:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _infeasible_reason(spec: FailureTableSpec, bound: int) -> str:
    zones = sorted(set(spec.initial.zones) | set(spec.zones))
    what = f"losing one {spec.failure_unit.value}"
    if spec.failure_unit is FailureUnit.ZONE and len(zones) == 1:
        alternative = build_failure_table(
            replace(spec, zones=(*spec.zones, ANOTHER_ZONE), candidate_hosts=())
        ).minimum
        instead = (
            f"; spread over zone {zones[0]!r} and {ANOTHER_ZONE}, {alternative.hosts} hosts "
            f"({alternative.replicas} replicas) meet it"
            if alternative is not None
            else ""
        )
        return (
            f"all hosts sit in zone {zones[0]!r} and zone loss is required: {what} leaves no "
            f"capacity, so adding hosts in zone {zones[0]!r} cannot meet the requirement; place "
            f"independent capacity in another zone{instead}"
        )
    return (
        f"no fleet of up to {bound:,} hosts grown in zones {', '.join(map(repr, spec.zones))} "
        f"keeps {fmt(spec.demand_rate)} {spec.unit.value} after {what}: adding hosts there "
        "cannot meet the requirement; add zones, raise per-replica capacity or lower the "
        "failure target"
    )


def build_failure_table(spec: FailureTableSpec) -> FailureTable:
    """Rows from a fleet that fails (the smallest meeting healthy demand when it fails the
    failure promise, as in seed 000's table, else one host fewer) to one past the answer.
    Fleets smaller than today's layout are candidates too (`Layout.shrunk`): the answer may
    be to remove hosts, and the reserve is counted from the smallest fleet that meets healthy
    demand, whatever today's size."""
    start = 1
    bound = max(_search_bound(spec), *spec.candidate_hosts, start)

    def row_at(hosts: int, healthy_replicas: int = 0) -> FailureRow:
        return failure_row(spec, _footprint(spec, hosts), healthy_replicas=healthy_replicas)

    healthy_hosts = _first(start, bound, lambda hosts: row_at(hosts).meets_healthy)
    minimum_hosts = _first(start, bound, lambda hosts: row_at(hosts).meets_failure)
    healthy_replicas = _footprint(spec, healthy_hosts).replicas if healthy_hosts is not None else 0
    # The first row fails (healthy demand, or the failure promise), as in seed 000's table.
    first = start
    if healthy_hosts is not None:
        promised = minimum_hosts if minimum_hosts is not None else healthy_hosts + 1
        first = max(start, min(healthy_hosts, promised - 1))
    last = minimum_hosts + 1 if minimum_hosts is not None else first + 2
    candidates = spec.candidate_hosts or tuple(range(first, max(last, first + 1) + 1))
    return FailureTable(
        spec=spec,
        rows=tuple(row_at(hosts, healthy_replicas) for hosts in sorted(set(candidates))),
        minimum=row_at(minimum_hosts, healthy_replicas) if minimum_hosts is not None else None,
        healthy_minimum=(
            row_at(healthy_hosts, healthy_replicas) if healthy_hosts is not None else None
        ),
        infeasible_reason=None if minimum_hosts is not None else _infeasible_reason(spec, bound),
    )
