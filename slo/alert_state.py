"""Alert states and their history: the state machine that turns each minute's conditions into
state changes, and the store of changes behind a small protocol.

An alert is one (SLO, window pair). Its states follow Prometheus: a condition that holds
becomes PENDING, then FIRING once it has held for the window's `for` (at once when that is 0);
a firing alert whose condition stops holding is RESOLVED; a pending one that stops before
firing goes back to INACTIVE. Only changes are recorded, so the history is one row per change
and re-evaluating the same minute records nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import Protocol

import polars as pl

from servewatch.pipeline.tables import ALERTS_SCHEMA
from servewatch.slo.durations import format_duration
from servewatch.slo.windows import Severity


class AlertState(Enum):
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"
    INACTIVE = "inactive"


ACTIVE_STATES = frozenset({AlertState.PENDING, AlertState.FIRING})


@dataclass(frozen=True)
class AlertKey:
    """Which alert: an SLO and one pair of windows (with the severity the pair carries)."""

    slo: str
    severity: Severity
    long_window_s: int
    short_window_s: int

    @property
    def window(self) -> str:
        return format_duration(self.long_window_s)

    @property
    def short_window(self) -> str:
        return format_duration(self.short_window_s)

    def sort_key(self) -> tuple[str, int, int]:
        return (self.slo, self.long_window_s, self.short_window_s)


@dataclass(frozen=True)
class Condition:
    """One evaluation of one alert: whether both windows burn above the threshold (with
    enough events), and the numbers that decided it."""

    key: AlertKey
    active: bool
    long_burn_rate: float | None
    short_burn_rate: float | None
    burn_threshold: float
    budget_consumed_ratio: float | None
    for_s: int = 0
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class AlertChange:
    """A recorded state change, with the numbers of the evaluation that caused it."""

    key: AlertKey
    state: AlertState
    changed_ts: datetime
    active_since_ts: datetime | None
    long_burn_rate: float | None
    short_burn_rate: float | None
    burn_threshold: float
    budget_consumed_ratio: float | None
    labels: tuple[tuple[str, str], ...] = ()


def advance(
    latest: Mapping[AlertKey, AlertChange], conditions: Iterable[Condition], *, at: datetime
) -> tuple[AlertChange, ...]:
    """The changes one evaluation at `at` causes, given each alert's latest change.

    An alert that is active but has no condition any more (its SLO or window was removed)
    resolves.
    """
    changes: list[AlertChange] = []
    seen: set[AlertKey] = set()
    for condition in conditions:
        seen.add(condition.key)
        previous = latest.get(condition.key)
        state = previous.state if previous is not None else AlertState.INACTIVE
        since = previous.active_since_ts if previous is not None else None
        new_state: AlertState | None = None
        if condition.active:
            if state not in ACTIVE_STATES:
                since = at
                new_state = AlertState.FIRING if condition.for_s <= 0 else AlertState.PENDING
            elif (
                state is AlertState.PENDING
                and since is not None
                and at - since >= timedelta(seconds=condition.for_s)
            ):
                new_state = AlertState.FIRING
        elif state is AlertState.FIRING:
            new_state = AlertState.RESOLVED
        elif state is AlertState.PENDING:
            new_state = AlertState.INACTIVE
        if new_state is not None:
            changes.append(_change(condition, new_state, at=at, since=since))
    for key, previous in latest.items():
        if key not in seen and previous.state in ACTIVE_STATES:
            gone = (
                AlertState.RESOLVED if previous.state is AlertState.FIRING else AlertState.INACTIVE
            )
            changes.append(
                replace(
                    previous,
                    state=gone,
                    changed_ts=at,
                    long_burn_rate=None,
                    short_burn_rate=None,
                    budget_consumed_ratio=None,
                )
            )
    return tuple(sorted(changes, key=lambda c: c.key.sort_key()))


def _change(
    condition: Condition, state: AlertState, *, at: datetime, since: datetime | None
) -> AlertChange:
    return AlertChange(
        key=condition.key,
        state=state,
        changed_ts=at,
        active_since_ts=since,
        long_burn_rate=condition.long_burn_rate,
        short_burn_rate=condition.short_burn_rate,
        burn_threshold=condition.burn_threshold,
        budget_consumed_ratio=condition.budget_consumed_ratio,
        labels=condition.labels,
    )


def apply_changes(
    latest: Mapping[AlertKey, AlertChange], changes: Iterable[AlertChange]
) -> dict[AlertKey, AlertChange]:
    updated = dict(latest)
    for change in changes:
        updated[change.key] = change
    return updated


class AlertStateStore(Protocol):
    """Where alert state changes are kept (the store's `alerts` table, or memory in tests)."""

    def latest(self) -> dict[AlertKey, AlertChange]:
        """The most recent change of every alert ever recorded."""
        ...

    def append(self, changes: Sequence[AlertChange]) -> None: ...


class InMemoryAlertStateStore:
    def __init__(self) -> None:
        self.history: list[AlertChange] = []
        self._latest: dict[AlertKey, AlertChange] = {}

    def latest(self) -> dict[AlertKey, AlertChange]:
        return dict(self._latest)

    def append(self, changes: Sequence[AlertChange]) -> None:
        self.history.extend(changes)
        self._latest = apply_changes(self._latest, changes)


# -- the history as a table ----------------------------------------------------------------


def changes_to_frame(changes: Sequence[AlertChange]) -> pl.DataFrame:
    """Rows of the `alerts` table; `labels` (scope and spec labels) as a JSON object."""
    return pl.DataFrame(
        {
            "slo": [c.key.slo for c in changes],
            "severity": [c.key.severity.value for c in changes],
            "long_window_s": [c.key.long_window_s for c in changes],
            "short_window_s": [c.key.short_window_s for c in changes],
            "state": [c.state.value for c in changes],
            "changed_ts": [c.changed_ts for c in changes],
            "active_since_ts": [c.active_since_ts for c in changes],
            "long_burn_rate": [c.long_burn_rate for c in changes],
            "short_burn_rate": [c.short_burn_rate for c in changes],
            "burn_threshold": [c.burn_threshold for c in changes],
            "budget_consumed_ratio": [c.budget_consumed_ratio for c in changes],
            "labels": [json.dumps(dict(c.labels), sort_keys=True) for c in changes],
        },
        schema=ALERTS_SCHEMA,
    )


def changes_from_frame(frame: pl.DataFrame) -> tuple[AlertChange, ...]:
    if frame.schema != ALERTS_SCHEMA:
        raise ValueError(f"alert rows have columns {dict(frame.schema)}, expected {ALERTS_SCHEMA}")
    return tuple(
        AlertChange(
            key=AlertKey(
                slo=row["slo"],
                severity=Severity(row["severity"]),
                long_window_s=row["long_window_s"],
                short_window_s=row["short_window_s"],
            ),
            state=AlertState(row["state"]),
            changed_ts=row["changed_ts"],
            active_since_ts=row["active_since_ts"],
            long_burn_rate=row["long_burn_rate"],
            short_burn_rate=row["short_burn_rate"],
            burn_threshold=row["burn_threshold"],
            budget_consumed_ratio=row["budget_consumed_ratio"],
            labels=tuple(sorted(json.loads(row["labels"]).items())),
        )
        for row in frame.iter_rows(named=True)
    )


def latest_changes(frame: pl.LazyFrame) -> pl.LazyFrame:
    """The last change of each alert, from the whole history."""
    return (
        frame.sort("changed_ts")
        .group_by("slo", "long_window_s", "short_window_s", maintain_order=True)
        .last()
        .select(ALERTS_SCHEMA.names())
    )


class AlertTable(Protocol):
    """What a store offers for alert history (the `alerts` table in DuckDB)."""

    def write_alert_changes(self, frame: pl.DataFrame) -> int: ...

    def read_alert_changes(self) -> pl.LazyFrame: ...


class TableAlertStateStore:
    """An `AlertStateStore` kept in a table of `ALERTS_SCHEMA` rows."""

    def __init__(self, table: AlertTable) -> None:
        self.table = table

    def latest(self) -> dict[AlertKey, AlertChange]:
        rows = self.table.read_alert_changes().pipe(latest_changes).collect()
        return {change.key: change for change in changes_from_frame(rows)}

    def append(self, changes: Sequence[AlertChange]) -> None:
        if changes:
            self.table.write_alert_changes(changes_to_frame(changes))
