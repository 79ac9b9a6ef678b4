"""Root-cause grouping and harm pricing on hand-built findings: one cause, one ticket, its
consequences as evidence; each finding's cost in bad requests beyond the usual."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import polars as pl
import pytest

from servewatch.dashboards.health_findings import evidence_text
from servewatch.health.finding import Evidence, Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.health.finding_scope import ScopeIndex
from servewatch.health.harm import priced
from servewatch.health.root_cause import grouped
from servewatch.health_service import finding_json
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.tables import REQUESTS_SCHEMA

T0 = datetime(2026, 11, 19, 0, 0)
END = T0 + timedelta(minutes=60)
PLACEMENT: dict[str, dict[str, str | None]] = {
    f"vllm-{i}": {"host": f"host-{i // 2}", "zone": "zone-a" if i < 4 else "zone-b", "pool": "chat"}
    for i in range(6)
}
INDEX = ScopeIndex(
    placement=PLACEMENT, versions={"m@v2": frozenset({"vllm-1"})}, version_label="model"
)


def _finding(
    kind: FindingKind,
    unit: ScopeUnit,
    scope: str,
    start_min: int,
    end_min: int | None,
    confidence: float = 0.5,
) -> Finding:
    return Finding(
        kind=kind,
        scope_unit=unit,
        scope=scope,
        start=T0 + timedelta(minutes=start_min),
        end=None if end_min is None else T0 + timedelta(minutes=end_min),
        confidence=confidence,
        summary=f"{kind.value} on {scope}",
    )


def test_a_rollouts_slow_replica_and_restart_are_its_evidence_not_tickets() -> None:
    rollout = _finding(FindingKind.ROLLOUT_REGRESSION, ScopeUnit.VERSION, "m@v2", 10, 30, 0.9)
    slow = _finding(FindingKind.SLOW_REPLICA, ScopeUnit.REPLICA, "vllm-1", 11, 30, 0.99)
    restart = _finding(FindingKind.AFFINITY_LOSS, ScopeUnit.REPLICA, "vllm-1", 31, 33)
    elsewhere = _finding(FindingKind.SLOW_REPLICA, ScopeUnit.REPLICA, "vllm-4", 12, 30)
    (cause, other) = grouped([rollout, slow, restart, elsewhere], INDEX, window_end=END)
    assert cause.kind is FindingKind.ROLLOUT_REGRESSION
    assert cause.consequences == (slow, restart)
    assert cause.confidence == 0.99  # the surest evidence of the same event
    assert other == elsewhere  # another replica's slowness is not the version's


def test_a_steps_kv_pressure_on_every_replica_is_one_ticket() -> None:
    step = _finding(FindingKind.TRAFFIC_STEP, ScopeUnit.POOL, "chat", 15, 25, 0.7)
    squeezed = [
        _finding(FindingKind.KV_PRESSURE, ScopeUnit.REPLICA, f"vllm-{i}", 16, 24, 1.0)
        for i in range(6)
    ]
    later = _finding(FindingKind.KV_PRESSURE, ScopeUnit.REPLICA, "vllm-0", 40, 45)
    result = grouped([step, *squeezed, later], INDEX, window_end=END)
    assert [f.kind for f in result] == [FindingKind.TRAFFIC_STEP, FindingKind.KV_PRESSURE]
    assert result[0].consequences == tuple(squeezed)
    assert result[0].confidence == 1.0
    assert result[1] == later  # after the step: a finding of its own


def test_affinity_losses_at_a_hosts_recovery_are_the_loss() -> None:
    loss = _finding(FindingKind.HOST_LOSS, ScopeUnit.HOST, "host-1", 15, 25, 0.99)
    back = [_finding(FindingKind.AFFINITY_LOSS, ScopeUnit.REPLICA, r, 25, 28) for r in PLACEMENT]
    (cause,) = grouped([loss, *back], INDEX, window_end=END)
    assert cause.consequences == tuple(back)


def test_an_ongoing_cause_explains_what_follows_to_the_windows_end() -> None:
    loss = _finding(FindingKind.ZONE_LOSS, ScopeUnit.ZONE, "zone-a", 15, None)
    survivor = _finding(FindingKind.LOSS_OVERLOAD, ScopeUnit.POOL, "chat", 15, None)
    (cause,) = grouped([loss, survivor], INDEX, window_end=END)
    assert cause.consequences == (survivor,)


def _requests(rows: list[tuple[str, int, bool, float]]) -> pl.LazyFrame:
    """(replica, end minute, ok, ttft_s) rows as traced requests."""
    frame = pl.DataFrame(
        {
            "replica": [r[0] for r in rows],
            "end_ts": [T0 + timedelta(minutes=r[1], seconds=30) for r in rows],
            "ok": [r[2] for r in rows],
            "ttft_s": [r[3] for r in rows],
            "completion_tokens": [10] * len(rows),
            "decode_s": [0.1] * len(rows),
        }
    ).with_columns(pool=pl.lit("chat"), model=pl.lit("m"))
    # Every other column of the table, null.
    return pl.concat([pl.DataFrame(schema=REQUESTS_SCHEMA), frame], how="diagonal_relaxed").lazy()


def _inputs(requests: pl.LazyFrame, limits: GoodputLimits) -> HealthInputs:
    targets = pl.DataFrame(
        {
            "replica": list(PLACEMENT),
            **{c: [p[c] for p in PLACEMENT.values()] for c in ("host", "zone", "pool")},
        }
    ).lazy()
    empty = pl.LazyFrame()
    dims = pl.DataFrame(
        schema={
            "series_id": pl.Int64,
            "replica": pl.String,
            "model": pl.String,
            "labels": pl.String,
        }
    ).lazy()
    return HealthInputs(
        start=T0,
        end=END,
        points=empty,
        dimensions=dims,
        requests=requests,
        targets=targets,
        scrapes=empty,
        limits=limits,
        objective_ratio=0.99,
    )


@pytest.mark.parametrize(
    ("limits", "bad_during"),
    [
        # Failures only: 10 of the burst's 20 requests failed, against 1 in 80 usually.
        (GoodputLimits(), 10),
        # With a TTFT limit the 5 slow ones that succeeded count too.
        (GoodputLimits(ttft_s=1.0), 15),
    ],
)
def test_a_findings_harm_is_its_bad_requests_beyond_the_usual(
    limits: GoodputLimits, bad_during: int
) -> None:
    outside = [("vllm-2", m % 60, m != 5, 0.2) for m in range(100) if not 20 <= m % 60 < 30]
    during = [("vllm-2", 20 + i % 10, i >= 10, 2.0 if i < 15 else 0.2) for i in range(20)]
    inputs = _inputs(_requests(outside + during), limits)
    burst = _finding(FindingKind.ERROR_BURST, ScopeUnit.REPLICA, "vllm-2", 20, 30)
    (finding,) = priced([burst], inputs, index=INDEX)
    evidence = {e.name: e for e in finding.evidence}
    assert evidence["bad_requests"].value == bad_during
    share = 1 / len(outside)
    assert evidence["bad_requests"].baseline == round(20 * share, 1)
    assert evidence["excess_bad_requests"].value == round(bad_during - 20 * share, 1)
    total = len(outside) + len(during)
    assert evidence["budget_spent_ratio"].value == pytest.approx(
        (bad_during - 20 * share) / (0.01 * total), abs=1e-4
    )
    assert "bad requests beyond the usual" in finding.summary


def test_without_traces_nothing_is_priced() -> None:
    inputs = _inputs(pl.DataFrame(schema=REQUESTS_SCHEMA).lazy(), GoodputLimits())
    burst = _finding(FindingKind.ERROR_BURST, ScopeUnit.REPLICA, "vllm-2", 20, 30)
    assert priced([burst], inputs, index=INDEX) == [burst]


def test_a_gateways_refusals_are_bad_requests_no_trace_shows() -> None:
    outside = [("vllm-2", m, True, 0.2) for m in range(60) if not 20 <= m < 30]
    inputs = _inputs(_requests(outside), GoodputLimits())
    refusing = replace(
        _finding(FindingKind.GATEWAY_REJECTION, ScopeUnit.POOL, "chat", 20, 30),
        evidence=(
            Evidence("rejected_ratio", 0.1, "ratio", baseline=0.01),
            Evidence("rejected_requests", 100.0, "count"),
            Evidence("gateway_requests", 1000.0, "count"),
        ),
    )
    (finding,) = priced([refusing], inputs, index=INDEX)
    evidence = {e.name: e for e in finding.evidence}
    assert evidence["bad_requests"].value == 100
    assert evidence["bad_requests"].baseline == 10.0
    assert evidence["excess_bad_requests"].value == 90.0


def test_a_steps_gateway_refusals_are_the_step() -> None:
    step = _finding(FindingKind.TRAFFIC_STEP, ScopeUnit.POOL, "chat", 15, 25)
    refusing = _finding(FindingKind.GATEWAY_REJECTION, ScopeUnit.POOL, "chat", 16, None)
    (cause,) = grouped([step, refusing], INDEX, window_end=END)
    assert cause.consequences == (refusing,)


def test_a_cause_prints_its_consequences_whole_in_json_and_by_name_in_the_report() -> None:
    loss = _finding(FindingKind.HOST_LOSS, ScopeUnit.HOST, "host-1", 15, 25, 0.99)
    back = _finding(FindingKind.AFFINITY_LOSS, ScopeUnit.REPLICA, "vllm-2", 25, 28)
    (cause,) = grouped([loss, back], INDEX, window_end=END)
    document = finding_json(cause)
    assert [c["kind"] for c in document["consequences"]] == ["affinity_loss"]
    assert document["consequences"][0]["consequences"] == []
    assert evidence_text(cause).endswith("explains affinity_loss vllm-2")
