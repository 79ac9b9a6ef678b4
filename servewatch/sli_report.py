"""The SLI report: request SLIs per group (replica, pool, model) and for the fleet, as one
JSON-ready document, optionally with a series of consecutive windows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import polars as pl

from pipeline.cross_check import cross_check
from pipeline.metric_sli import Scope, histogram_quantiles, series_dimensions
from pipeline.request_sli import LATENCY_SLIS, PERCENTILES, GoodputLimits, request_slis
from pipeline.signals import Signal
from pipeline.store import Store
from servewatch.instants import format_instant

COUNT_FIELDS = (
    "requests",
    "failed_requests",
    "good_requests",
    "attainment_ratio",
    "goodput_rps",
    "throughput_rps",
    "prompt_tokens",
    "completion_tokens",
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
    FLEET = "fleet"


def _groups(frame: pl.DataFrame, column: str | None) -> list[dict[str, Any]]:
    if column is None:
        return []
    return [{column: row[column], **_row_to_json(row)} for row in frame.iter_rows(named=True)]


def build_sli_report(
    store: Store,
    *,
    limits: GoodputLimits,
    from_ts: datetime | None = None,
    to_ts: datetime | None = None,
    by: Grouping = Grouping.REPLICA,
    step: timedelta | None = None,
) -> dict[str, Any]:
    """SLIs of requests that finished in [from_ts, to_ts), per group and for the fleet.

    The window length for rates is to_ts - from_ts when both are given, else the span from
    the first arrival to the last completion of the selected requests. With `step`, the report
    also holds a series of consecutive windows of that length (aligned to from_ts, or to the
    first completion rounded down to the step), each with its own overall and group rows.
    """
    window_s = (to_ts - from_ts).total_seconds() if from_ts and to_ts else None
    requests = store.read_requests(from_ts=from_ts, to_ts=to_ts)
    group = None if by is Grouping.FLEET else by.value
    plans = [
        request_slis(requests, limits=limits, window_s=window_s),
        request_slis(requests, limits=limits, window_s=window_s, by=[group] if group else []),
    ]
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
        per_window = [
            request_slis(
                stepped, limits=limits, window_s=step.total_seconds(), by=["window_start"]
            ),
            request_slis(
                stepped,
                limits=limits,
                window_s=step.total_seconds(),
                by=["window_start", group] if group else ["window_start"],
            ),
        ]
        plans.extend(per_window)
    # All summaries share one scan of the requests; collect_all runs them together.
    collected = pl.collect_all(plans)
    overall, grouped = collected[0], collected[1]
    overall_row = overall.row(0, named=True)
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
        "groups": _groups(grouped, group),
    }
    if step is not None:
        window_rows, window_groups = collected[2], collected[3]
        report["cross_check"] = _cross_check(store, window_rows, step=step)
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
    store: Store, window_rows: pl.DataFrame, *, step: timedelta
) -> list[dict[str, Any]]:
    """TTFT p95 per window from traces against the same from vLLM's histogram, when scraped."""
    if store.points_range() is None or window_rows.height == 0:
        return []
    dimensions = series_dimensions(store.read_series(), store.read_targets())
    bounds = (
        dimensions.filter(pl.col("signal") == Signal.TTFT_S.value)
        .select(pl.col("le").drop_nulls().unique())
        .collect()
        .to_series()
        .to_list()
    )
    starts = window_rows["window_start"].to_list()
    ends_s = [(start + step).replace(tzinfo=UTC).timestamp() for start in starts]
    points = store.read_points(from_ts=min(starts) - step, to_ts=max(starts) + 2 * step)
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
