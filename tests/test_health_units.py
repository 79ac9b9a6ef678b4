"""Fleet health in small pieces: the rollout comparison and dependency review on frames built
by hand, the rollout failure of the emulator, and findings turned into ticket alerts."""

from __future__ import annotations

import random
from collections.abc import Container, Mapping
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from servewatch.emulator.failures import ActionKind, FailureKind, FailureSpec, failure_timeline
from servewatch.emulator.fleet_config import load_fleet_config
from servewatch.emulator.records import ReplicaPlacement
from servewatch.emulator.workload import SpecError
from servewatch.health.dependency_review import DependencyReview
from servewatch.health.finding import Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.health.rollout_comparison import (
    RolloutComparison,
    VersionLabelError,
    block_bootstrap_means,
)
from servewatch.health_service import finding_json, ordered
from servewatch.pipeline.tables import REQUESTS_SCHEMA, SCRAPES_SCHEMA, TARGETS_SCHEMA
from servewatch.slo.alert_state import AlertState, InMemoryAlertStateStore
from servewatch.slo.finding_alerts import finding_conditions, is_finding_alert, step_findings

T0 = datetime(2026, 11, 18, 10, 0)


def _requests(per_minute: dict[str, float], *, minutes: int, seed: int) -> pl.LazyFrame:
    """Ten requests per replica and minute; replicas named `<version>-<i>`, two per version,
    with TTFT and TPOT around `per_minute[version]` times a base."""
    rng = random.Random(seed)
    rows = []
    for minute in range(minutes):
        for version, scale in per_minute.items():
            for i in range(2):
                for k in range(10):
                    end = T0 + timedelta(minutes=minute, seconds=5 * k + 1)
                    rows.append(
                        {
                            "replica": f"{version}-{i}",
                            "model": version,
                            "pool": "chat",
                            "end_ts": end,
                            "ok": True,
                            "completion_tokens": 101,
                            "ttft_s": 0.05 * scale * rng.uniform(0.7, 1.3),
                            "decode_s": 100 * 0.01 * scale * rng.uniform(0.8, 1.2),
                        }
                    )
    frame = pl.DataFrame(rows)
    return (
        frame.with_columns(
            pl.lit(None, dtype=dtype).alias(name)
            for name, dtype in REQUESTS_SCHEMA.items()
            if name not in frame.columns
        )
        .select(REQUESTS_SCHEMA.names())
        .cast(dict(REQUESTS_SCHEMA))
        .lazy()
    )


def _inputs(requests: pl.LazyFrame, *, minutes: int, version_label: str = "model") -> HealthInputs:
    empty = pl.LazyFrame()
    return HealthInputs(
        start=T0,
        end=T0 + timedelta(minutes=minutes),
        points=empty,
        dimensions=empty,
        requests=requests,
        targets=pl.LazyFrame(schema=TARGETS_SCHEMA),
        scrapes=pl.LazyFrame(schema=SCRAPES_SCHEMA),
        version_label=version_label,
    )


def test_a_slower_version_is_a_regression_and_equal_ones_are_not() -> None:
    slower = _inputs(_requests({"v1": 1.0, "v2": 1.5}, minutes=20, seed=1), minutes=20)
    (finding,) = RolloutComparison().detect(slower)
    assert (finding.kind, finding.scope_unit, finding.scope) == (
        FindingKind.ROLLOUT_REGRESSION,
        ScopeUnit.VERSION,
        "v2",
    )
    assert finding.start == T0
    assert finding.end is None
    evidence = {e.name: e for e in finding.evidence}
    assert evidence["ttft_s"].baseline == pytest.approx(0.05, rel=0.1)
    assert evidence["ttft_s"].value == pytest.approx(0.075, rel=0.1)
    assert evidence["ttft_s_diff_ci_low"].value > 0

    same = _inputs(_requests({"v1": 1.0, "v2": 1.0}, minutes=20, seed=2), minutes=20)
    assert RolloutComparison().detect(same) == []
    # A version seen for fewer paired minutes than required is not judged.
    short = _inputs(_requests({"v1": 1.0, "v2": 1.5}, minutes=5, seed=3), minutes=5)
    assert RolloutComparison().detect(short) == []


def test_a_small_difference_is_not_a_regression_even_when_certain() -> None:
    # 5 % slower: the interval excludes zero with this much data, the effect is too small.
    inputs = _inputs(_requests({"v1": 1.0, "v2": 1.05}, minutes=60, seed=4), minutes=60)
    assert RolloutComparison().detect(inputs) == []


def test_an_unknown_version_label_names_what_is_allowed() -> None:
    inputs = _inputs(
        _requests({"v1": 1.0, "v2": 1.0}, minutes=2, seed=5), minutes=2, version_label="image"
    )
    with pytest.raises(VersionLabelError, match=r"'image'.*allowed"):
        RolloutComparison().detect(inputs)


def test_block_bootstrap_is_seeded_and_centred_on_the_mean() -> None:
    values = [float(v) for v in range(20)]
    first = block_bootstrap_means(values, resamples=200, block=5, seed=3)
    assert first == block_bootstrap_means(values, resamples=200, block=5, seed=3)
    assert sum(first) / len(first) == pytest.approx(9.5, abs=1.0)
    assert min(first) < 9.5 < max(first)


def _targets(rows: list[tuple[str, str | None, str | None, str | None]]) -> pl.LazyFrame:
    """(target_id, replica, host, zone) rows, in pool `chat`."""
    return pl.LazyFrame(
        {
            "target_id": [r[0] for r in rows],
            "kind": ["dcgm" if r[1] is None else "vllm" for r in rows],
            "url": [f"http://{r[0]}" for r in rows],
            "replica": [r[1] for r in rows],
            "host": [r[2] for r in rows],
            "zone": [r[3] for r in rows],
            "model": ["m" for _ in rows],
            "pool": ["chat" for _ in rows],
            "gpus": [1 for _ in rows],
            "first_seen_ts": [T0 for _ in rows],
            "last_seen_ts": [T0 + timedelta(minutes=30) for _ in rows],
            "gpu_uuids": [None for _ in rows],
        },
        schema=TARGETS_SCHEMA,
    )


def _scrapes(
    failing: Mapping[str, Container[int]], targets: list[str], *, minutes: int
) -> pl.LazyFrame:
    rows = [
        (target, T0 + timedelta(minutes=m, seconds=s), m not in failing.get(target, range(0)))
        for m in range(minutes)
        for s in (0, 30)
        for target in targets
    ]
    return pl.LazyFrame(
        {
            "target_id": [r[0] for r in rows],
            "ts": [r[1] for r in rows],
            "ok": [r[2] for r in rows],
            "duration_s": [0.01 for _ in rows],
            "samples": [10 for _ in rows],
            "error": [None if r[2] else "connection refused" for r in rows],
            "kind": ["vllm" for _ in rows],
        },
        schema=SCRAPES_SCHEMA,
    )


def _review(targets: pl.LazyFrame, scrapes: pl.LazyFrame, *, minutes: int) -> list[Finding]:
    empty = pl.LazyFrame()
    inputs = HealthInputs(
        start=T0,
        end=T0 + timedelta(minutes=minutes),
        points=empty,
        dimensions=empty,
        requests=empty,
        targets=targets,
        scrapes=scrapes,
    )
    return DependencyReview().detect(inputs)


HOSTS = [
    ("vllm/a0", "a0", "host-a", "z1"),
    ("vllm/a1", "a1", "host-a", "z1"),
    ("dcgm/host-a", None, "host-a", "z1"),
    ("vllm/b0", "b0", "host-b", "z2"),
    ("vllm/b1", "b1", "host-b", "z2"),
]


def test_targets_of_one_host_failing_together_are_one_host_loss() -> None:
    ids = [t[0] for t in HOSTS]
    lost = range(5, 10)
    failing = {"vllm/a0": lost, "vllm/a1": lost, "dcgm/host-a": lost}
    # b0 and b1 fail too, but never in the same minute: replica faults, not a host loss.
    failing |= {"vllm/b0": range(3, 6), "vllm/b1": range(12, 14)}
    (finding,) = _review(_targets(HOSTS), _scrapes(failing, ids, minutes=20), minutes=20)
    assert (finding.scope_unit, finding.scope) == (ScopeUnit.HOST, "host-a")
    assert finding.start == T0 + timedelta(minutes=5)
    assert finding.end == T0 + timedelta(minutes=10)
    assert {e.name: e.value for e in finding.evidence}["failed_minutes"] == 5
    assert "a0, a1" in finding.summary

    # Still down at the end of the window: ongoing.
    still = {t: range(15, 20) for t in ("vllm/a0", "vllm/a1", "dcgm/host-a")}
    (ongoing,) = _review(_targets(HOSTS), _scrapes(still, ids, minutes=20), minutes=20)
    assert ongoing.end is None

    # The GPU exporter kept answering: the replicas restarted, the host did not go away.
    replicas_only = {"vllm/a0": lost, "vllm/a1": lost}
    assert _review(_targets(HOSTS), _scrapes(replicas_only, ids, minutes=20), minutes=20) == []


def test_a_host_loss_under_two_minute_scrapes_counts_wall_clock_minutes() -> None:
    ids = [t[0] for t in HOSTS]
    # Scrapes every other minute; the host's targets fail those of minutes 4 to 14.
    every_other = _scrapes({t: range(4, 16) for t in ids[:3]}, ids, minutes=30).filter(
        pl.col("ts").dt.minute() % 2 == 0
    )
    (finding,) = _review(_targets(HOSTS), every_other, minutes=30)
    assert (finding.start, finding.end) == (T0 + timedelta(minutes=4), T0 + timedelta(minutes=16))
    evidence = {e.name: e.value for e in finding.evidence}
    assert (evidence["failed_minutes"], evidence["failed_scraped_minutes"]) == (12, 6)
    assert "for 12 minute(s) from 10:04 until 10:16, 6 of those minutes scraped" in (
        finding.summary
    )


def test_every_host_of_a_zone_failing_together_is_one_zone_loss() -> None:
    two_hosts = [*HOSTS[:3], ("vllm/c0", "c0", "host-c", "z1"), ("vllm/c1", "c1", "host-c", "z1")]
    rows = [*two_hosts, *HOSTS[3:]]
    ids = [t[0] for t in rows]
    zone = [t[0] for t in two_hosts]
    # Zone z1 goes for minutes 5-9; before that host-a goes alone for minute 2, and host-c
    # stays down one minute longer than its zone: those are host losses of their own.
    on_a = ("vllm/a0", "vllm/a1", "dcgm/host-a")
    failing = {t: {*range(5, 10), *(range(2, 3) if t in on_a else range(10, 11))} for t in zone}
    findings = _review(_targets(rows), _scrapes(failing, ids, minutes=20), minutes=20)
    assert [(f.scope_unit, f.scope, f.start, f.end) for f in findings] == [
        (ScopeUnit.ZONE, "z1", T0 + timedelta(minutes=5), T0 + timedelta(minutes=10)),
        (ScopeUnit.HOST, "host-a", T0 + timedelta(minutes=2), T0 + timedelta(minutes=3)),
        (ScopeUnit.HOST, "host-c", T0 + timedelta(minutes=5), T0 + timedelta(minutes=11)),
    ]
    zone_loss = findings[0]
    assert {e.name: e.value for e in zone_loss.evidence}["hosts"] == 2
    assert zone_loss.summary.startswith("zone z1 (2 hosts) lost: all 5 of its targets")
    assert "a0, a1, c0, c1" in zone_loss.summary

    # A zone on one host is that host: z2's loss stays a host finding.
    z2 = {"vllm/b0": range(5, 8), "vllm/b1": range(5, 8)}
    (host,) = _review(_targets(rows), _scrapes(z2, ids, minutes=20), minutes=20)
    assert (host.scope_unit, host.scope) == (ScopeUnit.HOST, "host-b")


def test_unplaced_replicas_and_one_zone_pools() -> None:
    rows = [("vllm/a0", "a0", None, "z1"), ("vllm/a1", "a1", "host-a", ""), *HOSTS[3:]]
    findings = _review(_targets(rows), _scrapes({}, [], minutes=0), minutes=5)
    assert sorted(
        (f.scope_unit, f.scope, f.summary.split(" has no ")[1][:4]) for f in findings
    ) == [
        (ScopeUnit.REPLICA, "a0", "host"),
        (ScopeUnit.REPLICA, "a1", "zone"),
    ]
    same_zone = [(t, r, h, "z1") for t, r, h, _ in HOSTS]
    (zone,) = _review(_targets(same_zone), _scrapes({}, [], minutes=0), minutes=5)
    assert (zone.scope_unit, zone.scope) == (ScopeUnit.ZONE, "z1")
    assert "all 4 replicas of pool chat" in zone.summary


def _finding(scope: str, *, start_min: int, end_min: int | None, confidence: float) -> Finding:
    return Finding(
        kind=FindingKind.DEPENDENCY,
        scope_unit=ScopeUnit.HOST,
        scope=scope,
        start=T0 + timedelta(minutes=start_min),
        end=None if end_min is None else T0 + timedelta(minutes=end_min),
        confidence=confidence,
        summary=f"host {scope} lost",
    )


def test_findings_are_ordered_by_start_then_confidence_and_print_as_json() -> None:
    late = _finding("h3", start_min=9, end_min=None, confidence=0.99)
    unsure = _finding("h1", start_min=1, end_min=4, confidence=0.5)
    sure = _finding("h2", start_min=1, end_min=None, confidence=0.9)
    assert ordered([late, unsure, sure]) == (sure, unsure, late)
    document = finding_json(sure)
    assert document["end"] is None
    assert document["start"] == "2026-11-18T10:01:00Z"
    assert finding_json(unsure)["end"] == "2026-11-18T10:04:00Z"


def test_finding_alerts_hold_after_the_end_then_resolve_and_leave_slo_alerts_alone() -> None:
    finding = _finding("h1", start_min=0, end_min=5, confidence=0.9)
    (condition,) = finding_conditions(
        [finding], at=T0 + timedelta(minutes=10), lookback_s=3600, hold_s=600
    )
    assert condition.active  # ended 5 minutes ago: held for 10
    (condition,) = finding_conditions(
        [finding], at=T0 + timedelta(minutes=16), lookback_s=3600, hold_s=600
    )
    assert not condition.active
    assert is_finding_alert(condition.key)

    states = InMemoryAlertStateStore()
    fired = step_findings([finding], at=T0 + timedelta(minutes=6), states=states)
    assert [c.state for c in fired.changes] == [AlertState.FIRING]
    # The finding is no longer among those found: its alert resolves.
    gone = step_findings([], at=T0 + timedelta(minutes=30), states=states)
    assert [c.state for c in gone.changes] == [AlertState.RESOLVED]


def test_rollout_failure_restarts_the_replica_as_the_new_version(tmp_path: Path) -> None:
    placements = [ReplicaPlacement("r0", "h0", "z0", "m", "p", 1)]
    spec = FailureSpec(FailureKind.ROLLOUT, at_s=60, target="r0", duration_s=120, factor=1.5)
    roll_out, roll_back = failure_timeline([spec], placements, start_s=1000.0)
    assert (roll_out.kind, roll_out.at_s, roll_out.version, roll_out.factor) == (
        ActionKind.ROLL_OUT,
        1060.0,
        "v2",
        1.5,
    )
    assert (roll_back.kind, roll_back.at_s, roll_back.version, roll_back.factor) == (
        ActionKind.ROLL_OUT,
        1180.0,
        "",
        1.0,
    )
    with pytest.raises(SpecError, match="version"):
        FailureSpec(FailureKind.ROLLOUT, at_s=0, target="r0", version="a@b")
    with pytest.raises(SpecError, match="factor"):
        FailureSpec(FailureKind.ROLLOUT, at_s=0, target="r0", factor=0.0)

    path = tmp_path / "fleet.toml"
    path.write_text(
        '[[failures]]\nkind = "rollout"\nat_s = 300\ntarget = "vllm-1"\n'
        'version = "canary"\nfactor = 1.2\n',
        encoding="utf-8",
    )
    (loaded,) = load_fleet_config(path).failures
    assert (loaded.kind, loaded.version, loaded.factor) == (FailureKind.ROLLOUT, "canary", 1.2)
