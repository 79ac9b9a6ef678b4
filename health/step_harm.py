"""SLO harm of a span of a pool's time against the span before it: what a traffic step (or the
wait for capacity after one) cost the pool's users, in requests that missed the objective.

A request is bad when it failed, or, when the inputs give goodput limits, when it missed them
(`pipeline.request_sli.with_good`). From traces, requests are counted by arrival time, so a
request belongs to the span it was sent in; the TTFT p90 is over successful requests. Without
traces the pool's counters stand in: finished requests, those that ended `abort` or `error`
or were refused by admission control as the bad ones (limit misses are not countable per
request from histograms), and the TTFT p90 from the TTFT histogram's bucket increments.

Harm is clear when the bad share during the span is at least `bad_share_ratio` times the
baseline share, exceeds it by at least one error budget (1 - objective) and is `min_z`
standard errors above it (a binomial at the baseline share); or, when no limits are given,
when the TTFT p90 is at least `ttft_ratio` times its baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from servewatch.health.finding import HealthInputs
from servewatch.pipeline.metric_sli import counter_minutes
from servewatch.pipeline.promql import histogram_quantile_frame
from servewatch.pipeline.request_sli import with_bad
from servewatch.pipeline.signals import Signal

# Quantiles from fewer successful requests are too coarse to compare.
_MIN_TTFT_SAMPLES = 20


@dataclass(frozen=True)
class SpanHarm:
    """Requests and bad requests of a span and of its baseline span, and their TTFT p90s.
    `by_limits`: bad counts goodput-limit misses (traced requests and limits given)."""

    requests: float
    bad_requests: float
    baseline_requests: float
    baseline_bad_requests: float
    ttft_p90_s: float | None
    baseline_ttft_p90_s: float | None
    by_limits: bool

    @property
    def bad_share(self) -> float:
        return self.bad_requests / self.requests if self.requests > 0 else 0.0

    @property
    def baseline_share(self) -> float:
        """The baseline's bad share with half a request added, so a clean baseline does not
        make one bad request infinitely surprising."""
        return (self.baseline_bad_requests + 0.5) / (self.baseline_requests + 1.0)

    @property
    def expected_bad_requests(self) -> float:
        return self.requests * self.baseline_share

    @property
    def excess_bad_requests(self) -> float:
        return max(0.0, self.bad_requests - self.expected_bad_requests)

    @property
    def attainment_ratio(self) -> float | None:
        return 1.0 - self.bad_share if self.requests > 0 else None

    @property
    def baseline_attainment_ratio(self) -> float | None:
        if self.baseline_requests <= 0:
            return None
        return 1.0 - self.baseline_bad_requests / self.baseline_requests

    @property
    def ttft_ratio(self) -> float | None:
        if self.ttft_p90_s is None or not self.baseline_ttft_p90_s:
            return None
        return self.ttft_p90_s / self.baseline_ttft_p90_s

    @property
    def z(self) -> float:
        """Standard errors by which the bad requests exceed the baseline share's expectation."""
        p = self.baseline_share
        spread = math.sqrt(self.requests * p * (1.0 - p))
        return (self.bad_requests - self.expected_bad_requests) / spread if spread > 0 else 0.0


@dataclass(frozen=True)
class HarmRule:
    """When harm is clear (defaults in brackets):
    - `bad_share_ratio` [1.5]: bad share over the baseline share;
    - `min_z` [4]: standard errors above the baseline share (chance gives 4 about once in
      30,000 spans; bad requests come in clumps, so a stricter bar than 3);
    - the bad share's excess must also reach one error budget, 1 - `objective_ratio`;
    - `ttft_ratio` [1.5]: TTFT p90 over its baseline, used when no limits are given (a p90
      of one pool-minute moves by a fifth on its own; with no objective to price it
      against, only a large rise is plainly harm).
    """

    bad_share_ratio: float = 1.5
    min_z: float = 4.0
    ttft_ratio: float = 1.5

    def clarity(self, harm: SpanHarm, *, objective_ratio: float, limits_given: bool) -> float:
        """0 when the harm is not clear; else in (0, 1]: how far beyond the bar it is (twice
        the bar's margin counts fully)."""
        budget = max(1.0 - objective_ratio, 1e-6)
        excess_share = harm.bad_share - harm.baseline_share
        clear = (
            harm.requests > 0
            and harm.bad_share >= self.bad_share_ratio * harm.baseline_share
            and excess_share >= budget
            and harm.z >= self.min_z
        )
        by_share = (
            min(1.0, excess_share / (2.0 * budget), harm.z / (2.0 * self.min_z)) if clear else 0.0
        )
        if limits_given:
            return by_share
        ratio = harm.ttft_ratio
        by_ttft = 0.0
        if ratio is not None and ratio >= self.ttft_ratio:
            by_ttft = min(1.0, (ratio - 1.0) / (2.0 * (self.ttft_ratio - 1.0)))
        return max(by_share, by_ttft)


def traced_requests(inputs: HealthInputs, pools: pl.LazyFrame) -> pl.DataFrame:
    """Traced requests with pool (the replica's, else the span's), arrival_ts, ok, bad and
    ttft_s; empty when nothing is traced."""
    return (
        inputs.requests.pipe(with_bad, limits=inputs.limits)
        .join(pools.rename({"pool": "replica_pool"}), on="replica", how="left")
        .select(
            pool=pl.coalesce("replica_pool", "pool").fill_null(""),
            arrival_ts=pl.col("arrival_ts"),
            ok=pl.col("ok").fill_null(value=False),
            bad="bad",
            ttft_s=pl.col("ttft_s"),
        )
        .collect()
    )


def pool_ttft_buckets(inputs: HealthInputs, pools: pl.LazyFrame) -> pl.DataFrame:
    """The TTFT histogram's bucket increments per pool, minute and bound: what an untraced
    span's TTFT p90 is read from."""
    buckets = inputs.dimensions.filter(
        (pl.col("signal") == Signal.TTFT_S.value)
        & pl.col("le").is_not_null()
        & pl.col("replica").is_not_null()
    ).select("series_id", "replica", "le")
    return (
        counter_minutes(inputs.points, buckets, by=["replica", "le"], name="delta")
        .join(pools, on="replica", how="left")
        .group_by("pool", "minute_ts", "le")
        .agg(pl.col("delta").sum())
        .collect()
    )


@dataclass(frozen=True)
class HarmSource:
    """What harm is measured from: traced requests when there are any, else the pool-minute
    counters (`completions`, `shed`) and TTFT bucket increments."""

    requests: pl.DataFrame
    ttft_buckets: pl.DataFrame
    limits_given: bool

    @property
    def traced(self) -> bool:
        return not self.requests.is_empty()

    def measure(
        self,
        pool: str,
        minutes: pl.DataFrame,
        *,
        span: tuple[datetime, datetime],
        baseline: tuple[datetime, datetime],
    ) -> SpanHarm:
        """`minutes`: the pool's minute frame (minute_ts, completions, shed); spans [from, to)."""
        if self.traced:
            during = self._traced(pool, span)
            before = self._traced(pool, baseline)
            return SpanHarm(
                requests=during[0],
                bad_requests=during[1],
                baseline_requests=before[0],
                baseline_bad_requests=before[1],
                ttft_p90_s=during[2],
                baseline_ttft_p90_s=before[2],
                by_limits=self.limits_given,
            )
        counted = self._counted(minutes, span)
        counted_before = self._counted(minutes, baseline)
        return SpanHarm(
            requests=counted[0],
            bad_requests=counted[1],
            baseline_requests=counted_before[0],
            baseline_bad_requests=counted_before[1],
            ttft_p90_s=self._bucket_p90(pool, span),
            baseline_ttft_p90_s=self._bucket_p90(pool, baseline),
            by_limits=False,
        )

    def _traced(
        self, pool: str, span: tuple[datetime, datetime]
    ) -> tuple[float, float, float | None]:
        chosen = self.requests.filter(
            (pl.col("pool") == pool) & pl.col("arrival_ts").is_between(*span, closed="left")
        )
        ttft = chosen.filter(pl.col("ok"))["ttft_s"].drop_nulls()
        p90 = (
            ttft.quantile(0.9, interpolation="linear") if ttft.len() >= _MIN_TTFT_SAMPLES else None
        )
        return float(chosen.height), float(chosen["bad"].sum()), p90

    @staticmethod
    def _counted(minutes: pl.DataFrame, span: tuple[datetime, datetime]) -> tuple[float, float]:
        chosen = minutes.filter(pl.col("minute_ts").is_between(*span, closed="left"))
        return float(chosen["completions"].sum()), float(chosen["shed"].sum())

    def _bucket_p90(self, pool: str, span: tuple[datetime, datetime]) -> float | None:
        summed = (
            self.ttft_buckets.filter(
                (pl.col("pool") == pool) & pl.col("minute_ts").is_between(*span, closed="left")
            )
            .group_by("le")
            .agg(pl.col("delta").sum())
        )
        # The +Inf bucket's count is the largest: the span's observations.
        observed = summed["delta"].max()
        if observed is None or float(observed) < _MIN_TTFT_SAMPLES:  # type: ignore[arg-type]
            return None
        quantile = histogram_quantile_frame(
            summed.lazy(), q=0.9, by=[], count_column="delta"
        ).collect()["quantile"]
        if quantile.is_empty() or not math.isfinite(quantile[0]):
            return None
        return float(quantile[0])
