"""SLO evaluation over the store: per-minute good and total counts, then status and alerts.

Trace-counted SLOs read the incremental `slo_minutes` rollup, which the writers keep current
(`evaluate`, the service, ingest); a reader (`slo status`) whose SLOs the rollup does not hold,
or that finds requests stored since it last ran, counts them from the raw requests instead, as
the rollup would. Metric-counted SLOs are counted from the stored series over the SLO period.
Both are the same per-minute good/total shape, so budgets and burn rates come out exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from servewatch.pipeline.metric_minutes import MetricCriterion, metric_slo_minutes
from servewatch.pipeline.metric_sli import series_dimensions
from servewatch.pipeline.request_minutes import EventCriterion, slo_minutes
from servewatch.slo.alert_state import TableAlertStateStore, changes_from_frame
from servewatch.slo.alerting import Evaluation, step
from servewatch.slo.finding_alerts import AlertStateView, is_slo_alert
from servewatch.slo.imports import load_slo_file
from servewatch.slo.notification import Notifier
from servewatch.slo.spec import SloSpec
from servewatch.slo.status import SloStatus, slo_status
from servewatch.store import Store
from servewatch.store.rollup_job import roll_up_requests
from servewatch.store.rollups import criteria_fingerprint


class SloSetupError(ValueError):
    """No SLOs to work with, or two SLOs share a name."""


def load_specs(paths: Sequence[Path]) -> tuple[tuple[SloSpec, ...], tuple[str, ...]]:
    """Every SLO of the files (our format, Sloth or OpenSLO) and the import notes."""
    if not paths:
        raise SloSetupError(
            "no SLO files: pass --slo FILE or list them in servewatch.toml under [slo] files"
        )
    specs: list[SloSpec] = []
    notes: list[str] = []
    for path in paths:
        loaded = load_slo_file(path)
        specs.extend(loaded.specs)
        notes.extend(f"{path}: {note}" for note in loaded.notes)
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SloSetupError(f"SLO names must be unique across files; repeated: {duplicates}")
    return tuple(specs), tuple(notes)


def _criteria(specs: Sequence[SloSpec]) -> tuple[list[EventCriterion], list[MetricCriterion]]:
    traces = [e for s in specs if (e := s.event_criterion()) is not None]
    metrics = [m for s in specs if (m := s.metric_criterion()) is not None]
    return traces, metrics


def slo_minutes_at(store: Store, *, specs: Sequence[SloSpec], at: datetime) -> pl.LazyFrame:
    """Per-minute good/total of every SLO over the longest period ending at `at`; reads only."""
    traces, metrics = _criteria(specs)
    start = at - timedelta(seconds=max(s.period_s for s in specs))
    end = at + timedelta(minutes=1)
    if not traces or store.rollup_is_current(
        "slo_minutes", fingerprint=criteria_fingerprint(traces)
    ):
        frames = [store.read_slo_minutes(from_ts=start, to_ts=end)]
    else:
        # Whole minutes, as the rollup keeps them: a request belongs to the minute it ended in.
        requests = store.read_requests(from_ts=start.replace(second=0, microsecond=0), to_ts=end)
        frames = [
            slo_minutes(requests, criteria=traces).filter(
                (pl.col("minute_ts") >= start) & (pl.col("minute_ts") < end)
            )
        ]
    if metrics:
        # One row per series: collected once, not planned again in every query reading it.
        dimensions = series_dimensions(store.read_series(), store.read_targets()).collect().lazy()
        points = store.read_points(from_ts=start - timedelta(minutes=1), to_ts=end)
        frames.append(
            metric_slo_minutes(points, dimensions, criteria=metrics, start=start, end=end)
        )
    return pl.concat(frames)


def status_at(store: Store, *, specs: Sequence[SloSpec], at: datetime) -> tuple[SloStatus, ...]:
    minutes = slo_minutes_at(store, specs=specs, at=at)
    history = changes_from_frame(store.read_alert_changes().collect())
    return slo_status(minutes, specs=specs, at=at, history=history)


def evaluate(
    store: Store, *, specs: Sequence[SloSpec], at: datetime, notifier: Notifier | None
) -> Evaluation:
    """One scheduled evaluation: the rollups brought up to date, state changes recorded in
    `alerts`, the notifier told."""
    roll_up_requests(store, criteria=_criteria(specs)[0])
    minutes = slo_minutes_at(store, specs=specs, at=at)
    # Finding alerts share the table; this state machine must not resolve them.
    states = AlertStateView(TableAlertStateStore(store), keep=is_slo_alert)
    return step(minutes, specs=specs, at=at, states=states, notifier=notifier)
