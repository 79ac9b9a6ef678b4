"""The error-burst detector: on small hand-built frames (traces, counters, lost scrapes, aborts,
baselines, replicas bursting together) and on emulated fleets with an injected error burst,
crash, host loss or rollout, recorded once per session."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta

import polars as pl
import pytest

from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet_config import RouterPolicy
from servewatch.health.episodes import binomial_tail
from servewatch.health.error_burst import ErrorBurstDetector
from servewatch.health.finding import Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.pipeline.signals import Signal
from tests.health_fleet import START, fleet_config, recorded_inputs

T0 = datetime(2026, 11, 19)
REPLICAS = tuple(f"vllm-{i}" for i in range(6))
# Failed requests per replica, per minute.
Failures = Mapping[str, Mapping[int, int]]


def _evidence(finding: Finding) -> dict[str, float]:
    return {e.name: e.value for e in finding.evidence}


def _counts(failures: Failures, minute: int, replica: str, per_minute: int) -> tuple[int, int]:
    """(finished, failed) of a replica in a minute."""
    return per_minute, failures.get(replica, {}).get(minute, 0)


def _requests(
    failures: Failures, *, minutes: int, per_minute: int, reason: str = "error"
) -> pl.LazyFrame:
    """Traced requests spread over each minute, the minute's failures first."""
    rows = []
    for replica in REPLICAS:
        for minute in range(minutes):
            finished, failed = _counts(failures, minute, replica, per_minute)
            for i in range(finished):
                end = T0 + timedelta(minutes=minute, seconds=i * 60 / finished)
                rows.append((replica, end, i >= failed, None if i >= failed else reason))
    return pl.LazyFrame(
        {
            "replica": [r[0] for r in rows],
            "pool": ["default" for _ in rows],
            "end_ts": [r[1] for r in rows],
            "ok": [r[2] for r in rows],
            "error_type": [r[3] for r in rows],
        },
        schema_overrides={"error_type": pl.String()},
    )


def _counters(
    failures: Failures, *, minutes: int, per_minute: int, reason: str = "error"
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(points, dimensions): `vllm:request_success_total` by finished_reason, one sample half a
    minute into each minute and one before the window, so each minute's increment is its own."""
    reasons = ("stop", reason)
    dims: dict[str, list[object]] = {
        k: [] for k in ("series_id", "replica", "finished_reason", "le")
    }
    points: dict[str, list[object]] = {"series_id": [], "ts": [], "value": []}
    for r, replica in enumerate(REPLICAS):
        for j, label in enumerate(reasons):
            series = 10 * r + j
            dims["series_id"].append(series)
            dims["replica"].append(replica)
            dims["finished_reason"].append(label)
            dims["le"].append(None)
            total = 0.0
            points["series_id"].append(series)
            points["ts"].append(T0 - timedelta(seconds=30))
            points["value"].append(total)
            for minute in range(minutes):
                finished, failed = _counts(failures, minute, replica, per_minute)
                total += failed if label == reason else finished - failed
                points["series_id"].append(series)
                points["ts"].append(T0 + timedelta(minutes=minute, seconds=30))
                points["value"].append(total)
    dimensions = pl.LazyFrame(dims, schema_overrides={"le": pl.Float64()}).with_columns(
        pool=pl.lit("default"),
        host=pl.lit("host"),
        zone=pl.lit("zone"),
        signal=pl.lit(Signal.REQUESTS_FINISHED.value),
        metric=pl.lit("vllm:request_success_total"),
    )
    return pl.LazyFrame(points), dimensions


def _scrapes(lost: Mapping[str, range], *, minutes: int) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(targets, scrapes): every replica scraped every 15 s, failing in its `lost` minutes."""
    targets = pl.LazyFrame({"target_id": [f"vllm/{r}" for r in REPLICAS], "replica": REPLICAS})
    rows = [
        (f"vllm/{replica}", T0 + timedelta(minutes=m, seconds=s), m not in lost.get(replica, ()))
        for replica in REPLICAS
        for m in range(minutes)
        for s in (0, 15, 30, 45)
    ]
    scrapes = pl.LazyFrame(
        {"target_id": [r[0] for r in rows], "ts": [r[1] for r in rows], "ok": [r[2] for r in rows]}
    )
    return targets, scrapes


def _inputs(
    failures: Failures,
    *,
    minutes: int = 40,
    per_minute: int = 20,
    traced: bool = True,
    counted_failures: Failures | None = None,
    lost: Mapping[str, range] | None = None,
    reason: str = "error",
) -> HealthInputs:
    """Six replicas of pool `default` finishing `per_minute` requests a minute each, traced
    (unless not `traced`) and counted (with `counted_failures` when given)."""
    counted = failures if counted_failures is None else counted_failures
    points, dimensions = _counters(counted, minutes=minutes, per_minute=per_minute, reason=reason)
    requests = (
        _requests(failures, minutes=minutes, per_minute=per_minute, reason=reason)
        if traced
        else pl.LazyFrame()
    )
    targets, scrapes = _scrapes(lost or {}, minutes=minutes)
    return HealthInputs(
        start=T0,
        end=T0 + timedelta(minutes=minutes),
        points=points,
        dimensions=dimensions,
        requests=requests,
        targets=targets,
        scrapes=scrapes,
    )


def _burst(replica: str, failed: int, minutes: range) -> dict[str, dict[int, int]]:
    return {replica: dict.fromkeys(minutes, failed)}


def _exact_tail(k: int, n: int, p: float) -> float:
    """P(X >= k), summed term by term with exact binomial coefficients."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(max(k, 0), n + 1))


def test_binomial_tail_matches_the_exact_sum_and_survives_thousands() -> None:
    for k, n, p in ((0, 5, 0.3), (3, 20, 0.01), (4, 26, 0.01), (7, 10, 0.5), (2, 9, 0.4)):
        assert math.isclose(binomial_tail(k, n, p), _exact_tail(k, n, p), rel_tol=1e-9)
    assert binomial_tail(11, 10, 0.5) == 0.0
    assert binomial_tail(3, 10, 0.0) == 0.0
    # 5,000 requests a minute: math.comb alone would overflow a float.
    assert 0.0 < binomial_tail(100, 5000, 0.01) < 1e-4
    assert math.isclose(binomial_tail(50, 5000, 0.01), 0.5, abs_tol=0.05)


def test_a_replica_failing_a_fifth_of_its_requests_for_ten_minutes_is_a_burst() -> None:
    inputs = _inputs(_burst("vllm-3", 4, range(15, 25)))
    (finding,) = ErrorBurstDetector().detect(inputs)
    assert finding.kind is FindingKind.ERROR_BURST
    assert (finding.scope_unit, finding.scope) == (ScopeUnit.REPLICA, "vllm-3")
    assert finding.start == T0 + timedelta(minutes=15)
    assert finding.end == T0 + timedelta(minutes=25)
    assert finding.confidence > 0.99
    evidence = {e.name: e for e in finding.evidence}
    assert evidence["error_ratio"].value == pytest.approx(0.2)
    assert evidence["error_ratio"].baseline == 0.0
    assert evidence["error_ratio_before"].value == 0.0
    assert evidence["failed_requests"].value == 40
    assert evidence["finished_requests"].value == 200
    assert evidence["excess_failed_requests"].value == 40
    assert evidence["burst_minutes"].value == 10
    assert finding.summary == (
        "vllm-3 failed 20% of its requests (rest of pool 0.0%) for 10 minutes from 00:15 "
        "until 00:25: 40 failed requests beyond its baseline"
    )
    assert "drain vllm-3" in finding.suggestion
    assert "XID" in finding.suggestion


def test_counters_find_the_same_burst_without_traces() -> None:
    inputs = _inputs(_burst("vllm-3", 4, range(15, 25)), traced=False)
    (finding,) = ErrorBurstDetector().detect(inputs)
    assert finding.scope == "vllm-3"
    assert (finding.start, finding.end) == (
        T0 + timedelta(minutes=15),
        T0 + timedelta(minutes=25),
    )
    assert _evidence(finding)["failed_requests"] == 40


def test_traces_are_preferred_where_a_replica_has_them() -> None:
    burst = _burst("vllm-3", 4, range(15, 25))
    (finding,) = ErrorBurstDetector().detect(_inputs(burst, counted_failures={}))
    assert finding.scope == "vllm-3"
    # The counters say so too, but the replica's traces say nothing failed.
    assert ErrorBurstDetector().detect(_inputs({}, counted_failures=burst)) == []


def test_failures_of_one_instant_are_not_a_burst() -> None:
    # A crash or a restart fails everything in flight at once: one minute, however many.
    inputs = _inputs(_burst("vllm-3", 15, range(20, 21)))
    assert ErrorBurstDetector().detect(inputs) == []


def test_failures_while_the_target_fails_its_scrapes_are_a_loss_not_a_burst() -> None:
    burst = _burst("vllm-3", 10, range(20, 23))
    assert len(ErrorBurstDetector().detect(_inputs(burst))) == 1
    # Down from minute 21: its last requests land in the minute before the first failed scrape.
    lost = _inputs(burst, lost={"vllm-3": range(21, 23)})
    assert ErrorBurstDetector().detect(lost) == []


def test_a_failure_a_minute_or_errors_within_the_budget_are_not_a_burst() -> None:
    one_a_minute = _inputs(_burst("vllm-3", 1, range(10, 30)))
    assert ErrorBurstDetector().detect(one_a_minute) == []
    # 3 of 400 a minute (0.75%) is within a 99% objective's budget.
    within_budget = _inputs(_burst("vllm-3", 3, range(10, 30)), per_minute=400)
    assert ErrorBurstDetector().detect(within_budget) == []


def test_a_rise_of_less_than_five_points_over_its_own_baseline_is_not_a_burst() -> None:
    # Always 2 of 25 (8%), then 3 of 25 (12%): far above a pool that never fails, yet
    # only 4 points above what this replica usually does.
    usual = dict.fromkeys(range(40), 2) | dict.fromkeys(range(20, 30), 3)
    inputs = _inputs({"vllm-3": usual}, per_minute=25)
    assert ErrorBurstDetector().detect(inputs) == []
    worse = dict.fromkeys(range(40), 2) | dict.fromkeys(range(20, 30), 8)
    (finding,) = ErrorBurstDetector().detect(_inputs({"vllm-3": worse}, per_minute=25))
    assert _evidence(finding)["error_ratio_before"] == pytest.approx(0.08)
    assert _evidence(finding)["excess_failed_requests"] == pytest.approx(60.0)


def test_aborts_are_not_failures_unless_counted() -> None:
    for traced in (True, False):
        inputs = _inputs(_burst("vllm-3", 8, range(15, 25)), traced=traced, reason="abort")
        assert ErrorBurstDetector().detect(inputs) == []
        (finding,) = ErrorBurstDetector(count_aborts=True).detect(inputs)
        assert finding.scope == "vllm-3"


def test_a_burst_still_on_at_the_window_end_is_ongoing() -> None:
    (finding,) = ErrorBurstDetector().detect(_inputs(_burst("vllm-3", 8, range(30, 40))))
    assert finding.start == T0 + timedelta(minutes=30)
    assert finding.end is None
    assert "still failing" in finding.summary


def test_two_of_six_stay_replica_findings_and_four_of_six_are_one_pool_finding() -> None:
    def bursting(*replicas: str) -> HealthInputs:
        failures = {replica: dict.fromkeys(range(15, 25), 8) for replica in replicas}
        return _inputs(failures)

    two = ErrorBurstDetector().detect(bursting("vllm-1", "vllm-4"))
    assert sorted((f.scope_unit, f.scope) for f in two) == [
        (ScopeUnit.REPLICA, "vllm-1"),
        (ScopeUnit.REPLICA, "vllm-4"),
    ]
    (pool,) = ErrorBurstDetector().detect(bursting("vllm-0", "vllm-1", "vllm-3", "vllm-4"))
    assert (pool.scope_unit, pool.scope) == (ScopeUnit.POOL, "default")
    assert "vllm-0, vllm-1, vllm-3, vllm-4" in pool.summary
    assert "4 of 6 replicas" in pool.summary
    evidence = {e.name: e for e in pool.evidence}
    assert evidence["replicas"].value == 4
    assert evidence["error_ratio"].value == pytest.approx(0.4)
    assert evidence["error_ratio"].baseline == 0.0  # the two replicas that kept serving
    assert evidence["failed_requests"].value == 320
    assert "config" in pool.suggestion


# Emulated fleets: an error burst on vllm-3 at 15 min for 10 min, and failures that fail
# requests in one instant (a crash, a lost host, a rollout restart), which are not bursts.

MINUTES = 40
BURST_AT = START + timedelta(minutes=15)


def _error_burst(*targets: str, ratio: float) -> tuple[FailureSpec, ...]:
    return tuple(
        FailureSpec(
            FailureKind.ERROR_BURST, at_s=15 * 60, target=t, duration_s=10 * 60, error_ratio=ratio
        )
        for t in targets
    )


def _record(
    factory: pytest.TempPathFactory,
    name: str,
    failures: tuple[FailureSpec, ...],
    router: RouterPolicy = RouterPolicy.PREFIX_AFFINITY,
) -> HealthInputs:
    folder = factory.mktemp("error-burst") / name
    config = fleet_config(failures=failures, router=router)
    return recorded_inputs(config, folder, minutes=MINUTES)


def _error_bursts(inputs: HealthInputs) -> list[Finding]:
    return [f for f in ErrorBurstDetector().detect(inputs) if f.kind is FindingKind.ERROR_BURST]


@pytest.fixture(
    scope="session",
    params=[
        (RouterPolicy.PREFIX_AFFINITY, 0.8),
        (RouterPolicy.PREFIX_AFFINITY, 0.2),
        (RouterPolicy.LEAST_LOADED, 0.8),
        (RouterPolicy.LEAST_LOADED, 0.2),
    ],
    ids=lambda p: f"{p[0].value}-{p[1]}",
)
def burst_fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[float, HealthInputs]:
    router, ratio = request.param
    failures = _error_burst("vllm-3", ratio=ratio)
    return ratio, _record(tmp_path_factory, f"burst-{router.value}-{ratio}", failures, router)


@pytest.fixture(
    scope="session",
    params=[
        ("clean", ()),
        (
            "crash",
            (
                FailureSpec(
                    FailureKind.REPLICA_CRASH, at_s=15 * 60, target="vllm-3", duration_s=30.0
                ),
            ),
        ),
        (
            "host-loss",
            (FailureSpec(FailureKind.HOST_LOSS, at_s=15 * 60, target="host-1", duration_s=300.0),),
        ),
        ("rollout", (FailureSpec(FailureKind.ROLLOUT, at_s=15 * 60, target="vllm-3", factor=1.0),)),
    ],
    ids=lambda p: p[0],
)
def burstless_fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> HealthInputs:
    name, failures = request.param
    return _record(tmp_path_factory, name, failures)


@pytest.mark.slow
def test_an_error_burst_is_found_on_its_replica(burst_fleet: tuple[float, HealthInputs]) -> None:
    ratio, inputs = burst_fleet
    (finding,) = _error_bursts(inputs)
    assert (finding.scope_unit, finding.scope) == (ScopeUnit.REPLICA, "vllm-3")
    assert BURST_AT <= finding.start <= BURST_AT + timedelta(minutes=3)
    assert finding.end is not None
    assert abs(finding.end - (BURST_AT + timedelta(minutes=10))) <= timedelta(minutes=2)
    evidence = {e.name: e for e in finding.evidence}
    assert abs(evidence["error_ratio"].value - ratio) <= 0.1
    assert (evidence["error_ratio"].baseline or 0.0) < 0.01
    assert evidence["excess_failed_requests"].value > 0
    assert finding.confidence > 0.9


@pytest.mark.slow
def test_failing_in_flight_requests_at_once_is_not_an_error_burst(
    burstless_fleet: HealthInputs,
) -> None:
    assert _error_bursts(burstless_fleet) == []


@pytest.mark.slow
def test_bursts_on_two_of_six_replicas_are_theirs_and_on_four_the_pools(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    two = _record(tmp_path_factory, "two", _error_burst("vllm-1", "vllm-4", ratio=0.5))
    assert sorted((f.scope_unit, f.scope) for f in _error_bursts(two)) == [
        (ScopeUnit.REPLICA, "vllm-1"),
        (ScopeUnit.REPLICA, "vllm-4"),
    ]
    four = _record(
        tmp_path_factory, "four", _error_burst("vllm-0", "vllm-1", "vllm-3", "vllm-4", ratio=0.5)
    )
    (pool,) = _error_bursts(four)
    assert (pool.scope_unit, pool.scope) == (ScopeUnit.POOL, "default")
    assert "vllm-0, vllm-1, vllm-3, vllm-4" in pool.summary
    assert BURST_AT <= pool.start <= BURST_AT + timedelta(minutes=3)
    assert abs(_evidence(pool)["error_ratio"] - 0.5) <= 0.1
