"""The SLI report: SLIs per group (replica, pool, model) and for the fleet, as one JSON-ready
document, optionally with a series of consecutive windows, from either source or both: traced
requests (exact per-request percentiles, attainment, goodput) and scraped vLLM/DCGM series
(histogram quantiles as PromQL computes them, engine state, token throughput, GPU signals).

A pure function of a store window (`pipeline.window.Window`): the caller reads the window, from
the store or the service holding it (`points_window` says which points it needs)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import polars as pl

from servewatch.pipeline.cross_check import cross_check
from servewatch.pipeline.family_sli import family_frame, family_series, family_shape
from servewatch.pipeline.gpu_attribution import unmatched_gpu_readings
from servewatch.pipeline.instants import format_instant
from servewatch.pipeline.metric_sli import (
    COUNTERS,
    GAUGES,
    LATENCY_HISTOGRAMS,
    QUANTILES,
    Scope,
    counter_table,
    finish_reasons,
    gauge_table,
    histogram_quantiles,
    latency_quantiles,
)
from servewatch.pipeline.natural_sort import natural_key
from servewatch.pipeline.promql import to_milliseconds
from servewatch.pipeline.request_sli import LATENCY_SLIS, PERCENTILES, GoodputLimits, request_slis
from servewatch.pipeline.signals import Signal
from servewatch.pipeline.window import POINTS_LEAD, Window

COUNT_FIELDS = (
    "requests",
    "failed_requests",
    "good_requests",
    "attainment_ratio",
    "goodput_rps",
    "throughput_rps",
    "prompt_tokens",
    "completion_tokens",
    "good_output_tokens",
    "output_tokens",
    "token_goodput_tps",
    "token_goodput_ratio",
)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _row_to_json(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {name: row[name] for name in COUNT_FIELDS}
    for sli in LATENCY_SLIS:
        stem = sli.removesuffix("_s")
        out[sli] = {f"p{p}": row[f"{stem}_p{p}_s"] for p in PERCENTILES}
        out[sli]["samples"] = row[f"{stem}_samples"]
    return out


class Grouping(Enum):
    """What the per-group rows of a report are grouped by."""

    REPLICA = "replica"
    POOL = "pool"
    MODEL = "model"
    ADAPTER = "adapter"
    FLEET = "fleet"

    @property
    def metric_scope(self) -> Scope:
        """The grouping of scraped series: vLLM's latency and engine series carry no LoRA
        adapter, so by adapter they are shown for the fleet only."""
        return _METRIC_SCOPES.get(self, Scope.FLEET)


_METRIC_SCOPES = {
    Grouping.REPLICA: Scope.REPLICA,
    Grouping.POOL: Scope.POOL,
    Grouping.MODEL: Scope.MODEL,
}


class SliSource(Enum):
    """Which data the report reads: traced requests, scraped histograms and series, or both."""

    TRACES = "traces"
    HISTOGRAMS = "histograms"
    BOTH = "both"

    @property
    def traces(self) -> bool:
        return self is not SliSource.HISTOGRAMS

    @property
    def histograms(self) -> bool:
        return self is not SliSource.TRACES


def _groups(frame: pl.DataFrame, column: str | None) -> list[dict[str, Any]]:
    if column is None:
        return []
    rows = sorted(frame.iter_rows(named=True), key=lambda row: _group_key(row[column]))
    return [{column: row[column], **_row_to_json(row)} for row in rows]


def _group_key(value: Any) -> tuple[tuple[int, int | str], ...]:
    """Groups in natural order (vllm-2 before vllm-10), an unknown group last."""
    return natural_key(None if value is None else str(value))


def points_window(step: timedelta | None) -> dict[str, timedelta]:
    """How far around the report's window its points reach (`Store.read_window`'s
    `points_before` and `points_after`): the stepped cross-check reads a step before the
    first window and two after the last."""
    if step is None:
        return {"points_before": POINTS_LEAD, "points_after": timedelta()}
    return {"points_before": max(POINTS_LEAD, step), "points_after": 2 * step}


def build_sli_report(
    window: Window,
    *,
    limits: GoodputLimits,
    by: Grouping = Grouping.REPLICA,
    step: timedelta | None = None,
    source: SliSource = SliSource.TRACES,
    families: Sequence[str] = (),
) -> dict[str, Any]:
    """The SLI report of `source` over the window: the trace keys (`limits`, `overall`,
    `groups`, `series`, `cross_check`) when it includes traces, `histograms` when it
    includes histograms and the store holds scraped points in the window (see
    `histogram_section`), and `families` for each family named (`family_section`). `window`
    and `by` describe the request selection; `source` says what was asked for.
    """
    from_ts, to_ts = window.from_ts, window.to_ts
    report: dict[str, Any] = {"source": source.value, "by": by.value}
    if source.traces:
        report |= trace_section(window, limits=limits, by=by, step=step)
    else:
        report["window"] = {
            "from": format_instant(from_ts),
            "to": format_instant(to_ts),
            "window_s": (to_ts - from_ts).total_seconds() if from_ts and to_ts else None,
        }
    if source.histograms:
        section = histogram_section(window, by=by, step=step)
        if section is not None:
            report["histograms"] = section
    if families:
        report["families"] = family_section(window, families=families, by=by)
    return report


def family_section(
    window: Window, *, families: Sequence[str], by: Grouping = Grouping.REPLICA
) -> dict[str, Any]:
    """Each named family over the window, for the fleet and per group (`family_sli`): its
    `shape`, `overall` and `groups`; a family without series in the store says so."""
    span = window.stored_points
    dimensions = window.dimensions()
    out: dict[str, Any] = {}
    if span is None:
        return {name: {"shape": None, "overall": None, "groups": []} for name in families}
    start, end = window.from_ts or span.first, window.to_ts or span.last
    points = window.points_between(start, end + timedelta(microseconds=1))
    scope = by.metric_scope
    column = None if scope is Scope.FLEET else scope.value
    args = {"range_s": (end - start).total_seconds(), "window_end_s": _epoch_s(end)}
    for name in families:
        series = family_series(dimensions, family=name)
        metrics = series.select("metric").unique().collect().get_column("metric").to_list()
        shape = family_shape(metrics, family=name)
        if shape is None or args["range_s"] <= 0:
            out[name] = {"shape": None, "overall": None, "groups": []}
            continue
        fleet, groups = pl.collect_all(
            [
                family_frame(points, series, family=name, shape=shape, scope=Scope.FLEET, **args),
                family_frame(points, series, family=name, shape=shape, scope=scope, **args),
            ]
        )
        overall = fleet.to_dicts()[0] if fleet.height else None
        out[name] = {
            "shape": shape.value,
            "overall": overall,
            "groups": groups.to_dicts() if column else [],
        }
    return out


def trace_section(
    window: Window,
    *,
    limits: GoodputLimits,
    by: Grouping = Grouping.REPLICA,
    step: timedelta | None = None,
) -> dict[str, Any]:
    """SLIs of requests that finished in the window [from_ts, to_ts), per group and for the
    fleet.

    The window length for rates is to_ts - from_ts when both are given, else the span from
    the first arrival to the last completion of the selected requests. With `step`, the report
    also holds a series of consecutive windows of that length (aligned to from_ts, or to the
    first completion rounded down to the step), each with its own overall and group rows.
    """
    from_ts, to_ts = window.from_ts, window.to_ts
    window_s = (to_ts - from_ts).total_seconds() if from_ts and to_ts else None
    requests = window.requests.lazy()
    group = None if by is Grouping.FLEET else by.value
    plans = {
        "overall": request_slis(requests, limits=limits, window_s=window_s),
        "grouped": request_slis(
            requests, limits=limits, window_s=window_s, by=[group] if group else []
        ),
    }
    if step is not None:
        step_us = int(step.total_seconds() * 1_000_000)
        origin = pl.lit(from_ts) if from_ts else pl.col("end_ts").min().dt.truncate(f"{step_us}us")
        stepped = requests.with_columns(
            window_start=origin
            + pl.duration(
                microseconds=(pl.col("end_ts") - origin).dt.total_microseconds()
                // step_us
                * step_us
            )
        )
        plans["windows"] = request_slis(
            stepped, limits=limits, window_s=step.total_seconds(), by=["window_start"]
        )
        plans["window_groups"] = request_slis(
            stepped,
            limits=limits,
            window_s=step.total_seconds(),
            by=["window_start", group] if group else ["window_start"],
        )
    # All summaries share one scan of the requests; collect_all runs them together.
    collected = dict(zip(plans, pl.collect_all(plans.values()), strict=True))
    overall_row = collected["overall"].row(0, named=True)
    report: dict[str, Any] = {
        "window": {
            "from": format_instant(from_ts),
            "to": format_instant(to_ts),
            "window_s": overall_row["window_s"],
        },
        "limits": {
            "ttft_ms": _ms(limits.ttft_s),
            "tpot_ms": _ms(limits.tpot_s),
            "e2e_ms": _ms(limits.e2e_s),
        },
        "by": by.value,
        "overall": _row_to_json(overall_row),
        "groups": _groups(collected["grouped"], group),
    }
    if step is not None:
        window_rows, window_groups = collected["windows"], collected["window_groups"]
        report["cross_check"] = _cross_check(window, window_rows, step=step)
        report["series"] = [
            {
                "from": format_instant(row["window_start"]),
                "to": format_instant(row["window_start"] + step),
                "overall": _row_to_json(row),
                "groups": _groups(
                    window_groups.filter(pl.col("window_start") == row["window_start"]), group
                ),
            }
            for row in window_rows.iter_rows(named=True)
        ]
    return report


def _cross_check(
    window: Window, window_rows: pl.DataFrame, *, step: timedelta
) -> list[dict[str, Any]]:
    """TTFT p95 per window from traces against the same from vLLM's histogram, when scraped."""
    if window.stored_points is None or window_rows.height == 0:
        return []
    dimensions = window.dimensions()
    bounds = (
        dimensions.filter(pl.col("signal") == Signal.TTFT_S.value)
        .select(pl.col("le").drop_nulls().unique())
        .collect()
        .to_series()
        .to_list()
    )
    starts = window_rows["window_start"].to_list()
    ends_s = [(start + step).replace(tzinfo=UTC).timestamp() for start in starts]
    points = window.points_between(min(starts) - step, max(starts) + 2 * step)
    histogram = histogram_quantiles(
        points,
        dimensions,
        signal=Signal.TTFT_S,
        q=0.95,
        range_s=step.total_seconds(),
        window_ends_s=ends_s,
        scope=Scope.FLEET,
    ).select("window_end_s", histogram_s=pl.col("quantile"))
    traces = pl.LazyFrame(
        {"window_end_s": ends_s, "trace_s": window_rows["ttft_p95_s"].to_list()},
        schema={"window_end_s": pl.Float64, "trace_s": pl.Float64},
    )
    checked = cross_check(traces, histogram, bounds=bounds).collect()
    return [
        {
            "to": format_instant(
                datetime.fromtimestamp(row["window_end_s"], tz=UTC).replace(tzinfo=None)
            ),
            "trace_ttft_p95_s": row["trace_s"],
            "histogram_ttft_p95_s": row["histogram_s"],
            "bucket_width_s": row["bucket_width_s"],
            "diverges": row["diverges"],
        }
        for row in checked.iter_rows(named=True)
    ]


def _epoch_s(moment: datetime) -> float:
    """Epoch seconds of `moment` as whole milliseconds over 1000: the float the increase
    frames give back for a window end, so the two key the same rows."""
    return to_milliseconds(moment.replace(tzinfo=UTC).timestamp()) / 1000


def _millisecond(moment: datetime, *, up: bool) -> datetime:
    """`moment` at a whole millisecond: the next one (`up`) or the one before."""
    whole = moment.replace(microsecond=moment.microsecond // 1000 * 1000)
    return whole + timedelta(milliseconds=1) if up and whole < moment else whole


def _instant(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, tz=UTC).replace(tzinfo=None)


def _per_s(value: float | None, window_s: float) -> float | None:
    return None if value is None else value / window_s


def _metric_block(
    row: dict[str, Any], reasons: dict[str, float], window_s: float
) -> dict[str, Any]:
    """One group's histogram-sourced SLIs over one window, in the documented JSON shape."""
    out: dict[str, Any] = {}
    for stem, _ in LATENCY_HISTOGRAMS:
        out[f"{stem}_s"] = {f"p{p}": row.get(f"{stem}_p{p}_s") for p, _ in QUANTILES}
        out[f"{stem}_s"]["observations"] = row.get(f"{stem}_observations")
    for stem, _ in GAUGES:
        out[stem] = {"mean": row.get(f"{stem}_mean"), "max": row.get(f"{stem}_max")}
    # From the counters where the group has them, else the engines' own gauge.
    counted = row.get("prefix_cache_hit_ratio")
    reported = row.get("prefix_cache_hit_ratio_reported_mean")
    out["prefix_cache_hit_ratio"] = counted if counted is not None else reported
    out["prefix_cache_hit_ratio_from"] = (
        "counters" if counted is not None else "engine gauge" if reported is not None else None
    )
    out["spec_decode_acceptance_ratio"] = row.get("spec_decode_acceptance_ratio")
    for name, _ in COUNTERS:
        out[name] = row.get(name)
    out["prompt_tokens_per_s"] = _per_s(row.get("prompt_tokens"), window_s)
    out["generation_tokens_per_s"] = _per_s(row.get("generation_tokens"), window_s)
    out["finish_reasons"] = reasons
    return out


def _metric_tables(
    points: pl.LazyFrame,
    dimensions: pl.LazyFrame,
    *,
    range_s: float,
    window_ends_s: list[float],
    scope: Scope,
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(one wide row per group and window, finish reasons per group and window)."""
    args: dict[str, Any] = {"range_s": range_s, "window_ends_s": window_ends_s, "scope": scope}
    by = [*scope.columns, "window_end_s"]
    wide = (
        latency_quantiles(points, dimensions, **args)
        .join(counter_table(points, dimensions, **args), on=by, how="full", coalesce=True)
        .join(gauge_table(points, dimensions, **args), on=by, how="full", coalesce=True)
        .sort(by, nulls_last=True)
    )
    return wide, finish_reasons(points, dimensions, **args)


def _blocks(
    wide: pl.DataFrame, reasons: pl.DataFrame, *, column: str | None, window_s: float
) -> dict[tuple[Any, float], dict[str, Any]]:
    """Metric blocks keyed by (group or None, window end)."""
    by_reason: dict[tuple[Any, float], dict[str, float]] = {}
    for row in reasons.iter_rows(named=True):
        key = (row[column] if column else None, row["window_end_s"])
        by_reason.setdefault(key, {})[str(row["finished_reason"])] = row["increase"]
    return {
        (row[column] if column else None, row["window_end_s"]): _metric_block(
            row,
            by_reason.get((row[column] if column else None, row["window_end_s"]), {}),
            window_s,
        )
        for row in wide.iter_rows(named=True)
    }


def histogram_section(
    window: Window, *, by: Grouping = Grouping.REPLICA, step: timedelta | None = None
) -> dict[str, Any] | None:
    """SLIs from scraped series over [from_ts, to_ts] (default: the stored points' span), as
    PromQL evaluates them at `to` with the range `to - from`: histogram quantiles of TTFT,
    ITL, TPOT and e2e, counter increases, gauge means and maxima, GPU signals; per group and
    for the fleet, and with `step` per consecutive window (aligned to from_ts, or to the first
    point rounded down to the step). By adapter, only the fleet's rows (series name no adapter).
    None when no point was scraped in the window."""
    from_ts, to_ts, span = window.from_ts, window.to_ts, window.stored_points
    if span is None:
        return None
    # PromQL evaluates at whole milliseconds (Prometheus' timestamps), and so do the increase
    # frames: edges finer than that would key the window's rows apart from its lookups.
    # Inward, so that the window never reaches past what was read: samples are whole
    # milliseconds, so this keeps every one the edges held.
    start = _millisecond(from_ts or span.first, up=True)
    end = _millisecond(to_ts or span.last, up=False)
    if end <= start or span.last < start or span.first > end:
        return None
    # Range selectors include both edges; points_between excludes its upper bound.
    points = window.points_between(start, end + timedelta(microseconds=1))
    dimensions = window.dimensions()
    scope = by.metric_scope
    column = None if scope is Scope.FLEET else scope.value
    window_s = (end - start).total_seconds()
    # Each plan is (wide rows, finish reasons), named by (scope, whole window or steps).
    plans: dict[tuple[str, str], tuple[pl.LazyFrame, pl.LazyFrame]] = {}
    whole: dict[str, Any] = {"range_s": window_s, "window_ends_s": [_epoch_s(end)]}
    plans["fleet", "whole"] = _metric_tables(points, dimensions, scope=Scope.FLEET, **whole)
    if column:
        plans["group", "whole"] = _metric_tables(points, dimensions, scope=scope, **whole)
    ends: list[float] = []
    if step is not None:
        step_s = step.total_seconds()
        origin = _epoch_s(start) if from_ts else _epoch_s(start) // step_s * step_s
        ends = [origin + k * step_s for k in range(1, int((_epoch_s(end) - origin) // step_s) + 1)]
        if ends:
            steps: dict[str, Any] = {"range_s": step_s, "window_ends_s": ends}
            plans["fleet", "steps"] = _metric_tables(points, dimensions, scope=Scope.FLEET, **steps)
            if column:
                plans["group", "steps"] = _metric_tables(points, dimensions, scope=scope, **steps)
    frames = iter(pl.collect_all([frame for pair in plans.values() for frame in pair]))
    collected = {name: (next(frames), next(frames)) for name in plans}
    overall = _blocks(*collected["fleet", "whole"], column=None, window_s=window_s)
    empty = _metric_block({}, {}, window_s)
    section: dict[str, Any] = {
        "window": {"from": format_instant(start), "to": format_instant(end), "window_s": window_s},
        "overall": overall.get((None, _epoch_s(end)), empty),
        "groups": [],
        # GPUs (and MIG slices) that serve no replica, so their figures are in no group.
        "unmatched_gpus": unmatched_gpu_readings(points, dimensions).collect().to_dicts(),
    }
    if column:
        grouped = _blocks(*collected["group", "whole"], column=column, window_s=window_s)
        section["groups"] = [
            {column: key[0], **block}
            for key, block in sorted(grouped.items(), key=lambda item: _group_key(item[0][0]))
        ]
    if step is not None:
        step_s = step.total_seconds()
        fleet_windows: dict[tuple[Any, float], dict[str, Any]] = {}
        group_windows: dict[tuple[Any, float], dict[str, Any]] = {}
        if ends:
            fleet_windows = _blocks(*collected["fleet", "steps"], column=None, window_s=step_s)
            if column:
                group_windows = _blocks(
                    *collected["group", "steps"], column=column, window_s=step_s
                )
        section["series"] = [
            {
                "from": format_instant(_instant(end_s - step_s)),
                "to": format_instant(_instant(end_s)),
                "overall": fleet_windows.get((None, end_s), _metric_block({}, {}, step_s)),
                "groups": [
                    {column: key[0], **block}
                    for key, block in sorted(
                        group_windows.items(),
                        key=lambda item: _group_key(item[0][0]),
                    )
                    if key[1] == end_s
                ]
                if column
                else [],
            }
            for end_s in ends
        ]
    return section
