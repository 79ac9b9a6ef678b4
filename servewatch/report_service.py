"""The report from the store: every frame the dashboards can draw, read once, then the page.

Shared by `servewatch report`, the demo and the `run` service's report job.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import polars as pl

from dashboards.report import Report, ReportInputs, build_report
from pipeline.health_finding import Finding
from pipeline.metric_frames import metric_minute_frames
from pipeline.metric_sli import series_dimensions
from pipeline.request_sli import GoodputLimits
from pipeline.rollup_job import roll_up_request_minutes
from pipeline.store import Store
from servewatch.health_service import DEFAULT_VERSION_LABEL, health_findings
from servewatch.sli_report import build_sli_report


def store_report(
    store: Store,
    *,
    limits: GoodputLimits,
    from_ts: datetime | None = None,
    to_ts: datetime | None = None,
    version_label: str = DEFAULT_VERSION_LABEL,
    findings: Sequence[Finding] | None = None,
) -> Report:
    """The report over [from_ts, to_ts) (all data when open): traces, rollups, SLO minutes,
    the per-minute frames of scraped series, and the fleet-health findings (versions told
    apart by `version_label`; pass `findings` when the caller already has them)."""
    roll_up_request_minutes(store)
    metric_frames: dict[str, pl.LazyFrame] = {}
    stored = store.points_range()
    if stored is not None:
        start, end = from_ts or stored[0], to_ts or stored[1] + timedelta(minutes=1)
        metric_frames = metric_minute_frames(
            store.read_points(from_ts=start - timedelta(minutes=1), to_ts=end),
            series_dimensions(store.read_series(), store.read_targets()),
            start=start,
            end=end,
        )
    inputs = ReportInputs(
        requests=store.read_requests(from_ts=from_ts, to_ts=to_ts),
        request_minutes=store.read_request_minutes(from_ts=from_ts, to_ts=to_ts),
        slo_minutes=store.read_slo_minutes(from_ts=from_ts, to_ts=to_ts),
        sli_report=build_sli_report(store, limits=limits, from_ts=from_ts, to_ts=to_ts),
        kv_cache_usage=metric_frames.get("kv_cache_usage"),
        prefix_cache=metric_frames.get("prefix_cache"),
        scheduler_state=metric_frames.get("scheduler_state"),
        token_throughput=metric_frames.get("token_throughput"),
        latency_percentiles=metric_frames.get("latency_percentiles"),
        findings=tuple(findings)
        if findings is not None
        else health_findings(store, from_ts=from_ts, to_ts=to_ts, version_label=version_label),
    )
    window = (from_ts, to_ts) if from_ts and to_ts else None
    return build_report(inputs, window=window, limits=limits)
