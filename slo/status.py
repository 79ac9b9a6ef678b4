"""The status of every SLO at an instant, as `servewatch slo status` reports it: the budget,
the burn rate of each window, and each alert's condition now and recorded state.

One pass over the minutes serves all three; the result is typed, with `to_json()` for
`--json`. A period without events is "no data" (`no_data`, budget fields null), not a full
budget. Alert states come from the recorded history as of `at`, so a status for a past
instant shows what was known then.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import polars as pl

from servewatch.slo.alert_state import AlertChange, AlertState
from servewatch.slo.alerting import alert_conditions
from servewatch.slo.budget import CURRENT_WINDOW_S, budget_from_sums
from servewatch.slo.burn_rate import evaluation_minute, window_sums_at, with_burn_rate
from servewatch.slo.durations import format_duration
from servewatch.slo.spec import SloSpec


@dataclass(frozen=True)
class WindowBurn:
    window: str
    window_s: int
    good: int
    total: int
    error_ratio: float | None
    burn_rate: float | None


@dataclass(frozen=True)
class AlertStatus:
    severity: str
    window: str
    short_window: str
    burn_threshold: float
    long_burn_rate: float | None
    short_burn_rate: float | None
    condition_active: bool
    state: str
    state_since: datetime | None


@dataclass(frozen=True)
class SloStatus:
    slo: str
    at: datetime
    objective_ratio: float
    period: str
    good: int
    total: int
    error_ratio: float | None
    # None when the period holds no events ("no data"): nothing says how much is left.
    budget_consumed_ratio: float | None
    budget_remaining_ratio: float | None
    current_burn_rate: float | None
    time_to_exhaustion_s: float | None
    windows: tuple[WindowBurn, ...]
    alerts: tuple[AlertStatus, ...]
    # What `good` and `total` count: requests, or output tokens for token goodput SLOs.
    events: str = "requests"

    @property
    def no_data(self) -> bool:
        """The period holds no events: the budget is unknown, not full."""
        return self.total == 0

    @property
    def verdict(self) -> str:
        """ "no data", "met" (the period's error ratio within the budget) or "missed"."""
        if self.budget_remaining_ratio is None:
            return "no data"
        return "met" if self.budget_remaining_ratio >= 0 else "missed"

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types; times as ISO 8601 UTC with a Z."""
        document: dict[str, Any] = _jsonable(asdict(self))
        document["no_data"] = self.no_data
        document["verdict"] = self.verdict
        return document


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat() + "Z"
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def slo_status(
    minutes: pl.LazyFrame,
    *,
    specs: Sequence[SloSpec],
    at: datetime,
    history: Iterable[AlertChange] = (),
) -> tuple[SloStatus, ...]:
    at_minute = evaluation_minute(at)
    sums = window_sums_at(
        minutes, specs=specs, at=at_minute, extra_windows_s=(CURRENT_WINDOW_S,)
    ).collect()
    budgets, rates, conditions = pl.collect_all(
        [
            sums.lazy().pipe(budget_from_sums, specs=specs),
            sums.lazy().pipe(with_burn_rate, specs=specs).sort("slo", "window_s"),
            sums.lazy().pipe(alert_conditions, specs=specs),
        ]
    )
    recorded: dict[tuple[str, int, int], AlertChange] = {}
    for change in sorted(history, key=lambda c: c.changed_ts):
        if change.changed_ts <= at_minute:
            recorded[change.key.sort_key()] = change
    statuses = []
    for spec in specs:
        (budget,) = budgets.filter(pl.col("slo") == spec.name).rows(named=True)
        windows = tuple(
            WindowBurn(
                window=format_duration(row["window_s"]),
                window_s=row["window_s"],
                good=row["good"],
                total=row["total"],
                error_ratio=row["error_ratio"],
                burn_rate=row["burn_rate"],
            )
            for row in rates.filter(pl.col("slo") == spec.name).iter_rows(named=True)
        )
        alerts = []
        for row in conditions.filter(pl.col("slo") == spec.name).iter_rows(named=True):
            last = recorded.get((spec.name, row["long_window_s"], row["short_window_s"]))
            state = last.state if last is not None else AlertState.INACTIVE
            alerts.append(
                AlertStatus(
                    severity=row["severity"],
                    window=format_duration(row["long_window_s"]),
                    short_window=format_duration(row["short_window_s"]),
                    burn_threshold=row["burn_threshold"],
                    long_burn_rate=row["long_burn_rate"],
                    short_burn_rate=row["short_burn_rate"],
                    condition_active=row["active"],
                    state=state.value,
                    state_since=last.changed_ts if last is not None else None,
                )
            )
        statuses.append(
            SloStatus(
                slo=spec.name,
                at=at_minute,
                objective_ratio=spec.objective_ratio,
                period=spec.period,
                good=budget["good"],
                total=budget["total"],
                error_ratio=budget["error_ratio"],
                budget_consumed_ratio=budget["budget_consumed_ratio"],
                budget_remaining_ratio=budget["budget_remaining_ratio"],
                current_burn_rate=budget["current_burn_rate"],
                time_to_exhaustion_s=budget["time_to_exhaustion_s"],
                windows=windows,
                alerts=tuple(alerts),
                events="output tokens" if spec.counts_tokens else "requests",
            )
        )
    return tuple(statuses)
