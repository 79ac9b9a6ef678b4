"""The absent-data alert: an SLO counted from vLLM's metrics whose series stop arriving can
never burn its budget on paper, so a silent scrape would look like a healthy service. As
Pyrra does, each such SLO gets one more alert, `SLOMetricAbsent`, whose condition is PromQL's
`absent(total)`: no series of the SLO's total events has a sample within the lookback (5m)
before the evaluation instant. It resolves at the first evaluation that sees a sample again.

Its `for` is Pyrra's `AbsentDuration`: the time the most critical burn-rate alert would take
to fire if the missing data were all errors, burn x (1 - objective) x long window (whole
seconds), plus that alert's own `for`, rounded to the minute (the lookback already forgives
four minutes of late scrapes). It pages, as that alert does: Pyrra's `critical` is the
severity of its own paging alerts, servewatch's is `page`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from servewatch.slo.alert_state import AlertKey, Condition
from servewatch.slo.counter_windows import LOOKBACK_S
from servewatch.slo.notification import ABSENT_ALERT_NAME
from servewatch.slo.spec import SloSpec
from servewatch.slo.windows import Severity

# The key's windows: the lookback for both, a pair no burn-rate alert can have (its short
# window is always shorter than its long one), so the two kinds never share a history row.
ABSENT_WINDOW_S = LOOKBACK_S


def absent_for_s(spec: SloSpec) -> int:
    """Pyrra's `AbsentDuration` for `spec`'s windows (the most critical: the highest burn)."""
    critical = max(spec.windows, key=spec.burn_threshold)
    to_fire_s = int(spec.max_error_ratio(critical) * critical.long_window_s)
    total_s = to_fire_s + critical.for_s
    # Go's Duration.Round(time.Minute): halves round away from zero.
    return (total_s + 30) // 60 * 60


def absent_key(spec: SloSpec) -> AlertKey:
    return AlertKey(
        slo=spec.name,
        severity=Severity.PAGE,
        long_window_s=ABSENT_WINDOW_S,
        short_window_s=ABSENT_WINDOW_S,
    )


def is_absent_alert(key: AlertKey) -> bool:
    return key.long_window_s == key.short_window_s == ABSENT_WINDOW_S


def absent_labels(spec: SloSpec) -> tuple[tuple[str, str], ...]:
    """The alert's labels besides slo and severity; `alertname` names it for notifiers."""
    return tuple(sorted((("alertname", ABSENT_ALERT_NAME), *spec.alert_labels)))


def absent_conditions(
    presence: Sequence[Mapping[str, object]], *, specs: Sequence[SloSpec]
) -> tuple[Condition, ...]:
    """One condition per SLO of `presence` rows (`slo`, `present`: as
    `slo.counter_windows.present_at` gives them for one instant): active while absent."""
    by_name = {spec.name: spec for spec in specs}
    conditions = []
    for row in presence:
        spec = by_name.get(str(row["slo"]))
        if spec is None:
            continue
        conditions.append(
            Condition(
                key=absent_key(spec),
                active=not bool(row["present"]),
                long_burn_rate=None,
                short_burn_rate=None,
                burn_threshold=0.0,
                budget_consumed_ratio=None,
                for_s=absent_for_s(spec),
                labels=absent_labels(spec),
            )
        )
    return tuple(sorted(conditions, key=lambda c: c.key.sort_key()))
