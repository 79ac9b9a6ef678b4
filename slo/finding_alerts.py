"""Finding alerts: fleet-health findings as ticket-severity alerts, kept in the same alert
history and sent through the same notifiers as SLO burn-rate alerts.

One alert per (failure mode, scope unit, scope), named `health:<kind>:<unit>:<scope>` in the
history's `slo` column and labelled `alertname=FleetHealthFinding` with kind, scope_unit and
scope. Its condition holds while a finding of that key is ongoing, and for `hold_s` after the
finding ended, so a short episode the evaluation sees only once it is over still raises its
ticket. The state machine is SLO alerting's (`slo.alert_state.advance`), run only over finding
alerts: SLO evaluation and finding evaluation each see only their own alerts, so neither
resolves the other's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from servewatch.health.finding import Finding
from servewatch.slo.alert_state import (
    AlertChange,
    AlertKey,
    AlertStateStore,
    Condition,
)
from servewatch.slo.burn_rate import evaluation_minute
from servewatch.slo.notification import FINDING_ALERT_NAME, Notifier, record_and_notify
from servewatch.slo.windows import Severity

FINDING_ALERT_PREFIX = "health:"
DEFAULT_LOOKBACK_S = 3600
DEFAULT_HOLD_S = 600
EVALUATION_STEP_S = 60


def finding_alert_name(finding: Finding) -> str:
    return f"{FINDING_ALERT_PREFIX}{finding.kind.value}:{finding.scope_unit.value}:{finding.scope}"


def is_finding_alert(key: AlertKey) -> bool:
    return key.slo.startswith(FINDING_ALERT_PREFIX)


def is_slo_alert(key: AlertKey) -> bool:
    return not is_finding_alert(key)


def finding_conditions(
    findings: Iterable[Finding], *, at: datetime, lookback_s: int, hold_s: int
) -> tuple[Condition, ...]:
    """One condition per finding key: active when one of its findings is ongoing at `at` or
    ended less than `hold_s` before it."""
    held_from = at - timedelta(seconds=hold_s)
    active: dict[str, bool] = {}
    labels: dict[str, tuple[tuple[str, str], ...]] = {}
    for finding in findings:
        name = finding_alert_name(finding)
        live = finding.end is None or finding.end > held_from
        active[name] = active.get(name, False) or live
        labels[name] = (
            ("alertname", FINDING_ALERT_NAME),
            ("kind", finding.kind.value),
            ("scope", finding.scope),
            ("scope_unit", finding.scope_unit.value),
        )
    return tuple(
        Condition(
            key=AlertKey(
                slo=name,
                severity=Severity.TICKET,
                long_window_s=lookback_s,
                short_window_s=EVALUATION_STEP_S,
            ),
            active=active[name],
            long_burn_rate=None,
            short_burn_rate=None,
            burn_threshold=0.0,
            budget_consumed_ratio=None,
            labels=labels[name],
        )
        for name in sorted(active)
    )


class AlertStateView:
    """An `AlertStateStore` that shows only the alerts `keep` accepts (all are appended), so
    one evaluation's state machine does not resolve another's alerts."""

    def __init__(self, states: AlertStateStore, *, keep: Callable[[AlertKey], bool]) -> None:
        self.states = states
        self.keep = keep

    def latest(self) -> dict[AlertKey, AlertChange]:
        return {key: change for key, change in self.states.latest().items() if self.keep(key)}

    def append(self, changes: Sequence[AlertChange]) -> None:
        self.states.append(changes)


@dataclass(frozen=True)
class FindingEvaluation:
    at: datetime
    conditions: tuple[Condition, ...]
    changes: tuple[AlertChange, ...]
    firing: tuple[AlertChange, ...]
    notification_error: str | None = None


def step_findings(
    findings: Sequence[Finding],
    *,
    at: datetime,
    states: AlertStateStore,
    notifier: Notifier | None = None,
    lookback_s: int = DEFAULT_LOOKBACK_S,
    hold_s: int = DEFAULT_HOLD_S,
) -> FindingEvaluation:
    """One evaluation of finding alerts at `at` (the findings of the `lookback_s` before it):
    changes recorded in `states`, then `notifier` told. A failed notification is reported,
    not raised, as for SLO alerts."""
    at_minute = evaluation_minute(at)
    conditions = finding_conditions(findings, at=at_minute, lookback_s=lookback_s, hold_s=hold_s)
    view = AlertStateView(states, keep=is_finding_alert)
    done = record_and_notify(conditions, states=view, notifier=notifier, at=at_minute)
    return FindingEvaluation(
        at_minute, conditions, done.changes, done.firing, done.notification_error
    )
