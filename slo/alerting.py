"""Multiwindow, multi-burn-rate alerting (SRE Workbook, "Alerting on SLOs"): which alert
conditions hold at an instant, and the every-minute evaluation that turns them into state
changes, records them and notifies.

A window pair's condition holds when the error ratio of both its long and its short window
exceeds burn_threshold x (1 - objective) and each window counted at least `min_events` events
(the low-traffic guard: one failure among three requests is not an outage). The long window
makes the alert significant, the short one makes it stop soon after the errors stop. SLOs
counted from metrics also get an absent-data alert (`slo.absent_alert`), from the presence of
their series at each instant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from servewatch.slo.absent_alert import absent_conditions
from servewatch.slo.alert_state import (
    AlertChange,
    AlertKey,
    AlertStateStore,
    Condition,
    advance,
    apply_changes,
)
from servewatch.slo.burn_rate import (
    evaluation_minute,
    spec_table,
    window_sums_at,
    window_sums_every_minute,
)
from servewatch.slo.notification import Notifier, record_and_notify
from servewatch.slo.spec import SloSpec
from servewatch.slo.windows import Severity


def alert_windows_table(specs: Sequence[SloSpec]) -> pl.LazyFrame:
    """One row per (SLO, window pair) with its threshold, as the evaluator compares it."""
    rows = [
        {
            "slo": spec.name,
            "severity": window.severity.value,
            "long_window_s": window.long_window_s,
            "short_window_s": window.short_window_s,
            "burn_threshold": spec.burn_threshold(window),
            "max_error_ratio": spec.max_error_ratio(window),
            "min_events": spec.min_events,
            "for_s": window.for_s,
        }
        for spec in specs
        for window in spec.windows
    ]
    return pl.LazyFrame(
        rows,
        schema={
            "slo": pl.String(),
            "severity": pl.String(),
            "long_window_s": pl.Int64(),
            "short_window_s": pl.Int64(),
            "burn_threshold": pl.Float64(),
            "max_error_ratio": pl.Float64(),
            "min_events": pl.Int64(),
            "for_s": pl.Int64(),
        },
    )


def _given_ratio(sums: pl.LazyFrame) -> pl.Expr:
    """`error_ratio` as the sums give it (metric SLOs' PromQL-computed ratios), else null."""
    if "error_ratio" in sums.collect_schema().names():
        return pl.col("error_ratio").cast(pl.Float64)
    return pl.lit(None, dtype=pl.Float64).alias("error_ratio")


def _window(sums: pl.LazyFrame, prefix: str, on: str) -> pl.LazyFrame:
    return sums.select(
        "at",
        "slo",
        pl.col("window_s").alias(on),
        pl.col("good").alias(f"{prefix}_good"),
        pl.col("total").alias(f"{prefix}_total"),
        _given_ratio(sums).alias(f"{prefix}_given_ratio"),
    )


def _ratio(prefix: str) -> pl.Expr:
    """The window's error ratio: as given (metric SLOs' PromQL-computed ratios), else from
    its counts."""
    total = pl.col(f"{prefix}_total")
    counted = pl.when(total > 0).then((total - pl.col(f"{prefix}_good")) / total).otherwise(None)
    return pl.coalesce(pl.col(f"{prefix}_given_ratio"), counted)


def alert_conditions(sums: pl.LazyFrame, *, specs: Sequence[SloSpec]) -> pl.LazyFrame:
    """Per (at, slo, window pair): long and short error ratios and burn rates, the budget
    consumed over the period, and `active`.

    `sums` are window sums (`slo.burn_rate.WINDOW_SUMS_SCHEMA`) holding, for each SLO, its
    alert windows and its period at one or many instants.
    """
    specs_frame = spec_table(specs).select("slo", "error_budget_ratio", "period_s")
    budget = pl.col("error_budget_ratio")
    long_ratio, short_ratio = pl.col("long_error_ratio"), pl.col("short_error_ratio")
    guard = (pl.col("long_total") >= pl.col("min_events")) & (
        pl.col("short_total") >= pl.col("min_events")
    )
    burning = (long_ratio > pl.col("max_error_ratio")) & (short_ratio > pl.col("max_error_ratio"))
    return (
        alert_windows_table(specs)
        .join(specs_frame, on="slo", how="left")
        .join(_window(sums, "long", "long_window_s"), on=["slo", "long_window_s"], how="inner")
        .join(
            _window(sums, "short", "short_window_s"),
            on=["at", "slo", "short_window_s"],
            how="inner",
        )
        .join(_window(sums, "period", "period_s"), on=["at", "slo", "period_s"], how="inner")
        .with_columns(
            long_error_ratio=_ratio("long"),
            short_error_ratio=_ratio("short"),
            period_error_ratio=_ratio("period"),
        )
        .with_columns(
            long_burn_rate=long_ratio / budget,
            short_burn_rate=short_ratio / budget,
            budget_consumed_ratio=pl.col("period_error_ratio") / budget,
            active=(guard & burning).fill_null(value=False),
        )
        .select(
            "at",
            "slo",
            "severity",
            "long_window_s",
            "short_window_s",
            "burn_threshold",
            "for_s",
            "min_events",
            "long_total",
            "short_total",
            "long_error_ratio",
            "short_error_ratio",
            "long_burn_rate",
            "short_burn_rate",
            "budget_consumed_ratio",
            "active",
        )
        .sort("at", "slo", "long_window_s", "short_window_s")
    )


def alert_labels_of(spec: SloSpec) -> tuple[tuple[str, str], ...]:
    """The labels an SLO's alerts carry besides their identity: its scope and its labels."""
    return spec.alert_labels


def conditions_from_rows(
    rows: Sequence[Mapping[str, object]], *, specs: Sequence[SloSpec]
) -> tuple[Condition, ...]:
    labels = {spec.name: alert_labels_of(spec) for spec in specs}
    conditions = []
    for row in rows:
        slo = str(row["slo"])
        conditions.append(
            Condition(
                key=AlertKey(
                    slo=slo,
                    severity=Severity(row["severity"]),
                    long_window_s=_int(row["long_window_s"]),
                    short_window_s=_int(row["short_window_s"]),
                ),
                active=bool(row["active"]),
                long_burn_rate=_float(row["long_burn_rate"]),
                short_burn_rate=_float(row["short_burn_rate"]),
                burn_threshold=float(_number(row["burn_threshold"])),
                budget_consumed_ratio=_float(row["budget_consumed_ratio"]),
                for_s=_int(row["for_s"]),
                labels=labels[slo],
            )
        )
    return tuple(conditions)


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value


def _number(value: object) -> float | int:
    assert isinstance(value, float | int)
    return value


def _float(value: object) -> float | None:
    return None if value is None else float(_number(value))


def with_window_sums(sums: pl.LazyFrame, *, replaced: pl.LazyFrame | None) -> pl.LazyFrame:
    """`sums` with the (at, slo, window_s) rows that `replaced` holds taken from it instead:
    the alert windows of metric SLOs, summed as PromQL's `increase()` sums them
    (`slo.counter_windows`), beside the exact minute sums of everything else."""
    if replaced is None:
        return sums
    keys = ["at", "slo", "window_s"]
    columns = [
        pl.col("at"),
        pl.col("slo"),
        pl.col("window_s"),
        pl.col("good", "total").cast(pl.Float64),
    ]
    # The replaced windows keep the ratio PromQL computes from their rates: recomputed from
    # the summed increases it may round to the other side of a threshold it lands on.
    return pl.concat(
        [
            sums.join(replaced.select(keys), on=keys, how="anti").select(
                *columns, _given_ratio(sums)
            ),
            replaced.select(*columns, _given_ratio(replaced)),
        ]
    )


def _presence_by_instant(
    presence: pl.LazyFrame | None,
) -> dict[datetime, list[dict[str, object]]]:
    if presence is None:
        return {}
    rows: dict[datetime, list[dict[str, object]]] = {}
    for row in presence.select("at", "slo", "present").collect().iter_rows(named=True):
        rows.setdefault(row["at"], []).append(row)
    return rows


def evaluate_at(
    minutes: pl.LazyFrame,
    *,
    specs: Sequence[SloSpec],
    at: datetime,
    alert_sums: pl.LazyFrame | None = None,
    presence: pl.LazyFrame | None = None,
) -> tuple[Condition, ...]:
    """Every alert's condition at `at`; `alert_sums` replaces the minute sums of the windows
    it holds (`with_window_sums`), `presence` (`slo.counter_windows.present_at` rows) adds
    the absent-data alerts of the SLOs it lists."""
    frame = (
        window_sums_at(minutes, specs=specs, at=at)
        .pipe(with_window_sums, replaced=alert_sums)
        .pipe(alert_conditions, specs=specs)
        .collect()
    )
    absent = absent_conditions(_presence_by_instant(presence).get(at, []), specs=specs)
    return conditions_from_rows(frame.rows(named=True), specs=specs) + absent


@dataclass(frozen=True)
class Evaluation:
    at: datetime
    conditions: tuple[Condition, ...]
    changes: tuple[AlertChange, ...]
    firing: tuple[AlertChange, ...]
    notification_error: str | None = None


def step(
    minutes: pl.LazyFrame,
    *,
    specs: Sequence[SloSpec],
    at: datetime,
    states: AlertStateStore,
    notifier: Notifier | None = None,
    alert_sums: pl.LazyFrame | None = None,
    presence: pl.LazyFrame | None = None,
) -> Evaluation:
    """One scheduled evaluation: conditions at `at`, state changes recorded in `states`,
    then `notifier` told. A failed notification is reported in the result, not raised: the
    evaluation and its history stand, and the next evaluation runs as usual."""
    at_minute = evaluation_minute(at)
    conditions = evaluate_at(
        minutes, specs=specs, at=at_minute, alert_sums=alert_sums, presence=presence
    )
    done = record_and_notify(conditions, states=states, notifier=notifier, at=at_minute)
    return Evaluation(at_minute, conditions, done.changes, done.firing, done.notification_error)


def replay(
    minutes: pl.LazyFrame,
    *,
    specs: Sequence[SloSpec],
    start: datetime,
    end: datetime,
    latest: Mapping[AlertKey, AlertChange] | None = None,
    alert_sums: pl.LazyFrame | None = None,
    presence: pl.LazyFrame | None = None,
) -> tuple[AlertChange, ...]:
    """Evaluate every minute from `start` to `end` in virtual time (one collect) and return
    the state changes in order: what the scheduled evaluation would have recorded.
    `alert_sums` replaces the minute sums of the windows it holds (`with_window_sums`);
    `presence` adds absent-data alerts (`evaluate_at`)."""
    frame = (
        window_sums_every_minute(minutes, specs=specs, start=start, end=end)
        .pipe(with_window_sums, replaced=alert_sums)
        .pipe(alert_conditions, specs=specs)
        .collect()
    )
    present = _presence_by_instant(presence)
    state = dict(latest or {})
    changes: list[AlertChange] = []
    for (at,), group in frame.group_by("at", maintain_order=True):
        assert isinstance(at, datetime)
        conditions = conditions_from_rows(group.rows(named=True), specs=specs)
        conditions += absent_conditions(present.get(at, []), specs=specs)
        new = advance(state, conditions, at=at)
        state = apply_changes(state, new)
        changes.extend(new)
    return tuple(changes)
