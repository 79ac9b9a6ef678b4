"""SLO evaluation over the store: per-minute good and total counts, then status and alerts.

Trace-counted SLOs read the incremental `slo_minutes` rollup, which the writers keep current
(`evaluate`, the service, ingest); a reader (`slo status`) whose SLOs the rollup does not hold,
or that finds requests stored since it last ran, counts them from the raw requests instead, as
the rollup would. Metric-counted SLOs are counted from the stored series over the SLO period.
Both are the same per-minute good/total shape, so budgets and burn rates come out exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path

import polars as pl

from servewatch.pipeline.metric_minutes import (
    MetricCriterion,
    metric_slo_minutes,
    metric_slo_series,
)
from servewatch.pipeline.metric_sli import series_dimensions
from servewatch.pipeline.request_minutes import EventCriterion, slo_minutes
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.slo.alert_state import AlertChange, TableAlertStateStore, changes_from_frame
from servewatch.slo.alerting import Evaluation, replay, step
from servewatch.slo.burn_rate import evaluation_minute
from servewatch.slo.counter_windows import (
    LOOKBACK_S,
    SAMPLES_COLUMNS,
    present_at,
    window_increases,
)
from servewatch.slo.finding_alerts import AlertStateView, is_slo_alert
from servewatch.slo.imports import load_slo_file
from servewatch.slo.notification import Notifier
from servewatch.slo.spec import SliSource, SloSpec
from servewatch.slo.status import SloStatus, slo_status
from servewatch.store import Store, utc_now
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


MINUTE = timedelta(minutes=1)


class InstantBasis(Enum):
    """Why an evaluation ran at its instant."""

    REQUESTED = "requested"  # --at, on a minute boundary
    REQUESTED_LAST_MINUTE = "requested, last minute counted"  # --at inside the data's last minute
    REQUESTED_FLOORED = "requested, floored to the minute"  # --at inside a minute with later data
    END_OF_DATA = "end of data"
    NO_DATA = "no data: now"


@dataclass(frozen=True)
class EvaluationInstant:
    """The minute boundary an evaluation ran at, and why: `at` (naive UTC), the instant asked
    for (None without --at) and the last sample or request time the SLOs read."""

    at: datetime
    basis: InstantBasis
    requested: datetime | None
    data_end: datetime | None

    def describe(self) -> str:
        text = f"evaluated at {self.at.isoformat(timespec='minutes')} UTC ({self.basis.value}"
        if self.basis is InstantBasis.REQUESTED_FLOORED and self.requested is not None:
            text += f"; --at {self.requested.isoformat(timespec='seconds')} falls inside a minute"
            text += " that later data completes, so that minute is not counted"
        if self.data_end is not None:
            text += f"; data ends {self.data_end.isoformat(timespec='seconds')}"
        return text + ")"

    def to_json(self) -> dict[str, str | None]:
        def iso(moment: datetime | None) -> str | None:
            return None if moment is None else moment.isoformat() + "Z"

        return {
            "at": iso(self.at),
            "basis": self.basis.value,
            "requested": iso(self.requested),
            "data_end": iso(self.data_end),
        }


def _naive(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def _floor(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _ceil(moment: datetime) -> datetime:
    floor = _floor(moment)
    return floor if floor == moment else floor + MINUTE


def data_end(store: Store, *, specs: Sequence[SloSpec]) -> tuple[datetime, datetime] | None:
    """The last time the SLOs' data holds and the first minute boundary whose evaluation
    counts it: a request counts in the minute it ended in (the boundary after it), a sample in
    the minute it closes (a sample at 12:00:00 counts in an evaluation at 12:00, as PromQL's
    range selectors include the evaluation instant). None without data. Without specs, both
    requests and samples count."""
    sources = {s.sli.source for s in specs} or {SliSource.TRACES, SliSource.METRICS}
    ends: list[tuple[datetime, datetime]] = []
    if SliSource.TRACES in sources:
        if (requests := store.requests_range()) is not None:
            ends.append((requests[1], _floor(requests[1]) + MINUTE))
        elif (minute := store.last_slo_minute()) is not None:
            # Rolled up from compacted partitions: the minutes are all the store knows, so
            # the data is taken to end with the last minute.
            ends.append((minute + MINUTE, minute + MINUTE))
    if SliSource.METRICS in sources and (points := store.points_range()) is not None:
        ends.append((points[1], _ceil(points[1])))
    if not ends:
        return None
    return max(e[0] for e in ends), max(e[1] for e in ends)


def evaluation_instant(
    store: Store,
    *,
    specs: Sequence[SloSpec],
    at: datetime | None,
    now: datetime | None = None,
) -> EvaluationInstant:
    """Where an evaluation runs: at `at` when given, else at the end of the data the SLOs read
    (a store whose data ended weeks ago is judged on that data, not on empty windows), else
    (no data at all) at `now`.

    A given `at` inside a minute counts that minute when the data holds nothing after `at`
    (its last minute: nothing later could fall in it), and otherwise evaluates at the minute's
    start, saying so in `basis`, never silently.
    """
    end = data_end(store, specs=specs)
    data_time = None if end is None else end[0]
    if at is None:
        if end is None:
            return EvaluationInstant(
                _floor(_naive(now or utc_now())), InstantBasis.NO_DATA, None, None
            )
        return EvaluationInstant(end[1], InstantBasis.END_OF_DATA, None, data_time)
    requested = _naive(at)
    floor = _floor(requested)
    if floor == requested:
        return EvaluationInstant(floor, InstantBasis.REQUESTED, requested, data_time)
    if data_time is None or data_time <= requested:
        return EvaluationInstant(
            floor + MINUTE, InstantBasis.REQUESTED_LAST_MINUTE, requested, data_time
        )
    return EvaluationInstant(floor, InstantBasis.REQUESTED_FLOORED, requested, data_time)


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
        # Summed in the store over the dimensions no scope selects on.
        scoped_by = sorted({key for spec in specs for key, _ in spec.scope})
        frames = [store.read_slo_minutes(from_ts=start, to_ts=end, by=scoped_by)]
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


@dataclass(frozen=True)
class MetricAlertInputs:
    """What the alerts of metric-counted SLOs read besides the minute sums: their alert
    windows as PromQL's `sum(increase(...))` gives them (`slo.counter_windows`), and whether
    their series are present, for the absent-data alert (`slo.absent_alert`)."""

    sums: pl.LazyFrame
    presence: pl.LazyFrame


def metric_alert_inputs(
    store: Store, *, specs: Sequence[SloSpec], instants: Sequence[datetime]
) -> MetricAlertInputs | None:
    """The alert inputs of the metric-counted SLOs at each of `instants`, from the stored
    samples, so the evaluation agrees with Prometheus running `slo rules`' output minute by
    minute. None when no SLO is counted from metrics."""
    # An SLO without alert windows has no alert for the absent-data alert to stand in for.
    metric_specs = [s for s in specs if s.metric_criterion() is not None and s.windows]
    if not metric_specs or not instants:
        return None
    criteria = [c for s in metric_specs if (c := s.metric_criterion()) is not None]
    windows = sorted(
        {
            (spec.name, length)
            for spec in metric_specs
            for pair in spec.windows
            for length in (pair.long_window_s, pair.short_window_s)
        }
    )
    longest = max([LOOKBACK_S, *(length for _, length in windows)])
    dimensions = series_dimensions(store.read_series(), store.read_targets())
    chosen = metric_slo_series(dimensions, criteria=criteria)
    for spec in metric_specs:
        for key, value in spec.scope:
            if key in chosen.collect_schema().names():
                chosen = chosen.filter((pl.col("slo") != spec.name) | (pl.col(key) == value))
    points = store.read_points(
        from_ts=min(instants) - timedelta(seconds=longest), to_ts=max(instants) + MINUTE
    )
    # Collected once: both the window sums and the presence read these samples.
    samples = (
        points.join(chosen.select("series_id", "slo", "role").collect().lazy(), on="series_id")
        .filter(pl.col("ts") <= max(instants))
        .select(SAMPLES_COLUMNS)
        .collect()
        .lazy()
    )
    return MetricAlertInputs(
        sums=window_increases(samples, instants=instants, windows_s=windows),
        presence=present_at(samples, instants=instants, slos=[s.name for s in metric_specs]),
    )


def replay_from_store(
    store: Store, *, specs: Sequence[SloSpec], start: datetime, end: datetime
) -> tuple[AlertChange, ...]:
    """Every minute's alert evaluation from `start` to `end` in virtual time, as the scheduled
    evaluation would have recorded it (metric SLOs through `metric_alert_inputs`)."""
    minutes = slo_minutes_at(store, specs=specs, at=end)
    first = start.replace(second=0, microsecond=0)
    count = int((end.replace(second=0, microsecond=0) - first) / MINUTE) + 1
    instants = [first + i * MINUTE for i in range(max(count, 0))]
    inputs = metric_alert_inputs(store, specs=specs, instants=instants)
    return replay(
        minutes,
        specs=specs,
        start=start,
        end=end,
        alert_sums=None if inputs is None else inputs.sums,
        presence=None if inputs is None else inputs.presence,
    )


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
    inputs = metric_alert_inputs(store, specs=specs, instants=[evaluation_minute(at)])
    return step(
        minutes,
        specs=specs,
        at=at,
        states=states,
        notifier=notifier,
        alert_sums=None if inputs is None else inputs.sums,
        presence=None if inputs is None else inputs.presence,
    )


def limits_of(specs: Sequence[SloSpec]) -> GoodputLimits:
    """The latency limits of the first goodput SLO (what a replica's attainment is counted
    against when no limits are given), else none."""
    for spec in specs:
        ttft_s, tpot_s = getattr(spec.sli, "ttft_s", None), getattr(spec.sli, "tpot_s", None)
        if ttft_s is not None and tpot_s is not None:
            return GoodputLimits(ttft_s=ttft_s, tpot_s=tpot_s)
    return GoodputLimits()


def objective_of(specs: Sequence[SloSpec], *, default: float) -> float:
    """The strictest objective among SLOs counted from traced requests (what a finding's harm
    is priced against), else `default`."""
    traced = [s.objective_ratio for s in specs if s.event_criterion() is not None]
    return max(traced, default=default)
