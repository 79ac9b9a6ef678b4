"""The slow-replica detector: its magnitude is the injected slowdown, read from traced TPOT or,
without traces, from the ITL histogram's exact mean, under either router; the survivors of a
host or zone loss, overloaded alike, are not slow replicas; a clean fleet gives nothing. The
step-cost fit, the survivors-only baseline and the loss regimes are also checked on small
hand-made frames."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import polars as pl
import pytest

from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet_config import RouterPolicy, TopologySpec
from servewatch.health.finding import Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.health.slow_replica import (
    ITL_HISTOGRAM_MEAN,
    TRACED_TPOT,
    SlowReplicaDetector,
)
from servewatch.health.step_cost import fit_step_cost
from servewatch.pipeline.replica_minutes import gauge_minutes
from servewatch.pipeline.signals import Signal
from servewatch.pipeline.tables import REQUESTS_SCHEMA, SCRAPES_SCHEMA, TARGETS_SCHEMA
from tests.health_fleet import START, fleet_config, recorded_inputs

pytestmark = pytest.mark.slow

MINUTES = 35
SLOW_FROM_MIN, SLOW_FOR_MIN = 10, 20
ROUTERS = (RouterPolicy.LEAST_LOADED, RouterPolicy.PREFIX_AFFINITY)
# Two zones, three hosts of three replicas in the first and one in the second: losing zone-a
# leaves 3 of 12 replicas.
ZONES = TopologySpec(zones=("zone-a", "zone-b"), hosts_per_zone=(3, 1), replicas_per_host=3)
# Two hosts of six replicas, each its own zone: losing host-0 leaves 6 of 12.
HOSTS = TopologySpec(zones=("zone-a", "zone-b"), hosts_per_zone=1, replicas_per_host=6)
LOSS_FROM_MIN, LOSS_FOR_MIN = 15, 15


def _slow(inputs: HealthInputs) -> list[Finding]:
    return [f for f in SlowReplicaDetector().detect(inputs) if f.kind is FindingKind.SLOW_REPLICA]


def _untraced(inputs: HealthInputs) -> HealthInputs:
    return replace(inputs, requests=inputs.requests.clear())


def _evidence(finding: Finding) -> dict[str, float]:
    return {e.name: e.value for e in finding.evidence}


@pytest.fixture(scope="session", params=[(f, r) for f in (3.0, 1.6) for r in ROUTERS], ids=str)
def slowed_fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[float, HealthInputs]:
    """vllm-1 of six decodes `factor` times slower from 10 to 30 min."""
    factor, router = request.param
    failure = FailureSpec(
        FailureKind.SLOW_REPLICA,
        at_s=SLOW_FROM_MIN * 60,
        target="vllm-1",
        duration_s=SLOW_FOR_MIN * 60,
        factor=factor,
    )
    folder = tmp_path_factory.mktemp("slow") / f"x{factor}-{router.value}"
    config = fleet_config(failures=(failure,), router=router)
    return factor, recorded_inputs(config, folder, minutes=MINUTES)


@pytest.fixture(scope="session", params=ROUTERS, ids=lambda r: r.value)
def clean_fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> HealthInputs:
    folder = tmp_path_factory.mktemp("slow") / f"clean-{request.param.value}"
    return recorded_inputs(fleet_config(router=request.param), folder, minutes=MINUTES)


@pytest.fixture(scope="session", params=["zone", "host"])
def lost_fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[str], HealthInputs]:
    """Zone-a (9 of 12 replicas) or host-0 (6 of 12) lost from 15 to 30 min, at a base rate
    the survivors cannot carry: the survivors' names and the recording."""
    kind, topology, target, survivors, rate_rps = (
        (FailureKind.ZONE_LOSS, ZONES, "zone-a", range(9, 12), 8.0)
        if request.param == "zone"
        else (FailureKind.HOST_LOSS, HOSTS, "host-0", range(6, 12), 14.0)
    )
    failure = FailureSpec(
        kind, at_s=LOSS_FROM_MIN * 60, target=target, duration_s=LOSS_FOR_MIN * 60
    )
    folder = tmp_path_factory.mktemp("slow") / f"{request.param}-loss"
    config = fleet_config(failures=(failure,), topology=topology, rate_rps=rate_rps)
    inputs = recorded_inputs(config, folder, minutes=MINUTES)
    return [f"vllm-{i}" for i in survivors], inputs


@pytest.mark.parametrize("traced", [True, False], ids=["traced", "histograms"])
def test_the_slowdown_reads_as_injected(
    slowed_fleet: tuple[float, HealthInputs], traced: bool
) -> None:
    factor, inputs = slowed_fleet
    findings = _slow(inputs if traced else _untraced(inputs))
    assert len(findings) == 1, [f.summary for f in findings]
    slow = findings[0]
    assert (slow.scope_unit, slow.scope) == (ScopeUnit.REPLICA, "vllm-1")
    evidence = _evidence(slow)
    # Within 10% of the injected factor: x3.0 in [2.7, 3.3], x1.6 in [1.44, 1.76].
    assert factor * 0.9 <= evidence["slowdown_ratio"] <= factor * 1.1, slow.summary
    assert factor * 0.9 <= evidence["slowdown_ratio_itl_histogram_mean"] <= factor * 1.1
    source = TRACED_TPOT if traced else ITL_HISTOGRAM_MEAN
    assert f"per token, {source})" in slow.summary
    assert ("slowdown_ratio_traced_tpot" in evidence) is traced
    assert slow.summary.startswith(f"vllm-1 decodes {evidence['slowdown_ratio']:.1f}x slower")
    began = START + timedelta(minutes=SLOW_FROM_MIN)
    assert abs(slow.start - began) <= timedelta(minutes=2)
    assert slow.end is not None
    assert abs(slow.end - (began + timedelta(minutes=SLOW_FOR_MIN))) <= timedelta(minutes=2)
    assert evidence["slow_minutes"] >= SLOW_FOR_MIN - 2
    assert slow.confidence > 0.9
    assert "eject vllm-1" in slow.suggestion


def test_a_clean_fleet_has_no_slow_replica(clean_fleet: HealthInputs) -> None:
    assert _slow(clean_fleet) == []
    assert _slow(_untraced(clean_fleet)) == []


def test_overloaded_survivors_of_a_loss_are_not_slow(
    lost_fleet: tuple[list[str], HealthInputs],
) -> None:
    survivors, inputs = lost_fleet
    lost_at = START + timedelta(minutes=LOSS_FROM_MIN)
    # The loss overloads them: requests queue and time to first token climbs.
    waiting = (
        gauge_minutes(
            inputs.points,
            inputs.dimensions,
            signal=Signal.REQUESTS_WAITING,
            name="waiting",
            start=inputs.start,
            end=inputs.end,
        )
        .filter(pl.col("replica").is_in(survivors))
        .group_by(during=pl.col("minute_ts") >= lost_at + timedelta(minutes=5))
        .agg(pl.col("waiting_mean").mean())
        .collect()
    )
    queued = dict(zip(waiting["during"], waiting["waiting_mean"], strict=True))
    assert queued[True] >= 10 * max(queued[False], 0.5)
    ttft = (
        inputs.requests.filter(pl.col("replica").is_in(survivors))
        .group_by(during=pl.col("arrival_ts") >= lost_at + timedelta(minutes=5))
        .agg(pl.col("ttft_s").median())
        .collect()
    )
    first_token = dict(zip(ttft["during"], ttft["ttft_s"], strict=True))
    assert first_token[True] >= 5 * first_token[False]

    assert _slow(inputs) == []
    assert _slow(_untraced(inputs)) == []
    # Judged all the same, against the other survivors only while the loss lasts (minutes
    # whose neighbourhood reaches the loss's edges left out: a lost replica can still, or
    # again, report in them).
    minutes = SlowReplicaDetector().replica_minutes(inputs).collect()
    during = minutes.filter(
        pl.col("replica").is_in(survivors)
        & pl.col("minute_ts").is_between(
            lost_at + timedelta(minutes=1), lost_at + timedelta(minutes=LOSS_FOR_MIN - 3)
        )
        & pl.col("itl_ratio").is_not_null()
    )
    assert during.height >= len(survivors) * (LOSS_FOR_MIN - 5)
    assert during["regime"].null_count() == 0
    assert during["peer_replicas"].max() <= len(survivors) - 1  # type: ignore[operator]


# -- hand-made frames ------------------------------------------------------------------------

T0 = datetime(2026, 11, 19)


def _minute(i: int) -> datetime:
    return T0 + timedelta(minutes=i)


def test_the_step_cost_fit_recovers_the_engine_model() -> None:
    rows = [
        (batch, prefill, 0.02 + 0.0002 * batch + 0.0006 * prefill)
        for batch in (1.0, 3.0, 6.0, 10.0)
        for prefill in (0.0, 5.0, 20.0)
    ]
    minutes = pl.LazyFrame(
        rows, schema=["decode_batch", "prefill_tokens_per_step", "itl_mean_s"], orient="row"
    ).with_columns(pool=pl.lit("p"))
    fit = fit_step_cost(minutes, by="pool").collect().row(0, named=True)
    assert fit["a"] == pytest.approx(0.02)
    assert fit["b"] == pytest.approx(0.0002)
    assert fit["c"] == pytest.approx(0.0006)


def test_a_slow_peer_does_not_bend_the_curve_and_the_replica_never_sets_its_own() -> None:
    rows = []
    for i in range(20):
        for r in range(4):
            batch, prefill = 2.0 + (i + r) % 6, float((3 * i + r) % 10)
            itl = 0.02 + 0.0002 * batch + 0.0006 * prefill
            rows.append((f"r{r}", _minute(i), batch, prefill, itl * (3.0 if r == 0 else 1.0)))
    minutes = pl.LazyFrame(
        rows,
        schema=["replica", "minute_ts", "decode_batch", "prefill_tokens_per_step", "itl_mean_s"],
        orient="row",
    ).with_columns(pool=pl.lit("p"))
    costs = SlowReplicaDetector().step_costs(minutes).collect().sort("replica")
    for fit in costs.iter_rows(named=True):
        assert fit["a"] == pytest.approx(0.02, rel=1e-6), fit
        assert fit["c"] == pytest.approx(0.0006, rel=1e-6), fit


def test_a_survivor_is_compared_with_the_other_survivors_only() -> None:
    """Survivors s0-s2 decode at 50 ms from minute 10 (the loss); before it every replica,
    lost ones l0-l2 included, decodes at 25 ms. Without the regime a survivor's first loss
    minutes would be held against the lost replicas' last healthy ones."""
    rows = []
    for i in range(20):
        lost = i >= 10
        for name in ("s0", "s1", "s2", "l0", "l1", "l2"):
            if lost and name.startswith("l"):
                continue
            rows.append(
                (
                    name,
                    _minute(i),
                    16.0 if lost else 10.0,
                    0.05 if lost else 0.025,
                    _minute(10) if lost else None,
                )
            )
    minutes = pl.LazyFrame(
        rows,
        schema={
            "replica": pl.String,
            "minute_ts": pl.Datetime("us"),
            "decode_batch": pl.Float64,
            "itl_mean_s": pl.Float64,
            "regime": pl.Datetime("us"),
        },
        orient="row",
    ).with_columns(
        pool=pl.lit("p"),
        prefill_tokens_per_step=pl.lit(0.0),
        traced_tpot_s=pl.lit(None, dtype=pl.Float64),
        a=pl.lit(0.025),
        b=pl.lit(0.0),
        c=pl.lit(0.0),
    )
    detector = SlowReplicaDetector()
    baseline = detector.peer_baseline(minutes).collect()
    survivor = baseline.filter(pl.col("replica") == "s0").sort("minute_ts")
    at_loss = survivor.filter(pl.col("minute_ts") == _minute(10)).row(0, named=True)
    # Only s1 and s2 in minutes 10-12: the same 50 ms, so no slowdown.
    assert at_loss["peer_replicas"] == 2
    assert at_loss["peer_itl_q"] == pytest.approx(2.0)
    assert (
        survivor.filter(pl.col("minute_ts") >= _minute(10))["peer_itl_q"].to_list()
        == [pytest.approx(2.0)] * 10
    )
    blind = detector.peer_baseline(minutes.with_columns(regime=pl.lit(None, pl.Datetime("us"))))
    mixed = blind.filter((pl.col("replica") == "s0") & (pl.col("minute_ts") == _minute(10)))
    assert mixed.collect()["peer_itl_q"].item() < 2.0


def test_loss_regimes_come_from_the_scrapes() -> None:
    """host-0's two replicas fail every scrape in minutes 5-9: pool p is in that loss's
    regime from minute 5 until `recovery_minutes` after minute 10, when they answer."""
    placement = {"r0": "host-0", "r1": "host-0", "r2": "host-1", "r3": "host-1"}
    targets = (
        pl.LazyFrame(
            [
                {"target_id": r, "kind": "vllm", "replica": r, "host": h, "zone": "z", "pool": "p"}
                for r, h in placement.items()
            ]
        )
        .with_columns(
            [
                pl.lit(None, dtype=d).alias(c)
                for c, d in TARGETS_SCHEMA.items()
                if c not in {"target_id", "kind", "replica", "host", "zone", "pool"}
            ]
        )
        .select(list(TARGETS_SCHEMA))
    )
    scrapes = (
        pl.LazyFrame(
            [
                {
                    "target_id": r,
                    "ts": _minute(i) + timedelta(seconds=s),
                    "ok": not (h == "host-0" and 5 <= i < 10),
                }
                for r, h in placement.items()
                for i in range(20)
                for s in (0, 30)
            ]
        )
        .with_columns(
            [
                pl.lit(None, dtype=d).alias(c)
                for c, d in SCRAPES_SCHEMA.items()
                if c not in {"target_id", "ts", "ok"}
            ]
        )
        .select(list(SCRAPES_SCHEMA))
    )
    dimensions = pl.LazyFrame(
        [{"replica": r, "host": h, "zone": "z", "pool": "p"} for r, h in placement.items()]
    )
    empty = pl.LazyFrame(schema=REQUESTS_SCHEMA)
    inputs = HealthInputs(
        start=T0,
        end=_minute(20),
        points=pl.LazyFrame(),
        dimensions=dimensions,
        requests=empty,
        targets=targets,
        scrapes=scrapes,
    )
    detector = SlowReplicaDetector()
    regimes = detector.loss_regimes(inputs).collect()
    assert regimes.rows(named=True) == [
        {
            "pool": "p",
            "domain": "host host-0",
            "regime_start_ts": _minute(5),
            "regime_end_ts": _minute(10 + detector.recovery_minutes),
        }
    ]
