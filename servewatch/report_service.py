"""The report of a store window: every frame the dashboards can draw, read once, then the page.

Shared by `servewatch report`, the demo and the `run` service's report job. The page opens with
its answers: with SLO specs, each SLO's verdict at the end of the window (`slo_views`: status,
budget and burn over time, alerts fired, from the store's SLO evaluation and alert history);
with a decision record, the recommended fleet and its cost, failure table (drilled rows
marked), sensitivity tornado and failure drill; then which replica is bad.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from servewatch.capacity.decision_record import DecisionRecord, table_rows
from servewatch.dashboards.alert_band import firing_intervals
from servewatch.dashboards.capacity_answer import CapacityAnswer
from servewatch.dashboards.report import (
    DrillView,
    FailureView,
    Report,
    ReportInputs,
    TornadoView,
    build_report,
)
from servewatch.dashboards.slo_verdict import AlertFigure, SloVerdict
from servewatch.health.finding import Finding
from servewatch.health_service import DEFAULT_VERSION_LABEL, health_findings
from servewatch.pipeline.metric_frames import metric_minute_frames
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.sli_report import SliSource, build_sli_report
from servewatch.pipeline.window import POINTS_LEAD, Window
from servewatch.slo.alert_state import AlertChange, changes_from_frame
from servewatch.slo.alerting import alert_windows_table
from servewatch.slo.burn_rate import spec_table, window_sums_every_minute, with_burn_rate
from servewatch.slo.spec import SloSpec
from servewatch.slo.status import SloStatus
from servewatch.slo_service import slo_minutes_at, status_at
from servewatch.store import Store

MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class SloViews:
    """What the report shows of the SLOs over its window: verdicts at its end, per-minute
    events (trace- and metric-counted), budget and burn rates per minute, thresholds and the
    intervals alerts fired in (ReportInputs fields)."""

    verdicts: tuple[SloVerdict, ...]
    slo_minutes: pl.DataFrame
    budget_remaining: pl.DataFrame
    burn_rates: pl.DataFrame
    burn_thresholds: pl.DataFrame
    alert_intervals: pl.DataFrame
    objectives: dict[str, float]
    # The objective a replica's request attainment is held to: the strictest trace-counted one.
    replica_objective_ratio: float | None

    def inputs(self) -> dict[str, Any]:
        return {
            "slo_verdicts": self.verdicts,
            "slo_minutes": self.slo_minutes.lazy(),
            "slo_objectives": self.objectives,
            "budget_remaining": self.budget_remaining.lazy(),
            "burn_rates": self.burn_rates.lazy(),
            "burn_thresholds": self.burn_thresholds.lazy(),
            "alert_intervals": self.alert_intervals.lazy(),
            "replica_objective_ratio": self.replica_objective_ratio,
        }


def report_span(window: Window) -> tuple[datetime, datetime] | None:
    """[start, end) of the report in whole minutes: the window's bounds, an open side closed at
    the first or last data stored (None when the store holds nothing)."""
    spans = [s for s in (window.stored_requests, window.stored_points) if s is not None]
    if not spans:
        return None
    start = window.from_ts or min(s.first for s in spans).replace(second=0, microsecond=0)
    end = window.to_ts or max(s.last for s in spans).replace(second=0, microsecond=0) + MINUTE
    return start, end


def slo_views(
    store: Store, *, specs: Sequence[SloSpec], start: datetime, end: datetime
) -> SloViews:
    """The SLOs over [start, end), evaluated at `end` as `slo status --at END` would: reads only.
    Alerts are those the store's history recorded (`slo evaluate`, `run`, the demo)."""
    minutes = slo_minutes_at(store, specs=specs, at=end).collect()
    statuses = status_at(store, specs=specs, at=end)
    names = [s.name for s in specs]
    changes = store.read_alert_changes().collect().filter(pl.col("slo").is_in(names))
    history = changes_from_frame(changes)
    verdicts = tuple(slo_verdict(s, history=history, start=start, end=end) for s in statuses)
    sums = (
        window_sums_every_minute(minutes.lazy(), specs=specs, start=start + MINUTE, end=end)
        .pipe(with_burn_rate, specs=specs)
        .join(spec_table(specs).select("slo", "period_s", "error_budget_ratio"), on="slo")
        .collect()
    )
    periods = sums.filter(pl.col("window_s") == pl.col("period_s"))
    budget = periods.select(
        minute_ts=pl.col("at") - MINUTE,
        slo="slo",
        budget_remaining_ratio=pl.when(pl.col("total") > 0).then(
            1.0 - pl.col("bad") / (pl.col("error_budget_ratio") * pl.col("total"))
        ),
    ).drop_nulls("budget_remaining_ratio")
    thresholds = alert_windows_table(specs).collect()
    alert_lengths = {*thresholds["long_window_s"], *thresholds["short_window_s"]}
    burns = sums.filter(pl.col("window_s").is_in(alert_lengths)).select(
        minute_ts=pl.col("at") - MINUTE, slo="slo", window_s="window_s", burn_rate="burn_rate"
    )
    traced = [s.objective_ratio for s in specs if s.event_criterion() is not None]
    in_window = (pl.col("minute_ts") >= start) & (pl.col("minute_ts") < end)
    return SloViews(
        verdicts=verdicts,
        slo_minutes=minutes.filter(in_window),
        budget_remaining=budget,
        burn_rates=burns.drop_nulls("burn_rate"),
        burn_thresholds=thresholds,
        alert_intervals=firing_intervals(changes) if not changes.is_empty() else _no_intervals(),
        objectives={s.name: s.objective_ratio for s in specs},
        replica_objective_ratio=max(traced) if traced else None,
    )


def _no_intervals() -> pl.DataFrame:
    return pl.DataFrame(
        schema={
            "slo": pl.String(),
            "severity": pl.String(),
            "long_window_s": pl.Int64(),
            "short_window_s": pl.Int64(),
            "start_ts": pl.Datetime("us"),
            "end_ts": pl.Datetime("us"),
        }
    )


def slo_verdict(
    status: SloStatus, *, history: Sequence[AlertChange], start: datetime, end: datetime
) -> SloVerdict:
    """A status as the report states it. Read field by field with defaults: a status that
    knows "no data" as a state of its own says so, one that does not is read from its counts."""
    fired: dict[tuple[str, str, str], int] = {}
    for change in history:
        firing = change.key.slo == status.slo and change.state.value == "firing"
        if firing and start <= change.changed_ts < end:
            key = (change.key.severity.value, change.key.window, change.key.short_window)
            fired[key] = fired.get(key, 0) + 1
    alerts = tuple(
        AlertFigure(
            severity=str(getattr(a, "severity", "")),
            window=str(getattr(a, "window", "")),
            short_window=str(getattr(a, "short_window", "")),
            burn_threshold=getattr(a, "burn_threshold", None),
            long_burn_rate=getattr(a, "long_burn_rate", None),
            short_burn_rate=getattr(a, "short_burn_rate", None),
            state=str(getattr(a, "state", "inactive")),
            state_since=getattr(a, "state_since", None),
            fired_in_window=fired.get((a.severity, a.window, a.short_window), 0),
        )
        for a in getattr(status, "alerts", ())
    )
    total = int(getattr(status, "total", 0) or 0)
    state = getattr(status, "state", None)
    no_data = (
        bool(getattr(status, "no_data", False))
        or str(getattr(state, "value", state)).replace("_", " ") == "no data"
    )
    budget = getattr(status, "budget_remaining_ratio", None)
    return SloVerdict(
        slo=status.slo,
        objective_ratio=status.objective_ratio,
        period=str(getattr(status, "period", "")),
        at=status.at,
        good=int(getattr(status, "good", 0) or 0),
        total=total,
        budget_remaining_ratio=None if no_data or total == 0 else budget,
        alerts=alerts,
        events=str(getattr(status, "events", "requests")),
        no_data=no_data,
    )


def store_report(
    store: Store,
    *,
    limits: GoodputLimits,
    from_ts: datetime | None = None,
    to_ts: datetime | None = None,
    version_label: str = DEFAULT_VERSION_LABEL,
    findings: Sequence[Finding] | None = None,
    record: DecisionRecord | None = None,
    specs: Sequence[SloSpec] = (),
) -> Report:
    """The report over [from_ts, to_ts) of the store as it is (all data when open): the
    window read once, then `window_report`, with the verdicts of `specs` at its end. Rollups
    are the writers' job: this writes nothing."""
    window = store.read_window(from_ts=from_ts, to_ts=to_ts)
    span = report_span(window)
    slos = slo_views(store, specs=specs, start=span[0], end=span[1]) if specs and span else None
    return window_report(
        window,
        limits=limits,
        version_label=version_label,
        findings=findings,
        record=record,
        slos=slos,
        specs=specs,
    )


def window_report(
    window: Window,
    *,
    limits: GoodputLimits,
    version_label: str = DEFAULT_VERSION_LABEL,
    findings: Sequence[Finding] | None = None,
    record: DecisionRecord | None = None,
    slos: SloViews | None = None,
    specs: Sequence[SloSpec] = (),
) -> Report:
    """The report over the window: traces, rollups, SLO minutes, the per-minute frames of
    scraped series, and the fleet-health findings (versions told apart by `version_label`,
    harm priced against `specs`; pass `findings` when the caller already has them); with
    `slos`, the SLO verdicts and their charts, with `record`, the capacity answer."""
    from_ts, to_ts = window.from_ts, window.to_ts
    metric_frames: dict[str, pl.LazyFrame] = {}
    stored = window.stored_points
    if stored is not None:
        start, end = from_ts or stored.first, to_ts or stored.last + timedelta(minutes=1)
        metric_frames = metric_minute_frames(
            window.points_between(start - POINTS_LEAD, end),
            window.dimensions(),
            start=start,
            end=end,
        )
    # The SLOs' own minutes when given: they hold metric-counted SLOs too (availability).
    slo_inputs = {"slo_minutes": window.slo_minutes.lazy()} | (
        {} if slos is None else slos.inputs()
    )
    inputs = ReportInputs(
        requests=window.requests.lazy(),
        request_minutes=window.request_minutes.lazy(),
        # Both sources: the replica table's GPU figures come from the scraped series.
        sli_report=build_sli_report(window, limits=limits, source=SliSource.BOTH),
        kv_cache_usage=metric_frames.get("kv_cache_usage"),
        prefix_cache=metric_frames.get("prefix_cache"),
        scheduler_state=metric_frames.get("scheduler_state"),
        token_throughput=metric_frames.get("token_throughput"),
        latency_percentiles=metric_frames.get("latency_percentiles"),
        latency_buckets=metric_frames.get("latency_buckets"),
        gpu=metric_frames.get("gpu"),
        xid_events=metric_frames.get("xid_events"),
        unmatched_gpus=metric_frames.get("unmatched_gpus"),
        targets=window.targets.lazy(),
        scrapes=window.scrapes.lazy(),
        findings=tuple(findings)
        if findings is not None
        else health_findings(window, version_label=version_label, specs=specs),
        prompt_token_sources=metric_frames.get("prompt_token_sources"),
        **({} if record is None else record_views(record)),
        **slo_inputs,
    )
    span = (from_ts, to_ts) if from_ts and to_ts else None
    return build_report(inputs, window=span, limits=limits)


def record_views(record: DecisionRecord) -> dict[str, Any]:
    """The report's capacity views of a decision record (ReportInputs fields)."""
    views: dict[str, Any] = {"capacity_answer": capacity_answer(record)}
    table = record.fleet.table
    rows = table_rows(record)
    if rows:
        views["failure_table"] = FailureView(
            pl.DataFrame(
                {
                    "hosts": [r.hosts for r in rows],
                    "replicas": [r.replicas for r in rows],
                    "healthy_capacity": [r.healthy_capacity for r in rows],
                    "failed_capacity": [r.failed_capacity for r in rows],
                    "meets_failure": [r.meets_failure for r in rows],
                }
            ),
            demand_rate=table.spec.demand_rate,
            rate_unit=table.spec.unit.value,
            failure_unit=table.spec.failure_unit.value,
        )
    bars, recommended = record.risk.tornado, record.recommended
    if bars and recommended is not None:
        views["tornado"] = TornadoView(
            pl.DataFrame(
                {
                    "assumption": [b.path for b in bars],
                    "low": [b.low for b in bars],
                    "high": [b.high for b in bars],
                    "replicas_at_low": [b.replicas_at_low for b in bars],
                    "replicas_at_high": [b.replicas_at_high for b in bars],
                },
                schema_overrides={"replicas_at_low": pl.Int64, "replicas_at_high": pl.Int64},
            ),
            baseline_replicas=recommended.replicas,
        )
    drills = record.drills
    drilled = [] if drills is None else [d for d in (drills.smaller, drills.recommended) if d]
    if drilled:
        spec = drilled[-1].drill.spec
        views["drill"] = DrillView(
            pl.DataFrame(
                [
                    {
                        "fleet": f"{d.row.hosts} hosts ({'holds' if d.drill.holds else 'fails'})",
                        "minute": m.minute,
                        "attainment_ratio": m.attainment_ratio,
                        "ready_replicas": m.ready_replicas,
                        "queue_depth_max": m.queue_depth_max,
                    }
                    for d in drilled
                    for m in d.drill.minutes
                ]
            ),
            target_ratio=spec.target_ratio,
            lost=f"the largest {spec.failure_unit.value}",
            recovery_s=spec.recovery_interval_s,
            verdicts=tuple(f"{d.drill.verdict()}." for d in drilled),
        )
    return views


def capacity_answer(record: DecisionRecord) -> CapacityAnswer:
    """The recommended fleet and its costs as the report states them."""
    row = record.recommended
    costs, priced = record.cost_figures(), record.cost_lines()
    fit = record.capacity_fit
    today = len(record.fleet.table.spec.initial.hosts)
    return CapacityAnswer(
        requirement=record.requirement_sentence(),
        verdict=record.verdict(),
        feasible=record.feasible,
        hosts=None if row is None else row.hosts,
        replicas=None if row is None else row.replicas,
        gpus=None if row is None else row.replicas * record.requirement.replica.gpus,
        zones=None if row is None else row.zones,
        hosts_today=today or None,
        usd_per_month=None if costs is None else costs[0].value,
        reserve_usd_per_month=None if costs is None else costs[1].value,
        usd_per_hour=None if priced is None else priced.usd_per_hour.value,
        measured_capacity=None if fit is None else fit.summary(),
    )
