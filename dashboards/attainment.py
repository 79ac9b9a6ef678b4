"""Attainment, goodput and token goodput over time, from the event counts of each SLO.

Input is `slo_minutes` as the pipeline writes it (good and total requests per SLO, replica and
minute, and the output tokens of both). Counts add, so a bucket's attainment is its good / its
total and its goodput is its good / its length: exact at any bucket width, never a mean of
ratios. Goodput here is the rate of good requests in a window (vLLM's `--goodput`), not the
capacity at the SLO; token goodput the rate of the output tokens of those requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import altair as alt
import polars as pl

from servewatch.dashboards.columns import MINUTE_TS, REPLICA, Column, ColumnKind, FrameContract
from servewatch.dashboards.downsampling import MAX_POINTS_PER_SERIES, bucket_start, buckets_for
from servewatch.dashboards.panel import (
    HEIGHT_PX,
    RATIO_FIGURES,
    WIDTH_PX,
    TimeDomain,
    compact,
    data_chart,
    epoch_ms,
    natural_order,
    series_lines,
    titled,
)

OBJECTIVE_COLOR = "#c0392b"

SLO_EVENTS_CONTRACT = FrameContract(
    "attainment and goodput charts",
    (
        MINUTE_TS,
        Column("slo", ColumnKind.TEXT, "SLO name"),
        Column("good", ColumnKind.NUMBER, "good requests in the minute"),
        Column("total", ColumnKind.NUMBER, "all requests in the minute"),
    ),
    optional=(REPLICA,),
)


TOKEN_EVENTS_CONTRACT = FrameContract(
    "token goodput chart",
    (
        MINUTE_TS,
        Column("slo", ColumnKind.TEXT, "SLO name"),
        Column("good_output_tokens", ColumnKind.NUMBER, "output tokens of the good requests"),
        Column("output_tokens", ColumnKind.NUMBER, "output tokens of all requests"),
    ),
    optional=(REPLICA,),
)


def has_token_counts(frame: pl.DataFrame | pl.LazyFrame) -> bool:
    """Whether `slo_minutes` rows carry output token counts (trace-counted rows do)."""
    schema = frame.lazy().collect_schema()
    if "good_output_tokens" not in schema or "output_tokens" not in schema:
        return False
    counted = frame.lazy().select(pl.col("output_tokens").is_not_null().any()).collect()
    return bool(counted.item())


def _bucketed(rows: pl.DataFrame, *, width_s: int, bucket: pl.Expr) -> pl.DataFrame:
    return (
        rows.group_by(bucket.alias("bucket"), "slo")
        .agg(pl.col("good").sum(), pl.col("total").sum())
        .with_columns(
            attainment_ratio=pl.when(pl.col("total") > 0)
            .then(pl.col("good") / pl.col("total"))
            .otherwise(None),
            good_per_s=pl.col("good") / width_s,
            all_per_s=pl.col("total") / width_s,
        )
        .sort("bucket", "slo")
    )


def attainment_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    objectives: Mapping[str, float] | None = None,
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    """Share of requests meeting each SLO, with each SLO's objective as a dashed line."""
    rows = SLO_EVENTS_CONTRACT.select(frame)
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    bucketed = _bucketed(rows, width_s=buckets.width_s, bucket=bucket_start("minute_ts", buckets))
    data = compact(
        bucketed.drop_nulls("attainment_ratio").select(
            epoch_ms("bucket").alias("ts"), "slo", "attainment_ratio", "good", "total"
        ),
        figures=RATIO_FIGURES,
    )
    slos = natural_order(data["slo"].to_list())
    lines = series_lines(
        data,
        y="attainment_ratio",
        y_title="attainment (% of requests good)",
        color="slo",
        color_title="SLO",
        domain=domain,
        order=slos,
        value_format=".2%",
        points=buckets.minutes <= 30,
    ).encode(
        alt.Y(
            "attainment_ratio:Q",
            title="attainment (% of requests good)",
            scale=alt.Scale(zero=False),
            axis=alt.Axis(format="%"),
        )
    )
    layers = [lines]
    subtitle = [
        f"Good requests / all requests per SLO and {buckets.label}, summed over replicas.",
    ]
    if objectives:
        targets = pl.DataFrame(
            {"slo": list(objectives), "objective_ratio": list(objectives.values())}
        ).filter(pl.col("slo").is_in(slos))
        layers.append(
            data_chart(targets)
            .mark_rule(color=OBJECTIVE_COLOR, strokeDash=[6, 4])
            .encode(
                y="objective_ratio:Q",
                tooltip=[
                    alt.Tooltip("slo:N", title="SLO"),
                    alt.Tooltip("objective_ratio:Q", title="objective", format=".2%"),
                ],
            )
        )
        subtitle.append(
            "Dashed: objective ("
            + ", ".join(f"{slo} {objectives[slo]:.2%}" for slo in slos if slo in objectives)
            + ")."
        )
    subtitle.append(buckets.note_with("good over total summed in it (exact)"))
    chart = alt.layer(*layers).properties(width=WIDTH_PX, height=HEIGHT_PX)
    return titled(chart, title="SLO attainment", subtitle=[s for s in subtitle if s])


def goodput_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    """Good requests per second for each SLO, against all requests per second."""
    return _good_against_all(
        SLO_EVENTS_CONTRACT.select(frame),
        domain=domain,
        max_points=max_points,
        unit=_GoodputUnit(
            title="Goodput",
            everything="all requests",
            y_title="requests per second (req/s)",
            color_title="requests",
            lead="Goodput: requests meeting each SLO per second, per {label}, against all "
            "requests per second (fleet).",
            note="requests in it / its length (exact)",
        ),
    )


def token_goodput_chart(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    domain: TimeDomain | None = None,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> Any:
    """Output tokens per second of the requests meeting each SLO, against all output tokens
    per second: goodput weighted by what each request generated."""
    rows = (
        TOKEN_EVENTS_CONTRACT.select(frame)
        .drop_nulls("output_tokens")
        .with_columns(good=pl.col("good_output_tokens").fill_null(0), total=pl.col("output_tokens"))
    )
    return _good_against_all(
        rows,
        domain=domain,
        max_points=max_points,
        unit=_GoodputUnit(
            title="Token goodput",
            everything="all output tokens",
            y_title="output tokens per second (tok/s)",
            color_title="output tokens",
            lead="Token goodput: output tokens of the requests meeting each SLO per second, per "
            "{label}, against all output tokens per second, failed requests' included (fleet).",
            note="tokens in it / its length (exact)",
        ),
    )


@dataclass(frozen=True)
class _GoodputUnit:
    """What a goodput chart counts: requests or output tokens, and the words for them."""

    title: str
    everything: str  # the series of all events
    y_title: str
    color_title: str
    lead: str  # the subtitle's first line; `{label}` is the bucket's
    note: str  # how a bucket's rate is computed


def _good_against_all(
    rows: pl.DataFrame,
    *,
    domain: TimeDomain | None,
    max_points: int,
    unit: _GoodputUnit,
) -> Any:
    """Good events per second for each SLO, against all events per second (`good`, `total`
    per minute, SLO)."""
    buckets = buckets_for(rows, domain=domain, max_points=max_points)
    bucketed = _bucketed(rows, width_s=buckets.width_s, bucket=bucket_start("minute_ts", buckets))
    good = bucketed.select("bucket", series=pl.format("good: {}", "slo"), rate=pl.col("good_per_s"))
    # Every SLO counts the same events unless scoped; the largest total is all of them.
    everything = bucketed.group_by("bucket").agg(
        series=pl.lit(unit.everything), rate=pl.col("all_per_s").max()
    )
    data = compact(
        pl.concat([good, everything.select(good.columns)])
        .select(epoch_ms("bucket").alias("ts"), "series", "rate")
        .sort("ts", "series")
    )
    order = [
        unit.everything,
        *natural_order([s for s in data["series"].to_list() if s != unit.everything]),
    ]
    lines = series_lines(
        data,
        y="rate",
        y_title=unit.y_title,
        color="series",
        color_title=unit.color_title,
        domain=domain,
        order=order,
        value_format=".3g",
        points=buckets.minutes <= 30,
    )
    subtitle = [unit.lead.format(label=buckets.label), buckets.note_with(unit.note)]
    chart = lines.properties(width=WIDTH_PX, height=HEIGHT_PX)
    return titled(chart, title=unit.title, subtitle=[s for s in subtitle if s])
