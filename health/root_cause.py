"""Root causes: findings that one cause explains become that cause's evidence, so an on-call
engineer gets one ticket per cause and acts on the cause, not on its symptoms.

- A rollout's version explains what its replicas show while they run it or restart into it or
  out of it: a slow replica (the version is slow, ejecting the replica would not help), an error
  burst, an affinity loss at the restart.
- A host or zone loss, and a blocked start, explain what their pool shows while they last and
  just after: survivors overloaded or slow under the load the loss moved onto them, KV pressure,
  affinity losses when the lost replicas come back (their caches are cold) or the router's ring
  moves (their peers' conversations move).
- A traffic step (or the autoscaler lagging behind one) explains the KV pressure, slow decodes,
  error bursts and gateway refusals of its pool while it lasts.

A consequence must start within the cause's span, widened by `lead` before it (detectors see a
cause a minute or two apart) and `tail` after it (a recovery's cold caches). Each consequence
joins the first cause it fits, in the order above; the cause takes the highest confidence of
itself and its consequences, since they are more evidence of the same event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from servewatch.health.finding import Finding, FindingKind
from servewatch.health.finding_scope import ScopeIndex


@dataclass(frozen=True)
class CauseRule:
    """Which kinds a cause of `causes` explains, and how far around its span."""

    causes: frozenset[FindingKind]
    consequences: frozenset[FindingKind]
    lead: timedelta
    tail: timedelta
    # The consequence's replicas must lie inside the cause's scope (a version's replicas);
    # otherwise sharing a pool with it is enough (a loss or a step moves load pool-wide).
    inside_scope: bool


RULES = (
    CauseRule(
        causes=frozenset({FindingKind.ROLLOUT_REGRESSION}),
        consequences=frozenset(
            {FindingKind.SLOW_REPLICA, FindingKind.ERROR_BURST, FindingKind.AFFINITY_LOSS}
        ),
        lead=timedelta(minutes=3),
        tail=timedelta(minutes=10),
        inside_scope=True,
    ),
    CauseRule(
        causes=frozenset(
            {FindingKind.ZONE_LOSS, FindingKind.HOST_LOSS, FindingKind.STARTUP_DEPENDENCY}
        ),
        consequences=frozenset(
            {
                FindingKind.LOSS_OVERLOAD,
                FindingKind.SLOW_REPLICA,
                FindingKind.KV_PRESSURE,
                FindingKind.AFFINITY_LOSS,
            }
        ),
        lead=timedelta(minutes=2),
        tail=timedelta(minutes=10),
        inside_scope=False,
    ),
    CauseRule(
        causes=frozenset({FindingKind.AUTOSCALER_LAG, FindingKind.TRAFFIC_STEP}),
        consequences=frozenset(
            {
                FindingKind.KV_PRESSURE,
                FindingKind.SLOW_REPLICA,
                FindingKind.ERROR_BURST,
                FindingKind.GATEWAY_REJECTION,
            }
        ),
        lead=timedelta(minutes=3),
        tail=timedelta(minutes=2),
        inside_scope=False,
    ),
)


def _explains(
    rule: CauseRule, cause: Finding, effect: Finding, index: ScopeIndex, *, window_end: datetime
) -> bool:
    if effect is cause or effect.kind not in rule.consequences:
        return False
    end = (cause.end or window_end) + rule.tail
    if not cause.start - rule.lead <= effect.start <= end:
        return False
    if rule.inside_scope:
        return index.contains(cause, effect)
    return index.contains(cause, effect) or index.same_pool(cause, effect)


def grouped(
    findings: Sequence[Finding], index: ScopeIndex, *, window_end: datetime
) -> list[Finding]:
    """The findings with every explained one folded into its cause's `consequences`."""
    explained: dict[int, list[Finding]] = {}
    taken: set[int] = set()
    for rule in RULES:
        for c, cause in enumerate(findings):
            if cause.kind not in rule.causes or c in taken:
                continue
            for e, effect in enumerate(findings):
                if e in taken or e in explained or e == c:
                    continue
                if _explains(rule, cause, effect, index, window_end=window_end):
                    explained.setdefault(c, []).append(effect)
                    taken.add(e)
    result = []
    for c, cause in enumerate(findings):
        if c in taken:
            continue
        effects = explained.get(c, [])
        if not effects:
            result.append(cause)
            continue
        result.append(
            replace(
                cause,
                consequences=cause.consequences + tuple(effects),
                confidence=max([cause.confidence, *(e.confidence for e in effects)]),
            )
        )
    return result
