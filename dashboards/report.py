"""Report: which charts a report holds, built from whatever frames the caller has.

The caller reads frames from the store (requests, minute rollups, SLO and metric rollups,
capacity results) and passes them in `ReportInputs`; every field is optional. For each panel the
best source wins: exact per-request traces over histogram quantiles, a metric's own counter over
a value derived from spans. A panel with no source is listed in `Report.omitted` with what it
needs, so a short report says why it is short. Time frames are cut to the report window and all
time axes share it, so charts line up when read one under another.

Size: over 500 lines on purpose: it decides, panel by panel, which source wins and what an
omitted panel needs; each panel's builder lives in its own module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import polars as pl

from servewatch.dashboards.alert_band import alert_bands_chart
from servewatch.dashboards.attainment import (
    attainment_chart,
    goodput_chart,
    has_token_counts,
    token_goodput_chart,
)
from servewatch.dashboards.box_signal import BoxFrames
from servewatch.dashboards.burn_rate import burn_rate_chart
from servewatch.dashboards.capacity_answer import CapacityAnswer
from servewatch.dashboards.capacity_curve import CapacityCurve, capacity_curve_chart
from servewatch.dashboards.drill_timeline import drill_timeline_chart
from servewatch.dashboards.error_budget import budget_remaining_chart
from servewatch.dashboards.failure_table import failure_table_chart
from servewatch.dashboards.finish_reason import (
    DERIVED_FROM_SPANS,
    finish_reason_chart,
    finish_reasons_from_requests,
)
from servewatch.dashboards.gpu_health import gpu_health_chart
from servewatch.dashboards.gpu_replicas import gpu_replicas_chart
from servewatch.dashboards.gpu_unmatched import gpu_unmatched_chart
from servewatch.dashboards.health_findings import (
    findings_frame,
    findings_table_chart,
    findings_timeline_chart,
)
from servewatch.dashboards.kv_usage import kv_usage_heatmap
from servewatch.dashboards.latency import LatencyStat, latency_chart, latency_from_requests
from servewatch.dashboards.latency_heatmap import latency_heatmap_chart
from servewatch.dashboards.load_balance import load_balance_chart
from servewatch.dashboards.panel import TimeDomain, natural_order
from servewatch.dashboards.prefix_cache import prefix_cache_chart
from servewatch.dashboards.prompt_token_sources import prompt_token_sources_chart
from servewatch.dashboards.replica_table import replica_chart, replica_rows
from servewatch.dashboards.request_length import (
    LengthKind,
    lengths_from_requests,
    request_length_chart,
)
from servewatch.dashboards.request_phase import phases_from_requests, request_phase_chart
from servewatch.dashboards.scheduler_state import scheduler_state_chart
from servewatch.dashboards.scrape_health import scrape_health_chart
from servewatch.dashboards.seven_boxes import box_signals, seven_boxes_chart
from servewatch.dashboards.slo_verdict import SloVerdict
from servewatch.dashboards.token_throughput import (
    COUNTER_SOURCE,
    TRACES_SOURCE,
    throughput_from_request_minutes,
    token_throughput_chart,
)
from servewatch.dashboards.tornado import tornado_chart
from servewatch.health.finding import Finding
from servewatch.pipeline.request_minutes import request_minutes
from servewatch.pipeline.request_sli import GoodputLimits

Frame = pl.DataFrame | pl.LazyFrame
TRACES = "traced requests"
HISTOGRAMS = "vLLM histograms"
MAX_MODELS_LISTED = 8


class Section(Enum):
    """The page's sections in page order: the answers first, then the detail charts."""

    VERDICT = "SLO verdicts"
    CAPACITY = "Capacity: the recommended fleet"
    REPLICAS = "Which replica"
    HEALTH = "Fleet health findings"
    LATENCY = "Latency"
    SLO = "SLOs, error budgets and alerts"
    ENGINE = "Engine: scheduler, KV cache and tokens"
    REQUESTS = "Requests: lengths and finish reasons"
    GPU = "GPUs"
    BOXES = "The seven boxes: gateway to observer"


# What a reader can run to fill a section that has no data, in their words.
TRACES_HINT = (
    "ingest traces (servewatch ingest traces FILE) or point vLLM's OTLP export at servewatch run"
)
SCRAPE_HINT = "scrape the replicas' /metrics (servewatch scrape, or servewatch run)"
SLO_HINT = (
    "pass --slo FILE to servewatch report, or list SLO files in servewatch.toml ([slo] files)"
)
REQUIREMENT_HINT = "pass --requirement FILE to servewatch report (see docs/capacity.md)"


@dataclass(frozen=True)
class ReportChart:
    slug: str
    section: Section
    title: str
    chart: Any


@dataclass(frozen=True)
class Report:
    title: str
    window: TimeDomain | None
    facts: tuple[tuple[str, str], ...]
    charts: tuple[ReportChart, ...]
    omitted: tuple[tuple[str, str], ...]
    # The answers above the charts: per-SLO verdicts, the capacity answer, the replica table.
    verdicts: tuple[SloVerdict, ...] = ()
    capacity_answer: CapacityAnswer | None = None
    replicas: pl.DataFrame | None = None
    # The objective a replica's attainment is held to in the replica table (the strictest
    # trace-counted SLO's), when SLOs were given.
    replica_objective_ratio: float | None = None


@dataclass(frozen=True)
class CapacityView:
    points: Frame
    curve: CapacityCurve


@dataclass(frozen=True)
class FailureView:
    rows: Frame
    demand_rate: float
    rate_unit: str
    failure_unit: str


@dataclass(frozen=True)
class TornadoView:
    rows: Frame
    baseline_replicas: int


@dataclass(frozen=True)
class DrillView:
    """The failure drills of a recommendation: minutes per fleet and what they concluded."""

    minutes: Frame
    target_ratio: float
    lost: str
    recovery_s: float
    verdicts: tuple[str, ...]


@dataclass(frozen=True)
class ReportInputs:
    """Frames for the report; each field's columns are those of the chart it feeds (see
    docs/dashboards.md). `latency_percentiles` adds a `stat` column (ttft, tpot, itl, e2e)
    and `request_lengths` a `kind` column (prompt, generation) to their charts' columns."""

    requests: Frame | None = None
    request_minutes: Frame | None = None
    slo_minutes: Frame | None = None
    sli_report: Mapping[str, Any] | None = None
    slo_objectives: Mapping[str, float] = field(default_factory=dict)
    latency_percentiles: Frame | None = None
    request_phases: Frame | None = None
    # vLLM's latency histogram buckets per minute (LATENCY_BUCKETS_CONTRACT): the heatmaps.
    latency_buckets: Frame | None = None
    token_throughput: Frame | None = None
    finish_reasons: Frame | None = None
    request_lengths: Frame | None = None
    kv_cache_usage: Frame | None = None
    prefix_cache: Frame | None = None
    scheduler_state: Frame | None = None
    gpu: Frame | None = None
    xid_events: Frame | None = None
    # GPUs (and MIG slices) that serve no replica (pipeline.gpu_attribution.UNMATCHED_GPUS_SCHEMA
    # columns): in no replica's figures, so named among the report's facts.
    unmatched_gpus: Frame | None = None
    # The scrape targets (TARGETS_SCHEMA): which engine serves each pool, named among the facts.
    targets: Frame | None = None
    # The store's scrapes (SCRAPES_SCHEMA): failed scrapes and unreachable targets.
    scrapes: Frame | None = None
    budget_remaining: Frame | None = None
    burn_rates: Frame | None = None
    burn_thresholds: Frame | None = None
    alert_intervals: Frame | None = None
    capacity: CapacityView | None = None
    failure_table: FailureView | None = None
    tornado: TornadoView | None = None
    drill: DrillView | None = None
    # What the fleet-health detectors found over the window (None: they were not run).
    findings: Sequence[Finding] | None = None
    # Each SLO's verdict at the end of the window (None: no SLOs were given).
    slo_verdicts: Sequence[SloVerdict] | None = None
    capacity_answer: CapacityAnswer | None = None
    # The objective replicas are held to in the replica table.
    replica_objective_ratio: float | None = None
    # vLLM's prompt tokens by source per minute (pipeline.prompt_token_sources columns).
    prompt_token_sources: Frame | None = None


def slug(text: str) -> str:
    """A file-name-safe slug of a label (SLO names come from users)."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return cleaned or "unnamed"


def _in_window(frame: Frame, column: str, window: TimeDomain | None) -> pl.LazyFrame:
    lazy = frame.lazy()
    if window is None:
        return lazy
    return lazy.filter((pl.col(column) >= window[0]) & (pl.col(column) < window[1]))


def _limits(limits: GoodputLimits | None, sli_report: Mapping[str, Any] | None) -> GoodputLimits:
    if limits is not None:
        return limits
    if sli_report is None:
        return GoodputLimits()
    given = sli_report.get("limits", {})

    def seconds(key: str) -> float | None:
        value = given.get(key)
        return None if value is None else float(value) / 1000.0

    return GoodputLimits(
        ttft_s=seconds("ttft_ms"), tpot_s=seconds("tpot_ms"), e2e_s=seconds("e2e_ms")
    )


def _window_text(window: TimeDomain) -> str:
    minutes = round((window[1] - window[0]).total_seconds() / 60)
    return f"{window[0]:%Y-%m-%d %H:%M} to {window[1]:%Y-%m-%d %H:%M} UTC ({minutes:,} minutes)"


def _ms_triplet(values: Mapping[str, Any]) -> str:
    parts = [values.get(p) for p in ("p50", "p95", "p99")]
    numbers = [float(v) for v in parts if v is not None]
    if len(numbers) < len(parts):
        return "-"
    return " / ".join(f"{v * 1000:,.0f}" for v in numbers) + " ms"


def _facts(
    *,
    window: TimeDomain | None,
    requests: pl.DataFrame | None,
    sli_report: Mapping[str, Any] | None,
    limits: GoodputLimits,
) -> tuple[tuple[str, str], ...]:
    facts: list[tuple[str, str]] = []
    if window is not None:
        facts.append(("window", _window_text(window)))
    if requests is not None:
        failed = requests.filter(~pl.col("ok")).height
        facts.append(("requests", f"{requests.height:,} ({failed:,} failed)"))
        replicas = natural_order([r for r in requests["replica"].to_list() if r is not None])
        facts.append(("replicas", f"{len(replicas):,}"))
        models = natural_order([m for m in requests["model"].to_list() if m is not None])
        if models:
            listed = ", ".join(models[:MAX_MODELS_LISTED])
            more = len(models) - MAX_MODELS_LISTED
            facts.append(("models", listed + (f" and {more} more" if more > 0 else "")))
    given = [
        f"{name} <= {value * 1000:g} ms"
        for name, value in (("TTFT", limits.ttft_s), ("TPOT", limits.tpot_s), ("e2e", limits.e2e_s))
        if value is not None
    ]
    if given:
        facts.append(("latency limits", ", ".join(given)))
    if sli_report is not None:
        overall = sli_report.get("overall", {})
        for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "e2e")):
            if key in overall:
                facts.append((f"{name} p50 / p95 / p99", _ms_triplet(overall[key])))
        attainment = overall.get("attainment_ratio")
        if attainment is not None:
            facts.append(("attainment", f"{float(attainment):.2%} of requests met every limit"))
        goodput = overall.get("goodput_rps")
        if goodput is not None:
            facts.append(("goodput", f"{float(goodput):.3g} good requests/s"))
        tokens = overall.get("token_goodput_tps")
        if tokens is not None:
            ratio = overall.get("token_goodput_ratio")
            share = "" if ratio is None else f" ({float(ratio):.2%} of output tokens)"
            facts.append(("token goodput", f"{float(tokens):,.4g} good output tokens/s{share}"))
    return tuple(facts)


def _window_of(frames: list[tuple[pl.LazyFrame, str]]) -> TimeDomain | None:
    firsts: list[datetime] = []
    lasts: list[datetime] = []
    for frame, column in frames:
        bounds = frame.select(
            first=pl.col(column).min().dt.truncate("1m"), last=pl.col(column).max()
        ).collect()
        first, last = bounds["first"][0], bounds["last"][0]
        if isinstance(first, datetime) and isinstance(last, datetime):
            firsts.append(first)
            lasts.append(last)
    if not firsts:
        return None
    end = max(lasts).replace(second=0, microsecond=0) + timedelta(minutes=1)
    return (min(firsts), end)


def _naive_utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        return moment
    return moment.astimezone(UTC).replace(tzinfo=None)


class _Builder:
    """Collects charts and omissions in report order."""

    def __init__(self) -> None:
        self.charts: list[ReportChart] = []
        self.omitted: list[tuple[str, str]] = []

    def add(self, slug_: str, section: Section, title: str, chart: Any) -> None:
        taken = {c.slug for c in self.charts}
        unique, n = slug_, 2
        while unique in taken:
            unique, n = f"{slug_}-{n}", n + 1
        self.charts.append(ReportChart(unique, section, title, chart))

    def omit(self, panel: str, reason: str) -> None:
        self.omitted.append((panel, reason))


def build_report(
    inputs: ReportInputs,
    *,
    title: str = "servewatch report",
    window: TimeDomain | None = None,
    limits: GoodputLimits | None = None,
) -> Report:
    """Every chart the inputs allow, over `window` (default: the span of the time frames).

    `window` is [start, end) in naive UTC like the store's columns; an aware datetime is
    converted.
    """
    if window is not None:
        window = (_naive_utc(window[0]), _naive_utc(window[1]))
        if window[1] <= window[0]:
            raise ValueError(f"report window ends ({window[1]}) before it starts ({window[0]})")
    time_frames: list[tuple[pl.LazyFrame, str]] = []
    if inputs.requests is not None:
        time_frames.append((inputs.requests.lazy(), "end_ts"))
    minute_frames = (inputs.request_minutes, inputs.slo_minutes, inputs.kv_cache_usage)
    time_frames += [(m.lazy(), "minute_ts") for m in minute_frames if m is not None]
    window = window if window is not None else _window_of(time_frames)
    limits = _limits(limits, inputs.sli_report)
    out = _Builder()

    requests = (
        _in_window(inputs.requests, "end_ts", window).collect()
        if inputs.requests is not None
        else None
    )
    # The answers first: SLO verdicts, the capacity answer, which replica.
    if inputs.slo_verdicts is None:
        out.omit("SLO verdicts", f"no SLOs were given: {SLO_HINT}")
    _capacity(out, inputs)
    replicas = replica_rows(inputs.sli_report)
    if replicas.is_empty():
        out.omit("Which replica", "no traced requests by replica in this window")
    else:
        chart = replica_chart(replicas, objective_ratio=inputs.replica_objective_ratio)
        out.add("replicas", Section.REPLICAS, "Replicas side by side", chart)
    # The detail charts, in page order: a new panel appends its call here.
    _health(out, inputs, window=window)
    _scrape_health(out, inputs, window=window)
    _latency(out, inputs, requests=requests, window=window, limits=limits)
    _slo(out, inputs, window=window)
    _engine(out, inputs, requests=requests, window=window)
    _request_mix(out, inputs, requests=requests, window=window)
    _load_balance(out, inputs, window=window)
    _gpu(out, inputs, window=window)
    _prompt_token_sources(out, inputs, window=window)
    _seven_boxes(out, inputs, requests=requests, window=window)
    return Report(
        title=title,
        window=window,
        facts=_facts(window=window, requests=requests, sli_report=inputs.sli_report, limits=limits)
        + _finding_facts(inputs.findings)
        + _pool_facts(inputs.targets)
        + _unmatched_gpu_facts(inputs.unmatched_gpus),
        charts=tuple(out.charts),
        omitted=tuple(out.omitted),
        verdicts=tuple(inputs.slo_verdicts or ()),
        capacity_answer=inputs.capacity_answer,
        replicas=None if replicas.is_empty() else replicas,
        replica_objective_ratio=inputs.replica_objective_ratio,
    )


MAX_GPUS_LISTED = 8
_NOT_ENGINES = ("dcgm", "auto")


def _pool_facts(frame: Frame | None) -> tuple[tuple[str, str], ...]:
    """Each pool with the engines that serve it and their replicas, so a fleet mixing engines
    reads as its pools: `chat (vllm x2), batch (tgi x1)`."""
    if frame is None:
        return ()
    pools = (
        frame.lazy()
        .filter(~pl.col("kind").is_in(_NOT_ENGINES))
        .group_by(pool=pl.col("pool").fill_null("-"), engine=pl.col("kind"))
        .agg(replicas=pl.col("replica").n_unique())
        .collect()
    )
    if pools.is_empty():
        return ()
    engines: dict[str, list[str]] = {}
    for row in pools.sort("engine").iter_rows(named=True):
        engines.setdefault(row["pool"], []).append(f"{row['engine']} x{row['replicas']}")
    named = natural_order(list(engines))
    text = ", ".join(f"{pool} ({', '.join(engines[pool])})" for pool in named)
    return (("pools", text),)


def _unmatched_gpu_facts(frame: Frame | None) -> tuple[tuple[str, str], ...]:
    """The GPUs that serve no replica, named, so that a fleet's GPU figures are read as what
    they are: its replicas' GPUs only."""
    rows = [] if frame is None else frame.lazy().collect().to_dicts()
    if not rows:
        return ()
    named = [
        f"{row['hostname'] or '?'} {row['uuid'] or '?'}"
        + (f" MIG {row['gpu_instance']}" if row["gpu_instance"] else "")
        + (f" (pod {row['namespace']}/{row['pod']}, {row['rule']})" if row["pod"] else "")
        + ("" if row["pod"] else f" ({row['rule']})")
        for row in rows[:MAX_GPUS_LISTED]
    ]
    more = len(rows) - MAX_GPUS_LISTED
    text = f"{len(rows):,}: " + "; ".join(named) + (f" and {more} more" if more > 0 else "")
    return (("GPUs serving no replica", text),)


def _finding_facts(findings: Sequence[Finding] | None) -> tuple[tuple[str, str], ...]:
    if findings is None:
        return ()
    if not findings:
        return (("health findings", "none: no failure mode shows in this window"),)
    kinds = natural_order([f.kind.value for f in findings])
    ongoing = sum(1 for f in findings if f.end is None)
    return (
        (
            "health findings",
            f"{len(findings)} ({', '.join(kinds)}), {ongoing} ongoing at the end of the window",
        ),
    )


def _health(out: _Builder, inputs: ReportInputs, *, window: TimeDomain | None) -> None:
    title = "Health findings"
    if inputs.findings is None:
        out.omit(title, "the fleet-health detectors were not run: servewatch health runs them")
        return
    if not inputs.findings:
        out.omit(title, "no findings: none of the failure modes shows in this window")
        return
    frame = findings_frame(inputs.findings)
    out.add("health-findings", Section.HEALTH, title, findings_table_chart(frame))
    timeline = findings_timeline_chart(frame, domain=window)
    out.add("health-findings-timeline", Section.HEALTH, "Health findings over time", timeline)


def _scrape_health(out: _Builder, inputs: ReportInputs, *, window: TimeDomain | None) -> None:
    title = "Scrape health and unreachable targets"
    scrapes = None if inputs.scrapes is None else _in_window(inputs.scrapes, "ts", window).collect()
    if scrapes is None or scrapes.is_empty():
        out.omit(title, "no data: no target was scraped in this window (servewatch scrape or run)")
        return
    out.add("scrape-health", Section.HEALTH, title, scrape_health_chart(scrapes, domain=window))


def _latency(
    out: _Builder,
    inputs: ReportInputs,
    *,
    requests: pl.DataFrame | None,
    window: TimeDomain | None,
    limits: GoodputLimits,
) -> None:
    limit_of = {LatencyStat.TTFT: limits.ttft_s, LatencyStat.TPOT: limits.tpot_s}
    limit_of[LatencyStat.E2E] = limits.e2e_s
    for stat in (LatencyStat.TTFT, LatencyStat.TPOT, LatencyStat.ITL, LatencyStat.E2E):
        frame: pl.DataFrame | None = None
        source = HISTOGRAMS
        if requests is not None and stat is not LatencyStat.ITL:
            frame = latency_from_requests(requests.lazy(), stat=stat).collect()
            source = TRACES
        elif inputs.latency_percentiles is not None:
            frame = (
                _in_window(inputs.latency_percentiles, "minute_ts", window)
                .filter(pl.col("stat") == stat.value)
                .collect()
            )
        if frame is None or frame.is_empty():
            needs = (
                f"no scraped vLLM inter-token latency histogram in this window: {SCRAPE_HINT}"
                if stat is LatencyStat.ITL
                else f"no traced requests or scraped latency histograms in this window: "
                f"{TRACES_HINT}, or {SCRAPE_HINT}"
            )
            out.omit(stat.title, needs)
            continue
        chart = latency_chart(
            frame,
            stat=stat,
            limit_s=limit_of.get(stat),
            source=source,
            domain=window,
            alerts=inputs.alert_intervals,
        )
        out.add(f"latency-{stat.value}", Section.LATENCY, stat.title, chart)

    title = "Latency histograms"
    buckets = (
        None
        if inputs.latency_buckets is None
        else _in_window(inputs.latency_buckets, "minute_ts", window).collect()
    )
    if buckets is None or buckets.is_empty():
        out.omit(title, f"no scraped vLLM latency histograms in this window: {SCRAPE_HINT}")
    else:
        out.add(
            "latency-histograms",
            Section.LATENCY,
            title,
            latency_heatmap_chart(buckets, domain=window),
        )

    phases: pl.DataFrame | None = None
    source = HISTOGRAMS
    if requests is not None:
        phases, source = phases_from_requests(requests.lazy()).collect(), TRACES
    elif inputs.request_phases is not None:
        phases = _in_window(inputs.request_phases, "minute_ts", window).collect()
    title = "Queue, prefill and decode time"
    if phases is None or phases.is_empty():
        out.omit(title, f"no traced requests in this window: {TRACES_HINT}")
    else:
        chart = request_phase_chart(phases, source=source, domain=window)
        out.add("request-phases", Section.LATENCY, title, chart)


def _slo_events(out: _Builder, inputs: ReportInputs, *, window: TimeDomain | None) -> None:
    """Attainment, goodput and token goodput from `slo_minutes`."""
    if inputs.slo_minutes is not None:
        events = _in_window(inputs.slo_minutes, "minute_ts", window).collect()
        if not events.is_empty():
            chart = attainment_chart(events, objectives=inputs.slo_objectives, domain=window)
            out.add("attainment", Section.SLO, "SLO attainment", chart)
            out.add("goodput", Section.SLO, "Goodput", goodput_chart(events, domain=window))
            if has_token_counts(events):
                chart = token_goodput_chart(events, domain=window)
                out.add("token-goodput", Section.SLO, "Token goodput", chart)
    if not any(c.slug == "attainment" for c in out.charts):
        out.omit("SLO attainment and goodput", f"no SLO events in this window: {SLO_HINT}")
    elif not any(c.slug == "token-goodput" for c in out.charts):
        out.omit(
            "Token goodput",
            "no token goodput SLO counts output tokens: add an SLO of kind token_goodput "
            "(docs/slo.md)",
        )


def _slo(out: _Builder, inputs: ReportInputs, *, window: TimeDomain | None) -> None:
    _slo_events(out, inputs, window=window)

    if inputs.budget_remaining is not None:
        budget = _in_window(inputs.budget_remaining, "minute_ts", window).collect()
        if not budget.is_empty():
            chart = budget_remaining_chart(budget, domain=window)
            out.add("error-budget", Section.SLO, "Error budget remaining", chart)
    if not any(c.slug == "error-budget" for c in out.charts):
        out.omit("Error budget remaining", f"no SLOs were given: {SLO_HINT}")

    burns = (
        _in_window(inputs.burn_rates, "minute_ts", window).collect()
        if inputs.burn_rates is not None
        else None
    )
    if burns is None or burns.is_empty():
        out.omit("Burn rates", f"no SLOs were given: {SLO_HINT}")
    else:
        for slo in natural_order(burns["slo"].to_list()):
            chart = burn_rate_chart(
                burns,
                slo=slo,
                thresholds=inputs.burn_thresholds,
                alerts=inputs.alert_intervals,
                domain=window,
            )
            out.add(f"burn-rate-{slug(slo)}", Section.SLO, f"Burn rate: {slo}", chart)

    if inputs.alert_intervals is None:
        out.omit("Firing alerts", f"no SLOs were given: {SLO_HINT}")
    else:
        intervals = inputs.alert_intervals.lazy()
        if window is not None:
            # Intervals that overlap the window; an open one overlaps if it started before its end.
            intervals = intervals.filter(
                (pl.col("start_ts") < window[1])
                & (pl.col("end_ts").is_null() | (pl.col("end_ts") > window[0]))
            )
        firing = intervals.collect()
        # No alert fired: the verdicts say "none"; an empty timeline would add nothing.
        if not firing.is_empty():
            chart = alert_bands_chart(firing, domain=window)
            out.add("alerts", Section.SLO, "Firing alerts", chart)


def _engine(
    out: _Builder, inputs: ReportInputs, *, requests: pl.DataFrame | None, window: TimeDomain | None
) -> None:
    panels = (
        ("kv-cache-usage", "KV-cache usage per replica", inputs.kv_cache_usage, kv_usage_heatmap),
        ("prefix-cache-hit-rate", "Prefix-cache hit rate", inputs.prefix_cache, prefix_cache_chart),
        ("scheduler-state", "Scheduler state", inputs.scheduler_state, scheduler_state_chart),
    )
    for slug_, title, frame, builder in panels:
        rows = _in_window(frame, "minute_ts", window).collect() if frame is not None else None
        if rows is None or rows.is_empty():
            out.omit(title, f"no scraped vLLM series for it in this window: {SCRAPE_HINT}")
            continue
        out.add(slug_, Section.ENGINE, title, builder(rows, domain=window))

    title = "Token throughput"
    if inputs.token_throughput is not None:
        tokens = _in_window(inputs.token_throughput, "minute_ts", window).collect()
        source = COUNTER_SOURCE
    elif inputs.request_minutes is not None:
        minutes = _in_window(inputs.request_minutes, "minute_ts", window)
        tokens = throughput_from_request_minutes(minutes).collect()
        source = TRACES_SOURCE
    elif requests is not None:
        tokens = throughput_from_request_minutes(request_minutes(requests.lazy())).collect()
        source = TRACES_SOURCE
    else:
        tokens, source = pl.DataFrame(), ""
    if tokens.is_empty():
        out.omit(title, f"no token counts in this window: {SCRAPE_HINT}, or {TRACES_HINT}")
    else:
        chart = token_throughput_chart(tokens, source=source, domain=window)
        out.add("token-throughput", Section.ENGINE, title, chart)


def _load_balance(out: _Builder, inputs: ReportInputs, *, window: TimeDomain | None) -> None:
    title = "Load balance across replicas"
    minutes = (
        None
        if inputs.request_minutes is None
        else _in_window(inputs.request_minutes, "minute_ts", window)
        .filter(pl.col("replica").is_not_null())
        .collect()
    )
    if minutes is None or minutes.is_empty():
        out.omit(title, f"no traced requests by replica in this window: {TRACES_HINT}")
        return
    out.add("load-balance", Section.REQUESTS, title, load_balance_chart(minutes, domain=window))


def _request_mix(
    out: _Builder, inputs: ReportInputs, *, requests: pl.DataFrame | None, window: TimeDomain | None
) -> None:
    title = "Finish reasons"
    if inputs.finish_reasons is not None:
        reasons = _in_window(inputs.finish_reasons, "minute_ts", window).collect()
        source = "vLLM request_success_total"
    elif requests is not None:
        reasons = finish_reasons_from_requests(requests.lazy()).collect()
        source = DERIVED_FROM_SPANS
    else:
        reasons, source = pl.DataFrame(), ""
    if reasons.is_empty():
        out.omit(title, f"no finished requests in this window: {SCRAPE_HINT}, or {TRACES_HINT}")
    else:
        chart = finish_reason_chart(reasons, source=source, domain=window)
        out.add("finish-reasons", Section.REQUESTS, title, chart)

    for kind in (LengthKind.PROMPT, LengthKind.GENERATION):
        if inputs.request_lengths is not None:
            lengths = (
                _in_window(inputs.request_lengths, "minute_ts", window)
                .filter(pl.col("kind") == kind.value)
                .collect()
            )
            source = HISTOGRAMS
        elif requests is not None:
            lengths = lengths_from_requests(requests.lazy(), kind=kind).collect()
            source = TRACES
        else:
            lengths, source = pl.DataFrame(), ""
        if lengths.is_empty():
            out.omit(kind.title, f"no request lengths in this window: {TRACES_HINT}")
            continue
        chart = request_length_chart(lengths, kind=kind, source=source, domain=window)
        out.add(f"{kind.value}-length", Section.REQUESTS, kind.title, chart)


def _gpu(out: _Builder, inputs: ReportInputs, *, window: TimeDomain | None) -> None:
    title = "GPU health"
    rows = _in_window(inputs.gpu, "minute_ts", window).collect() if inputs.gpu is not None else None
    if rows is None or rows.is_empty():
        unmatched = (
            inputs.unmatched_gpus is not None
            and inputs.unmatched_gpus.lazy().select(pl.len()).collect().item() != 0
        )
        out.omit(
            title,
            "the scraped GPUs serve no replica servewatch can tell (listed among the facts): "
            "scrape dcgm-exporter with its Kubernetes pod mapping, or run one replica per host "
            "(docs/catalogues.md)"
            if unmatched
            else 'no DCGM series in this window: add dcgm-exporter targets (kind = "dcgm") to '
            "servewatch.toml",
        )
        return
    xids = (
        _in_window(inputs.xid_events, "ts", window).collect()
        if inputs.xid_events is not None
        else None
    )
    out.add(
        "gpu-health", Section.GPU, title, gpu_health_chart(rows, xid_events=xids, domain=window)
    )
    chart = gpu_replicas_chart(rows, domain=window)
    out.add("gpu-replicas", Section.GPU, "GPUs per replica (DCGM)", chart)
    unmatched = None if inputs.unmatched_gpus is None else inputs.unmatched_gpus.lazy().collect()
    if unmatched is not None and not unmatched.is_empty():
        out.add(
            "gpu-unmatched", Section.GPU, "GPUs serving no replica", gpu_unmatched_chart(unmatched)
        )


def _capacity(out: _Builder, inputs: ReportInputs) -> None:
    """The capacity answer's charts; without a recommendation, one line says how to get one."""
    views = (inputs.capacity_answer, inputs.capacity, inputs.failure_table, inputs.tornado)
    if all(view is None for view in (*views, inputs.drill)):
        out.omit("Capacity answer", f"no capacity requirement was given: {REQUIREMENT_HINT}")
        return
    if inputs.capacity is not None:
        chart = capacity_curve_chart(inputs.capacity.points, curve=inputs.capacity.curve)
        out.add("capacity-curve", Section.CAPACITY, "Capacity curve", chart)
    if inputs.failure_table is not None:
        view = inputs.failure_table
        chart = failure_table_chart(
            view.rows,
            demand_rate=view.demand_rate,
            rate_unit=view.rate_unit,
            failure_unit=view.failure_unit,
        )
        out.add("failure-table", Section.CAPACITY, "Failure table", chart)
    if inputs.tornado is not None:
        chart = tornado_chart(
            inputs.tornado.rows, baseline_replicas=inputs.tornado.baseline_replicas
        )
        out.add("sensitivity-tornado", Section.CAPACITY, "Sensitivity tornado", chart)
    if inputs.drill is not None:
        drill = inputs.drill
        chart = drill_timeline_chart(
            drill.minutes,
            target_ratio=drill.target_ratio,
            lost=drill.lost,
            recovery_s=drill.recovery_s,
            verdicts=drill.verdicts,
        )
        out.add("failure-drill", Section.CAPACITY, "Failure drill", chart)


def _prompt_token_sources(
    out: _Builder, inputs: ReportInputs, *, window: TimeDomain | None
) -> None:
    title = "Prompt tokens by source"
    frame = inputs.prompt_token_sources
    rows = None if frame is None else _in_window(frame, "minute_ts", window).collect()
    if rows is None or rows.is_empty():
        out.omit(
            title,
            "not exported: the engines send no prompt tokens by source (vLLM 0.16 and later "
            "count them as prompt_tokens_by_source_total)",
        )
        return
    chart = prompt_token_sources_chart(rows, domain=window)
    out.add("prompt-token-sources", Section.ENGINE, title, chart)


def _seven_boxes(
    out: _Builder, inputs: ReportInputs, *, requests: pl.DataFrame | None, window: TimeDomain | None
) -> None:
    def cut(frame: Frame | None, column: str) -> pl.DataFrame | None:
        return None if frame is None else _in_window(frame, column, window).collect()

    frames = BoxFrames(
        window=window,
        requests=requests,
        request_minutes=cut(inputs.request_minutes, "minute_ts"),
        finish_reasons=cut(inputs.finish_reasons, "minute_ts"),
        prefix_cache=cut(inputs.prefix_cache, "minute_ts"),
        scheduler_state=cut(inputs.scheduler_state, "minute_ts"),
        kv_cache_usage=cut(inputs.kv_cache_usage, "minute_ts"),
        prompt_token_sources=cut(inputs.prompt_token_sources, "minute_ts"),
        scrapes=cut(inputs.scrapes, "ts"),
        targets=None if inputs.targets is None else inputs.targets.lazy().collect(),
        findings=inputs.findings,
    )
    chart = seven_boxes_chart(box_signals(frames))
    out.add("seven-boxes", Section.BOXES, "The seven boxes", chart)
