"""The report of a store window: every frame the dashboards can draw, read once, then the page.

Shared by `servewatch report`, the demo and the `run` service's report job. With a decision
record, its failure table (drilled rows marked), sensitivity tornado and failure drill are
charted too.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from servewatch.capacity.decision_record import DecisionRecord, table_rows
from servewatch.dashboards.report import (
    DrillView,
    FailureView,
    Report,
    ReportInputs,
    TornadoView,
    build_report,
)
from servewatch.health.finding import Finding
from servewatch.health_service import DEFAULT_VERSION_LABEL, health_findings
from servewatch.pipeline.metric_frames import metric_minute_frames
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.sli_report import build_sli_report
from servewatch.pipeline.window import POINTS_LEAD, Window
from servewatch.store import Store


def store_report(
    store: Store,
    *,
    limits: GoodputLimits,
    from_ts: datetime | None = None,
    to_ts: datetime | None = None,
    version_label: str = DEFAULT_VERSION_LABEL,
    findings: Sequence[Finding] | None = None,
    record: DecisionRecord | None = None,
) -> Report:
    """The report over [from_ts, to_ts) of the store as it is (all data when open): the
    window read once, then `window_report`. Rollups are the writers' job: this writes nothing."""
    return window_report(
        store.read_window(from_ts=from_ts, to_ts=to_ts),
        limits=limits,
        version_label=version_label,
        findings=findings,
        record=record,
    )


def window_report(
    window: Window,
    *,
    limits: GoodputLimits,
    version_label: str = DEFAULT_VERSION_LABEL,
    findings: Sequence[Finding] | None = None,
    record: DecisionRecord | None = None,
) -> Report:
    """The report over the window: traces, rollups, SLO minutes, the per-minute frames of
    scraped series, and the fleet-health findings (versions told apart by `version_label`;
    pass `findings` when the caller already has them)."""
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
    inputs = ReportInputs(
        requests=window.requests.lazy(),
        request_minutes=window.request_minutes.lazy(),
        slo_minutes=window.slo_minutes.lazy(),
        sli_report=build_sli_report(window, limits=limits),
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
        else health_findings(window, version_label=version_label),
        **({} if record is None else record_views(record)),
    )
    span = (from_ts, to_ts) if from_ts and to_ts else None
    return build_report(inputs, window=span, limits=limits)


def record_views(record: DecisionRecord) -> dict[str, Any]:
    """The report's capacity views of a decision record (ReportInputs fields)."""
    views: dict[str, Any] = {}
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
