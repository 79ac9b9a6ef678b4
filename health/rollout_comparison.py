"""Rollout comparison: each version of a pool against the rest of that pool, minute by minute,
with a bootstrap interval on the difference, so a canary can be judged.

A version is the value of `HealthInputs.version_label` (default `model`). It is read where the
process reports it, since a rolled-out replica is the same target running a new version: the
traced request's column when requests are traced, else the series' own label (`model_name` for
`model`), falling back to the target's column. Only minutes in which both the version and the
rest of its pool served requests are compared, so a load change over the day moves both sides
alike and cannot pass for a regression.

Per minute and side: mean TTFT and mean TPOT of successful requests, error ratio, and goodput
per replica (successful requests per second and replica). From traces when there are any,
else from the histograms' `_sum`/`_count` and `request_success_total` increments, which give
the exact per-minute means (quantiles of coarse buckets would blur a small shift). The interval
is a moving-block bootstrap over the paired minutes (blocks keep the minute-to-minute
correlation that an i.i.d. resample would ignore and so overstate certainty).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

import polars as pl

from servewatch.health.finding import (
    Evidence,
    Finding,
    FindingKind,
    HealthInputs,
    ScopeUnit,
)
from servewatch.pipeline.metric_sli import DIMENSIONS, counter_deltas
from servewatch.pipeline.signals import Signal

FAILED_REASONS = ("error", "abort")
NO_POOL = "(no pool)"
CELL_COLUMNS = (
    "pool",
    "version",
    "minute_ts",
    "replicas",
    "requests",
    "failed",
    "ttft_sum_s",
    "ttft_n",
    "tpot_sum_s",
    "tpot_n",
)
_COUNTS = ("requests", "failed", "ttft_sum_s", "ttft_n", "tpot_sum_s", "tpot_n")


class VersionLabelError(ValueError):
    """The version label names nothing the data carries."""


class Metric(Enum):
    """What is compared, its unit, and whether a higher value is worse."""

    TTFT = ("ttft_s", "s", True)
    TPOT = ("tpot_s", "s", True)
    ERROR_RATIO = ("error_ratio", "ratio", True)
    GOODPUT = ("goodput_rps_per_replica", "requests_per_s", False)

    def __init__(self, column: str, unit: str, higher_is_worse: bool) -> None:
        self.column = column
        self.unit = unit
        self.higher_is_worse = higher_is_worse


@dataclass(frozen=True)
class MetricComparison:
    """One metric of one version against the rest of its pool over the paired minutes.
    `diff_*` are version minus rest; `worse_share` is the share of bootstrap resamples in
    which the version came out worse."""

    metric: Metric
    version_mean: float
    rest_mean: float
    diff_low: float
    diff_high: float
    worse_share: float


def version_column_of_requests(requests: pl.LazyFrame, *, version_label: str) -> pl.LazyFrame:
    """Requests with a `version` column: the label's own column, which traced requests carry
    for `model`, `replica`, `host`, `zone`, `pool`, `tenant` and `adapter`."""
    if version_label not in requests.collect_schema().names():
        raise VersionLabelError(
            f"version label {version_label!r} is not a column of traced requests; "
            f"allowed: {sorted(DIMENSIONS)}, tenant or adapter"
        )
    return requests.with_columns(version=pl.col(version_label).cast(pl.String))


def request_cells(requests: pl.LazyFrame) -> pl.LazyFrame:
    """Per pool, version and minute (of completion): the sums the comparison needs."""
    ok = pl.col("ok")
    tpot = pl.col("decode_s") / (pl.col("completion_tokens") - 1)
    has_tpot = ok & (pl.col("completion_tokens") > 1) & pl.col("decode_s").is_not_null()
    has_ttft = ok & pl.col("ttft_s").is_not_null()
    return (
        requests.with_columns(
            minute_ts=pl.col("end_ts").dt.truncate("1m"), pool=pl.col("pool").fill_null(NO_POOL)
        )
        .group_by("pool", "version", "minute_ts")
        .agg(
            replicas=pl.col("replica").n_unique(),
            requests=pl.len().cast(pl.Float64),
            failed=(~ok).sum().cast(pl.Float64),
            ttft_sum_s=pl.col("ttft_s").filter(has_ttft).sum(),
            ttft_n=has_ttft.sum().cast(pl.Float64),
            tpot_sum_s=tpot.filter(has_tpot).sum(),
            tpot_n=has_tpot.sum().cast(pl.Float64),
        )
        .select(CELL_COLUMNS)
    )


def series_versions(dimensions: pl.LazyFrame, *, version_label: str) -> pl.LazyFrame:
    """Series dimensions with a `version` column: the series' own label first (`model_name`
    for `model`), else the target's column of that name."""
    key = "model_name" if version_label == "model" else version_label
    from_labels = pl.col("labels").str.json_path_match(f"$.{key}")
    version = (
        pl.coalesce(from_labels, pl.col(version_label))
        if version_label in DIMENSIONS
        else from_labels
    )
    return dimensions.with_columns(version=version)


def series_cells(points: pl.LazyFrame, dimensions: pl.LazyFrame) -> pl.LazyFrame:
    """The same sums as `request_cells`, from scraped counters and histogram sums and counts;
    `dimensions` must carry `version` (see `series_versions`)."""
    by = ("pool", "version", "replica")

    def part(signal: Signal, suffix: str | None, name: str) -> pl.LazyFrame:
        chosen = dimensions.filter(pl.col("signal") == signal.value)
        chosen = (
            chosen.filter(pl.col("metric").str.ends_with(suffix))
            if suffix is not None
            else chosen.filter(pl.col("le").is_null())
        )
        failed = pl.col("finished_reason").is_in(FAILED_REASONS)
        return (
            counter_deltas(points, chosen.select("series_id", *by, "finished_reason"))
            .group_by("minute_ts", *by)
            .agg(
                pl.col("delta").sum().alias(name),
                pl.col("delta").filter(failed).sum().alias(f"{name}_failed"),
            )
        )

    keys = ["minute_ts", *by]
    parts = [
        part(Signal.REQUESTS_FINISHED, None, "requests"),
        part(Signal.TTFT_S, "_sum", "ttft_sum_s"),
        part(Signal.TTFT_S, "_count", "ttft_n"),
        part(Signal.REQUEST_TPOT_S, "_sum", "tpot_sum_s"),
        part(Signal.REQUEST_TPOT_S, "_count", "tpot_n"),
    ]
    joined = parts[0]
    for other in parts[1:]:
        joined = joined.join(other, on=keys, how="full", coalesce=True)
    return (
        joined.rename({"requests_failed": "failed"})
        .with_columns(pl.col("pool").fill_null(NO_POOL))
        .filter(pl.col("version").is_not_null())
        .group_by("pool", "version", "minute_ts")
        .agg(
            pl.col("replica").filter(pl.col("requests") > 0).n_unique().alias("replicas"),
            *[pl.col(c).fill_null(0.0).sum().cast(pl.Float64) for c in _COUNTS],
        )
        .select(CELL_COLUMNS)
    )


def paired_minutes(cells: pl.LazyFrame, *, min_requests: int) -> pl.LazyFrame:
    """Per pool, version and minute: that version's values and the rest of its pool's, for
    minutes in which both sides finished at least `min_requests` requests."""
    totals = cells.group_by("pool", "minute_ts").agg(
        pl.col(c).sum().alias(f"pool_{c}") for c in ("replicas", *_COUNTS)
    )
    rest = {c: pl.col(f"pool_{c}") - pl.col(c) for c in ("replicas", *_COUNTS)}

    def values(side: str, col: dict[str, pl.Expr]) -> list[pl.Expr]:
        ok = col["requests"] - col["failed"]
        return [
            pl.when(col["ttft_n"] > 0)
            .then(col["ttft_sum_s"] / col["ttft_n"])
            .alias(f"{side}_ttft_s"),
            pl.when(col["tpot_n"] > 0)
            .then(col["tpot_sum_s"] / col["tpot_n"])
            .alias(f"{side}_tpot_s"),
            (col["failed"] / col["requests"]).alias(f"{side}_error_ratio"),
            (ok / 60.0 / col["replicas"].clip(lower_bound=1)).alias(
                f"{side}_goodput_rps_per_replica"
            ),
        ]

    own = {c: pl.col(c) for c in ("replicas", *_COUNTS)}
    return (
        cells.join(totals, on=["pool", "minute_ts"], how="inner")
        .filter((own["requests"] >= min_requests) & (rest["requests"] >= min_requests))
        .select("pool", "version", "minute_ts", *values("version", own), *values("rest", rest))
        .sort("pool", "version", "minute_ts")
    )


def block_bootstrap_means(
    values: Sequence[float], *, resamples: int, block: int, seed: int
) -> list[float]:
    """Means of `resamples` moving-block resamples of `values` (blocks of `block` in a row,
    wrapping around the end), each as long as `values`."""
    n = len(values)
    if n == 0:
        raise ValueError("block bootstrap of no values")
    size = max(1, min(block, n))
    rng = random.Random(seed)  # noqa: S311 (a seeded resample, not a secret)
    means = []
    for _ in range(resamples):
        total = 0.0
        taken = 0
        while taken < n:
            start = rng.randrange(n)
            for k in range(min(size, n - taken)):
                total += values[(start + k) % n]
            taken += size
        means.append(total / n)
    return means


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    position = q * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def compare_metric(
    pairs: pl.DataFrame, metric: Metric, *, resamples: int, block: int, seed: int, level: float
) -> MetricComparison | None:
    """The comparison of one metric over the paired minutes of one version (None when no
    minute has the metric on both sides)."""
    both = pairs.select(
        v=pl.col(f"version_{metric.column}"), r=pl.col(f"rest_{metric.column}")
    ).drop_nulls()
    if both.is_empty():
        return None
    version_values, rest_values = both["v"].to_list(), both["r"].to_list()
    diffs = [v - r for v, r in zip(version_values, rest_values, strict=True)]
    means = sorted(block_bootstrap_means(diffs, resamples=resamples, block=block, seed=seed))
    tail = (1.0 - level) / 2.0
    worse = sum(1 for m in means if (m > 0 if metric.higher_is_worse else m < 0))
    return MetricComparison(
        metric=metric,
        version_mean=sum(version_values) / len(version_values),
        rest_mean=sum(rest_values) / len(rest_values),
        diff_low=_quantile(means, tail),
        diff_high=_quantile(means, 1.0 - tail),
        worse_share=worse / len(means),
    )


@dataclass(frozen=True)
class RolloutComparison:
    """The detector: a version is a regression when some metric is worse than the rest of
    its pool with the interval excluding zero, by at least `min_relative_effect` of the rest's
    value (latency, goodput) or `min_error_ratio_increase` (error ratio)."""

    kind = FindingKind.ROLLOUT_REGRESSION  # a class attribute, not a field: it never varies
    min_paired_minutes: int = 10
    min_requests_per_minute: int = 5
    min_relative_effect: float = 0.2
    min_error_ratio_increase: float = 0.02
    level: float = 0.95
    resamples: int = 1000
    block_minutes: int = 5
    seed: int = 0
    ongoing_within_s: float = 180.0

    def cells(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per pool, version and minute sums: from traces when any, else from series."""
        start, end = inputs.start, inputs.end
        requests = inputs.requests.filter(
            (pl.col("end_ts") >= start) & (pl.col("end_ts") < end)
        ).collect()
        if requests.height:
            return request_cells(
                version_column_of_requests(requests.lazy(), version_label=inputs.version_label)
            )
        dimensions = series_versions(inputs.dimensions, version_label=inputs.version_label)
        points = inputs.points.filter(
            (pl.col("ts") >= start - timedelta(minutes=1)) & (pl.col("ts") < end)
        )
        return series_cells(points, dimensions).filter(
            (pl.col("minute_ts") >= start) & (pl.col("minute_ts") < end)
        )

    def detect(self, inputs: HealthInputs) -> list[Finding]:
        cells = self.cells(inputs).collect()
        versions = cells.group_by("pool").agg(pl.col("version").n_unique().alias("n"))
        compared = versions.filter(pl.col("n") > 1)["pool"].to_list()
        if not compared:
            return []
        cells = cells.filter(pl.col("pool").is_in(compared))
        pairs = paired_minutes(cells.lazy(), min_requests=self.min_requests_per_minute).collect()
        findings = []
        for (pool, version), group in pairs.group_by("pool", "version", maintain_order=True):
            own = cells.filter((pl.col("pool") == pool) & (pl.col("version") == version))
            finding = self._judge(str(pool), str(version), group, own, window_end=inputs.end)
            if finding is not None:
                findings.append(finding)
        return findings

    def _regressed(self, c: MetricComparison) -> bool:
        if c.metric.higher_is_worse:
            if c.diff_low <= 0:
                return False
        elif c.diff_high >= 0:
            return False
        effect = abs(c.version_mean - c.rest_mean)
        if c.metric is Metric.ERROR_RATIO:
            return effect >= self.min_error_ratio_increase
        return c.rest_mean > 0 and effect / c.rest_mean >= self.min_relative_effect

    def _judge(
        self,
        pool: str,
        version: str,
        pairs: pl.DataFrame,
        own: pl.DataFrame,
        *,
        window_end: datetime,
    ) -> Finding | None:
        if pairs.height < self.min_paired_minutes:
            return None
        comparisons = [
            c
            for metric in Metric
            if (
                c := compare_metric(
                    pairs,
                    metric,
                    resamples=self.resamples,
                    block=self.block_minutes,
                    seed=self.seed,
                    level=self.level,
                )
            )
            is not None
        ]
        worse = [c for c in comparisons if self._regressed(c)]
        if not worse:
            return None
        first, last = own["minute_ts"].min(), own["minute_ts"].max()
        assert isinstance(first, datetime)
        assert isinstance(last, datetime)
        last_end = last + timedelta(minutes=1)
        ongoing = (window_end - last_end).total_seconds() <= self.ongoing_within_s
        replicas = own["replicas"].max()
        assert isinstance(replicas, int)
        evidence = [
            Evidence("paired_minutes", float(pairs.height), "count"),
            Evidence("replicas", float(replicas), "count"),
        ]
        for c in comparisons:
            name, unit = c.metric.column, c.metric.unit
            evidence += [
                Evidence(name, c.version_mean, unit, baseline=c.rest_mean),
                Evidence(f"{name}_diff_ci_low", c.diff_low, unit),
                Evidence(f"{name}_diff_ci_high", c.diff_high, unit),
            ]
        described = ", ".join(_describe(c) for c in worse)
        return Finding(
            kind=self.kind,
            scope_unit=ScopeUnit.VERSION,
            scope=version,
            start=first,
            end=None if ongoing else last_end,
            confidence=max(c.worse_share for c in worse),
            summary=(
                f"version {version} in pool {pool} is worse than the rest of its pool over "
                f"{pairs.height} paired minutes: {described} "
                f"({self.level:.0%} interval of the difference excludes zero)"
            ),
            evidence=tuple(evidence),
            suggestion=(
                f"halt the rollout of {version} and roll its replicas back; compare again "
                "once fixed"
            ),
        )


def _describe(c: MetricComparison) -> str:
    name = c.metric.column
    if c.metric is Metric.ERROR_RATIO:
        return (
            f"{name} {c.version_mean:.2%} vs {c.rest_mean:.2%} "
            f"(+{c.diff_low:.2%} to +{c.diff_high:.2%})"
        )
    change = c.version_mean / c.rest_mean - 1.0 if c.rest_mean else float("inf")
    return (
        f"{name} {c.version_mean:.4g} vs {c.rest_mean:.4g} {c.metric.unit} ({change:+.0%}, "
        f"difference {c.diff_low:+.3g} to {c.diff_high:+.3g})"
    )
