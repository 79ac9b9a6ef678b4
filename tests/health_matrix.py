"""The detection benchmark: a seeded matrix of emulated fleets, clean and faulted, that
`servewatch health` is held to (tests/test_health_matrix.py; `python -m tests.health_matrix`
prints the table docs/health.md shows).

Fleets differ in size (4-16 replicas on 2-4 hosts in 2 zones), router (least-loaded and
prefix-affinity), load (Poisson at a normal or a hot rate, a diurnal rise, short bursts) and
seed. Each faulted case injects one fault at a strong or a marginal magnitude and names what a
right answer is: the finding kind, its scope, and when it starts. A fault's cost is measured
from the recording itself, as the budget it burned: requests that failed or missed the
goodput limits during the fault (and the minutes after it, while the fleet recovers), beyond
what the same fleet's other minutes make bad, against a 99 % objective over the recording.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import Enum
from pathlib import Path
from tempfile import TemporaryDirectory

import polars as pl

from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet_config import FleetConfig, RouterPolicy, TopologySpec
from servewatch.emulator.workload import ArrivalKind, ArrivalSpec, RateStep
from servewatch.health.detectors import default_detectors
from servewatch.health.finding import Evidence, Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.health_service import run_detectors
from servewatch.pipeline.request_sli import GoodputLimits, with_good, with_tpot
from tests.health_fleet import START, fleet_config, recorded_inputs

MINUTES = 45
FAULT_AT_S = 15 * 60
FAULT_FOR_S = 10 * 60
LIMITS = GoodputLimits(ttft_s=0.5, tpot_s=0.05)
OBJECTIVE_RATIO = 0.99
# A fault that burned less than this share of the recording's budget need not be found.
MATERIAL_BUDGET_RATIO = 0.01
MAX_DELAY = timedelta(minutes=3)
# The recovery minutes after a fault whose bad requests are still the fault's.
RECOVERY = timedelta(minutes=5)
MODEL = FleetConfig().model
LEAST, AFFINITY = RouterPolicy.LEAST_LOADED, RouterPolicy.PREFIX_AFFINITY
# Requests per second and replica: the emulated replica holds its SLO to about 2.
NORMAL_RPS, HOT_RPS = 1.0, 1.6


class Load(Enum):
    POISSON = "poisson"
    DIURNAL = "diurnal"
    BURSTY = "bursty"


@dataclass(frozen=True)
class Expected:
    """A right answer: a top-level finding of `kind` on `scope_unit` `scope` starting within
    `MAX_DELAY` of `at` (never more than a minute before it)."""

    kind: FindingKind
    scope_unit: ScopeUnit
    scope: str
    at: datetime
    # Faults whose window of harm runs past the injection (a loss's replacement).
    until: datetime


@dataclass(frozen=True)
class Case:
    name: str
    replicas: int
    router: RouterPolicy
    rate_rps_per_replica: float = NORMAL_RPS
    load: Load = Load.POISSON
    failures: tuple[FailureSpec, ...] = ()
    steps: tuple[RateStep, ...] = ()
    expected: tuple[Expected, ...] = ()
    magnitude: str = ""
    seed: int = 7
    # What the finding's magnitude must read, for slow replicas: (low, high) slowdown.
    slowdown_range: tuple[float, float] | None = None

    def topology(self) -> TopologySpec:
        """Two zones; hosts of two replicas up to 8 replicas, of four above."""
        per_host = 2 if self.replicas <= 8 else 4
        hosts = self.replicas // per_host
        return TopologySpec(
            zones=("zone-a", "zone-b"),
            hosts_per_zone=(hosts - hosts // 2, hosts // 2),
            replicas_per_host=per_host,
        )

    def config(self) -> FleetConfig:
        rate = self.rate_rps_per_replica * self.replicas
        base = fleet_config(
            failures=self.failures,
            steps=self.steps,
            topology=self.topology(),
            router=self.router,
            rate_rps=rate,
        )
        # The demo's large-model profile: prefill fast enough that a clean fleet meets a
        # 500 ms TTFT, decode steps near the 50 ms TPOT limit's half.
        engine = replace(
            base.engine,
            step_base_s=0.025,
            step_per_seq_s=0.0004,
            step_per_prefill_token_s=0.00004,
            max_num_seqs=20,
        )
        arrival = base.workload.arrival
        if self.load == Load.DIURNAL:
            # At midnight with the peak at 06:00 the rate climbs its steepest: +10 % in 45 min.
            arrival = ArrivalSpec(kind=ArrivalKind.DIURNAL, rate_rps=rate, peak_hour_utc=6.0)
        elif self.load == Load.BURSTY:
            bursts = tuple(
                step
                for at_s in range(120, MINUTES * 60, 300)
                for step in (RateStep(at_s, rate * 2.0), RateStep(at_s + 20, rate))
            )
            arrival = ArrivalSpec(kind=ArrivalKind.STEPS, rate_rps=rate, steps=bursts)
        return replace(base, engine=engine, workload=replace(base.workload, arrival=arrival))


def _at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def _expect(
    kind: FindingKind, unit: ScopeUnit, scope: str, at_s: float, until_s: float
) -> tuple[Expected, ...]:
    return (Expected(kind, unit, scope, _at(at_s), _at(until_s)),)


def _replica_fault(
    kind: FailureKind, target: str, *, found: FindingKind, **options: float
) -> tuple[tuple[FailureSpec, ...], tuple[Expected, ...]]:
    spec = FailureSpec(kind, at_s=FAULT_AT_S, target=target, duration_s=FAULT_FOR_S, **options)  # type: ignore[arg-type]
    end = FAULT_AT_S + FAULT_FOR_S
    return (spec,), _expect(found, ScopeUnit.REPLICA, target, FAULT_AT_S, end)


def _step(rate: float, ratio: float) -> tuple[RateStep, ...]:
    return (
        RateStep(FAULT_AT_S, rate * ratio),
        RateStep(FAULT_AT_S + FAULT_FOR_S, rate),
    )


def _cases() -> Iterator[Case]:
    # Clean fleets: nothing may be found.
    yield Case("clean-4-least", 4, LEAST)
    yield Case("clean-6-affinity-diurnal", 6, AFFINITY, load=Load.DIURNAL, seed=11)
    yield Case("clean-8-least-bursty", 8, LEAST, load=Load.BURSTY, seed=12)
    yield Case("clean-12-affinity-hot", 12, AFFINITY, rate_rps_per_replica=HOT_RPS, seed=13)
    yield Case("clean-16-least-diurnal", 16, LEAST, load=Load.DIURNAL, seed=14)
    yield Case("clean-8-affinity-hot-bursty", 8, AFFINITY, HOT_RPS, load=Load.BURSTY, seed=15)

    # The ranges a slow replica's magnitude must read in: the 2.7-3.3 for x3 and
    # 1.4-1.8 for x1.6, and 10 % either way for x2.
    for name, n, router, factor, strength, seed, read in (
        ("slow-x3-affinity", 6, AFFINITY, 3.0, "strong", 21, (2.7, 3.3)),
        ("slow-x1.6-least", 8, LEAST, 1.6, "marginal", 22, (1.4, 1.8)),
        ("slow-x1.6-affinity", 6, AFFINITY, 1.6, "marginal", 23, (1.4, 1.8)),
        ("slow-x2-least-16", 16, LEAST, 2.0, "strong", 24, (1.8, 2.2)),
    ):
        failures, expected = _replica_fault(
            FailureKind.SLOW_REPLICA, "vllm-1", found=FindingKind.SLOW_REPLICA, factor=factor
        )
        yield Case(
            name,
            n,
            router,
            failures=failures,
            expected=expected,
            magnitude=f"x{factor:g} ({strength})",
            seed=seed,
            slowdown_range=read,
        )
    for name, n, router, ratio, strength, seed in (
        ("errors-80-least", 6, LEAST, 0.8, "strong", 31),
        ("errors-20-affinity", 8, AFFINITY, 0.2, "marginal", 32),
        ("errors-50-affinity-4", 4, AFFINITY, 0.5, "strong", 33),
        ("errors-10-least", 8, LEAST, 0.1, "marginal", 34),
    ):
        failures, expected = _replica_fault(
            FailureKind.ERROR_BURST, "vllm-2", found=FindingKind.ERROR_BURST, error_ratio=ratio
        )
        yield Case(
            name,
            n,
            router,
            failures=failures,
            expected=expected,
            magnitude=f"{ratio:.0%} failing ({strength})",
            seed=seed,
        )
    for name, n, router, rps, ratio, strength, seed in (
        ("step-x1.65-least-hot", 12, LEAST, HOT_RPS, 1.65, "marginal", 41),
        # Just past the knee: the engines batch the extra requests and hardly queue.
        ("step-x1.65-least", 12, LEAST, 1.2, 1.65, "marginal", 45),
        ("step-x2.1-affinity", 6, AFFINITY, NORMAL_RPS, 2.1, "marginal", 42),
        ("step-x2.1-least", 8, LEAST, NORMAL_RPS, 2.1, "marginal", 43),
        ("step-x4-least", 6, LEAST, NORMAL_RPS, 4.0, "strong", 44),
    ):
        end = FAULT_AT_S + FAULT_FOR_S
        yield Case(
            name,
            n,
            router,
            rate_rps_per_replica=rps,
            steps=_step(rps * n, ratio),
            expected=_expect(FindingKind.TRAFFIC_STEP, ScopeUnit.POOL, "default", FAULT_AT_S, end),
            magnitude=f"x{ratio:g} load ({strength})",
            seed=seed,
        )
    for name, n, router, rps, host, seed in (
        ("host-loss-affinity", 6, AFFINITY, NORMAL_RPS, "host-1", 51),
        ("host-loss-least-12", 12, LEAST, HOT_RPS, "host-0", 52),
        ("host-loss-affinity-4", 4, AFFINITY, NORMAL_RPS, "host-1", 53),
    ):
        end = FAULT_AT_S + FAULT_FOR_S
        yield Case(
            name,
            n,
            router,
            rate_rps_per_replica=rps,
            failures=(FailureSpec(FailureKind.HOST_LOSS, FAULT_AT_S, host, FAULT_FOR_S),),
            expected=_expect(FindingKind.HOST_LOSS, ScopeUnit.HOST, host, FAULT_AT_S, end),
            magnitude="a host of 2-4 replicas",
            seed=seed,
        )
    for name, n, router, rps, seed in (
        ("zone-loss-least-12", 12, LEAST, 0.5, 61),
        ("zone-loss-affinity-8", 8, AFFINITY, NORMAL_RPS, 62),
    ):
        end = FAULT_AT_S + FAULT_FOR_S
        yield Case(
            name,
            n,
            router,
            rate_rps_per_replica=rps,
            failures=(FailureSpec(FailureKind.ZONE_LOSS, FAULT_AT_S, "zone-a", FAULT_FOR_S),),
            expected=_expect(FindingKind.ZONE_LOSS, ScopeUnit.ZONE, "zone-a", FAULT_AT_S, end),
            magnitude="half the fleet or more",
            seed=seed,
        )
    for name, n, router, factor, strength, seed in (
        ("kv-squeeze-x100-affinity", 6, AFFINITY, 100.0, "strong", 71),
        ("kv-squeeze-x8-least", 6, LEAST, 8.0, "marginal", 72),
        ("kv-squeeze-x16-least", 6, LEAST, 16.0, "marginal", 73),
    ):
        failures, expected = _replica_fault(
            FailureKind.KV_SQUEEZE, "vllm-3", found=FindingKind.KV_PRESSURE, factor=factor
        )
        yield Case(
            name,
            n,
            router,
            rate_rps_per_replica=HOT_RPS,
            failures=failures,
            expected=expected,
            magnitude=f"KV / {factor:g} ({strength})",
            seed=seed,
        )
    for name, n, router, factor, strength, seed in (
        ("rollout-x2-affinity", 6, AFFINITY, 2.0, "strong", 81),
        ("rollout-x1.5-least", 8, LEAST, 1.5, "marginal", 82),
    ):
        end = FAULT_AT_S + 20 * 60
        yield Case(
            name,
            n,
            router,
            failures=(
                FailureSpec(FailureKind.ROLLOUT, FAULT_AT_S, "vllm-1", 20 * 60, factor=factor),
            ),
            expected=_expect(
                FindingKind.ROLLOUT_REGRESSION, ScopeUnit.VERSION, f"{MODEL}@v2", FAULT_AT_S, end
            ),
            magnitude=f"x{factor:g} steps ({strength})",
            seed=seed,
        )
    # The registry goes out a minute after the host: its replacement, due 5 minutes after the
    # loss, cannot start until the registry is back 10 minutes later.
    replaced_s, registry_back_s = FAULT_AT_S + 300, FAULT_AT_S + 60 + 900
    yield Case(
        "registry-blocks-replacement",
        6,
        LEAST,
        failures=(
            FailureSpec(FailureKind.HOST_LOSS, FAULT_AT_S, "host-1", 300),
            FailureSpec(FailureKind.REGISTRY_OUTAGE, FAULT_AT_S + 60, "", 900),
        ),
        expected=(
            *_expect(FindingKind.HOST_LOSS, ScopeUnit.HOST, "host-1", FAULT_AT_S, replaced_s),
            *_expect(
                FindingKind.STARTUP_DEPENDENCY,
                ScopeUnit.HOST,
                "host-1",
                replaced_s,
                registry_back_s,
            ),
        ),
        magnitude="replacement blocked 11 min",
        seed=91,
    )


CASES: tuple[Case, ...] = tuple(_cases())


@dataclass(frozen=True)
class Verdict:
    """One expected answer of a case, judged."""

    case: Case
    expected: Expected | None
    budget_ratio: float
    found: Finding | None
    delay: timedelta | None

    @property
    def material(self) -> bool:
        return self.budget_ratio >= MATERIAL_BUDGET_RATIO

    @property
    def ok(self) -> bool:
        return self.found is not None or not self.material


@dataclass(frozen=True)
class CaseResult:
    case: Case
    findings: tuple[Finding, ...]
    verdicts: tuple[Verdict, ...]
    # Top-level findings that answer no injected fault: false alarms and consequences
    # reported as tickets of their own.
    extra: tuple[Finding, ...]


def _bad(inputs: HealthInputs) -> pl.DataFrame:
    return (
        inputs.requests.pipe(with_tpot)
        .pipe(with_good, limits=LIMITS)
        .select("end_ts", bad=~pl.col("good"))
        .collect()
    )


def budget_ratio(bad: pl.DataFrame, *, start: datetime, end: datetime) -> float:
    """The share of the recording's error budget that [start, end + RECOVERY) burned beyond
    the bad share of the rest of the recording."""
    inside = pl.col("end_ts").is_between(start, end + RECOVERY, closed="left")
    during, outside = bad.filter(inside), bad.filter(~inside)
    share = float(outside["bad"].mean() or 0.0) if outside.height else 0.0  # type: ignore[arg-type]
    excess = max(0.0, float(during["bad"].sum()) - during.height * share)
    return excess / ((1 - OBJECTIVE_RATIO) * bad.height)


def _matches(finding: Finding, expected: Expected) -> bool:
    return (
        finding.kind is expected.kind
        and finding.scope_unit is expected.scope_unit
        and finding.scope == expected.scope
        and expected.at - timedelta(minutes=1) <= finding.start <= expected.at + MAX_DELAY
    )


def _answers_a_fault(finding: Finding, case: Case) -> bool:
    """Whether a top-level finding names one of the case's faults (right kind and scope,
    at any time within the fault's harm)."""
    return any(
        finding.kind is e.kind
        and finding.scope == e.scope
        and e.at - timedelta(minutes=1) <= finding.start <= e.until + RECOVERY
        for e in case.expected
    )


def judge(case: Case, inputs: HealthInputs) -> CaseResult:
    findings = run_detectors(
        replace(inputs, limits=LIMITS, objective_ratio=OBJECTIVE_RATIO), default_detectors()
    )
    bad = _bad(inputs)
    verdicts = []
    for expected in case.expected:
        found = next((f for f in findings if _matches(f, expected)), None)
        verdicts.append(
            Verdict(
                case,
                expected,
                budget_ratio(bad, start=expected.at, end=expected.until),
                found,
                None if found is None else found.start - expected.at,
            )
        )
    extra = tuple(f for f in findings if not _answers_a_fault(f, case))
    return CaseResult(case, findings, tuple(verdicts), extra)


def run_case(case: Case, folder: Path) -> CaseResult:
    inputs = recorded_inputs(case.config(), folder / case.name, minutes=MINUTES, seed=case.seed)
    return judge(case, inputs)


def evidence(finding: Finding, name: str) -> Evidence | None:
    return next((e for e in finding.evidence if e.name == name), None)


def table(results: list[CaseResult]) -> str:
    """The matrix as a markdown table, a row per expected answer (per clean fleet)."""
    lines = [
        (
            "| case | replicas | router | load | fault | magnitude | budget burned | found | "
            "delay | magnitude read | other tickets |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        c = result.case
        others = ", ".join(f"{f.kind.value} {f.scope}" for f in result.extra) or "none"
        rows = result.verdicts or (None,)
        for v in rows:
            if v is None or v.expected is None:
                fault, burned, found, delay, read = "none", "-", "-", "-", "-"
            else:
                fault = f"{v.expected.kind.value} {v.expected.scope}"
                burned = f"{v.budget_ratio:.1%}"
                found = "yes" if v.found else ("no (immaterial)" if not v.material else "**no**")
                delay = "-" if v.delay is None else f"{v.delay.total_seconds() / 60:+.0f} min"
                slowdown = v.found and evidence(v.found, "slowdown_ratio")
                read = f"x{slowdown.value:.2f}" if slowdown else "-"
            lines.append(
                f"| {c.name} | {c.replicas} | {c.router.value} | {c.load.value}"
                f"{' hot' if c.rate_rps_per_replica > NORMAL_RPS else ''} | {fault} | "
                f"{c.magnitude or '-'} | {burned} | {found} | {delay} | {read} | {others} |"
            )
    return "\n".join(lines)


def main() -> None:
    with TemporaryDirectory() as tmp:
        results = []
        for case in CASES:
            results.append(run_case(case, Path(tmp)))
            print(f"{case.name}: done", file=sys.stderr)
        print(table(results))


if __name__ == "__main__":
    main()
