"""What an alert state change tells people: its Alertmanager labels and annotations, the
payloads of the Alertmanager v2 API and of its webhook format, and the `Notifier` plug point.

Labels identify an alert (Alertmanager deduplicates and groups on them), so they hold only
what does not change while it fires: alertname, slo, severity, window (the long one),
short_window, the SLO's scope and its own labels. The numbers go into annotations. The
generated Prometheus rules produce the same label set, so either side can feed one receiver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from servewatch.slo.alert_state import (
    AlertChange,
    AlertState,
    AlertStateStore,
    Condition,
    advance,
    apply_changes,
)
from servewatch.slo.counter_windows import LOOKBACK_S
from servewatch.slo.durations import format_duration

ALERT_NAME = "SLOErrorBudgetBurn"
# An SLO counted from metrics whose series stopped (slo/absent_alert.py), Pyrra's name for it.
ABSENT_ALERT_NAME = "SLOMetricAbsent"
# Fleet-health findings raised as tickets (slo/finding_alerts.py); their labels carry this name.
FINDING_ALERT_NAME = "FleetHealthFinding"
# Prometheus keeps a firing alert alive in Alertmanager by re-sending it with an end time
# four resend intervals ahead; if the sender dies, the alert resolves itself then.
DEFAULT_VALID_FOR_S = 4 * 60
# States people hear about; pending and inactive stay in the history only, as in Prometheus.
NOTIFIED_STATES = frozenset({AlertState.FIRING, AlertState.RESOLVED})


class NotificationError(Exception):
    """A notification could not be delivered; the message says where to and why."""


class Notifier(Protocol):
    def notify(
        self, changes: Sequence[AlertChange], *, firing: Sequence[AlertChange], at: datetime
    ) -> None:
        """Deliver `changes` (this evaluation's state changes); `firing` is every alert
        firing after it, for receivers that need firing alerts re-sent."""
        ...


@dataclass(frozen=True)
class Transition:
    """One evaluation's outcome: the state changes, what fires after them, and why the
    notifier could not be told (None when it was, or when there is none)."""

    changes: tuple[AlertChange, ...]
    firing: tuple[AlertChange, ...]
    notification_error: str | None = None


def record_and_notify(
    conditions: Sequence[Condition],
    *,
    states: AlertStateStore,
    notifier: Notifier | None,
    at: datetime,
) -> Transition:
    """Advance every alert on `conditions`, record the changes in `states`, then tell
    `notifier`. A failed notification is reported, not raised: the evaluation and its
    history stand, and the next evaluation runs as usual."""
    latest = states.latest()
    changes = advance(latest, conditions, at=at)
    states.append(changes)
    now = apply_changes(latest, changes)
    firing = tuple(
        sorted(
            (c for c in now.values() if c.state is AlertState.FIRING),
            key=lambda c: c.key.sort_key(),
        )
    )
    error = None
    if notifier is not None:
        try:
            notifier.notify(changes, firing=firing, at=at)
        except NotificationError as exc:
            error = str(exc)
    return Transition(tuple(changes), firing, error)


def alert_labels(change: AlertChange) -> dict[str, str]:
    labels = dict(change.labels)
    if labels.get("alertname") == ABSENT_ALERT_NAME:
        # No windows: the condition is the absence of samples, as the generated rule's labels.
        return {"slo": change.key.slo, "severity": change.key.severity.value, **labels}
    return {
        "alertname": ALERT_NAME,
        "slo": change.key.slo,
        "severity": change.key.severity.value,
        "window": change.key.window,
        "short_window": change.key.short_window,
        **labels,
    }


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def finding_annotations(change: AlertChange) -> dict[str, str]:
    """A finding alert has no burn rates; its summary names the failure mode and scope."""
    labels = dict(change.labels)
    what = (
        f"{labels.get('kind', '?')} on {labels.get('scope_unit', '?')} {labels.get('scope', '?')}"
    )
    if change.state is AlertState.RESOLVED:
        summary = f"fleet health: {what} no longer found"
    else:
        summary = f"fleet health: {what}; `servewatch health` shows the evidence"
    return {"summary": summary}


def absent_summary(slo: str, *, resolved: bool) -> str:
    """The summary of an absent-data alert, the same words on both sides (the generated rule
    carries the firing one)."""
    if resolved:
        return f"SLO {slo}: its series are back"
    return (
        f"SLO {slo}: none of its series has a sample in the last {format_duration(LOOKBACK_S)}; "
        "its burn-rate alerts cannot fire without data"
    )


def alert_annotations(change: AlertChange) -> dict[str, str]:
    name = dict(change.labels).get("alertname")
    if name == FINDING_ALERT_NAME:
        return finding_annotations(change)
    if name == ABSENT_ALERT_NAME:
        resolved = change.state is AlertState.RESOLVED
        return {"summary": absent_summary(change.key.slo, resolved=resolved)}
    key = change.key
    consumed = (
        "n/a" if change.budget_consumed_ratio is None else f"{change.budget_consumed_ratio:.1%}"
    )
    if change.state is AlertState.RESOLVED:
        summary = (
            f"SLO {key.slo}: burn back under {change.burn_threshold:.3g}x "
            f"({_rate(change.short_burn_rate)}x over {key.short_window})"
        )
    else:
        summary = (
            f"SLO {key.slo}: error budget burning {_rate(change.long_burn_rate)}x over "
            f"{key.window} and {_rate(change.short_burn_rate)}x over {key.short_window} "
            f"(threshold {change.burn_threshold:.3g}x)"
        )
    return {
        "summary": summary,
        "long_burn_rate": _rate(change.long_burn_rate),
        "short_burn_rate": _rate(change.short_burn_rate),
        "burn_threshold": f"{change.burn_threshold:.4g}",
        "budget_consumed": consumed,
    }


def rfc3339(moment: datetime) -> str:
    """A naive UTC (or aware) datetime as RFC 3339 with a Z, as Alertmanager reads it."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment.isoformat(timespec="milliseconds") + "Z"


def postable_alert(
    change: AlertChange, *, at: datetime, valid_for_s: float = DEFAULT_VALID_FOR_S
) -> dict[str, Any]:
    """One alert of `POST /api/v2/alerts`: firing until `at + valid_for_s` unless re-sent,
    or resolved at the change's time."""
    starts = change.active_since_ts or change.changed_ts
    if change.state is AlertState.RESOLVED:
        ends = change.changed_ts
    elif change.state is AlertState.FIRING:
        ends = at + timedelta(seconds=valid_for_s)
    else:
        raise ValueError(f"only firing and resolved alerts are sent, not {change.state.value}")
    return {
        "labels": alert_labels(change),
        "annotations": alert_annotations(change),
        "startsAt": rfc3339(starts),
        "endsAt": rfc3339(ends),
    }


def webhook_message(change: AlertChange, *, receiver: str = "servewatch") -> dict[str, Any]:
    """One state change in Alertmanager's webhook format (version 4), so any receiver written
    for Alertmanager takes servewatch's notifications as they are."""
    if change.state not in NOTIFIED_STATES:
        raise ValueError(f"only firing and resolved alerts are sent, not {change.state.value}")
    labels = alert_labels(change)
    annotations = alert_annotations(change)
    resolved = change.state is AlertState.RESOLVED
    return {
        "version": "4",
        "groupKey": f'{{}}:{{slo="{change.key.slo}"}}',
        "truncatedAlerts": 0,
        "status": change.state.value,
        "receiver": receiver,
        "groupLabels": {"slo": change.key.slo},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "",
        "alerts": [
            {
                "status": change.state.value,
                "labels": labels,
                "annotations": annotations,
                "startsAt": rfc3339(change.active_since_ts or change.changed_ts),
                "endsAt": rfc3339(change.changed_ts) if resolved else "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": "",
            }
        ],
    }
