"""Harm: what a finding cost the SLO, in requests and in error budget. A finding's requests are
the traced requests its scope finished while it lasted; bad ones failed or missed the goodput
limits (`HealthInputs.limits`). Some are bad on any day, so the cost is the excess over what
the same scope's requests outside the finding's span would give at their bad share, and the
budget is `1 - objective_ratio` of every request the window finished.

A loss (host, zone, blocked starts) moves its replicas' requests onto the rest of their pool, so
its harm is counted over the pools it hit, not over replicas that no longer serve. Requests the
gateway refused never reach a replica and are never traced: a gateway rejection adds the
refusals its own evidence counts (beyond its baseline share) to the traced bad requests.
Without traced requests nothing is priced: counters say how many failed, not which met the
limits.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import polars as pl

from servewatch.health.finding import Evidence, Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.health.finding_scope import ScopeIndex
from servewatch.pipeline.request_sli import with_bad

# Findings whose replicas stop serving: their harm lands on the rest of the pool.
POOL_PRICED = frozenset(
    (FindingKind.HOST_LOSS, FindingKind.ZONE_LOSS, FindingKind.STARTUP_DEPENDENCY)
)
HARM_EVIDENCE = ("bad_requests", "excess_bad_requests", "budget_spent_ratio")


def bad_requests(inputs: HealthInputs) -> pl.DataFrame:
    """The window's traced requests with `bad` (failed, or over a goodput limit)."""
    requests = inputs.requests.filter(
        (pl.col("end_ts") >= inputs.start) & (pl.col("end_ts") < inputs.end)
    )
    return requests.pipe(with_bad, limits=inputs.limits).collect()


def priced(findings: list[Finding], inputs: HealthInputs, *, index: ScopeIndex) -> list[Finding]:
    """Each finding with its harm as evidence and in its summary (unchanged without traces)."""
    requests = bad_requests(inputs)
    if requests.is_empty():
        return findings
    budget = (1.0 - inputs.objective_ratio) * requests.height
    return [_price(f, requests, index, budget=budget, window_end=inputs.end) for f in findings]


def _untraced_bad(finding: Finding) -> tuple[float, float]:
    """Bad requests no trace shows, and how many of them its baseline share would give: a
    gateway rejection's refusals."""
    if finding.kind is not FindingKind.GATEWAY_REJECTION:
        return 0.0, 0.0
    evidence = {e.name: e for e in finding.evidence}
    refused, reached = evidence.get("rejected_requests"), evidence.get("gateway_requests")
    share = evidence.get("rejected_ratio")
    if refused is None or reached is None:
        return 0.0, 0.0
    usual = (share.baseline or 0.0) if share is not None else 0.0
    return refused.value, reached.value * usual


def _scoped(finding: Finding, requests: pl.DataFrame, index: ScopeIndex) -> pl.DataFrame:
    if finding.kind not in POOL_PRICED:
        return index.requests_of(requests.lazy(), finding).collect()
    pools = {index.pool_of(r) for r in index.replicas(finding.scope_unit, finding.scope) or ()}
    if finding.scope_unit is ScopeUnit.FLEET or not pools or None in pools:
        return requests
    return requests.filter(pl.col("pool").is_in(sorted(p for p in pools if p is not None)))


def _price(
    finding: Finding,
    requests: pl.DataFrame,
    index: ScopeIndex,
    *,
    budget: float,
    window_end: datetime,
) -> Finding:
    scoped = _scoped(finding, requests, index)
    end = finding.end or window_end
    inside = pl.col("end_ts").is_between(finding.start, end, closed="left")
    during, outside = scoped.filter(inside), scoped.filter(~inside)
    refused, refused_usually = _untraced_bad(finding)
    if during.is_empty() and refused == 0:
        return finding
    bad = int(during["bad"].sum()) + round(refused)
    # Outside the span the scope's own share; a scope that served nothing else (a replica
    # slow all window) is compared with the window's share.
    reference = outside if outside.height else requests.filter(~inside)
    share = float(reference["bad"].mean()) if reference.height else 0.0  # type: ignore[arg-type]
    expected = during.height * share + refused_usually
    excess = max(0.0, bad - expected)
    spent = excess / budget if budget > 0 else 0.0
    evidence = (
        Evidence("bad_requests", float(bad), "count", baseline=round(expected, 1)),
        Evidence("excess_bad_requests", round(excess, 1), "count"),
        Evidence("budget_spent_ratio", round(spent, 4), "ratio"),
    )
    kept = tuple(e for e in finding.evidence if e.name not in HARM_EVIDENCE)
    return replace(
        finding,
        evidence=kept + evidence,
        summary=(
            f"{finding.summary}; {round(excess):,} bad requests beyond the usual "
            f"({spent:.1%} of the window's error budget)"
        ),
    )
