"""Attainment fit: one replica's capacity at the SLO, as the load where SLO attainment crosses
its target.

Capacity at the SLO is the largest request rate at which at least `target_ratio` of requests meet
both the TTFT and the TPOT limit (DistServe's sense, REFERENCE section 3; the emulator's ground
truth measures the same). From traced requests: per minute of arrival, how many requests arrived
and how many of those met both limits (a failed request never does; a one-token answer meets the
TPOT limit). The load of a minute is its arrivals per serving replica in req/s: per replica, or
per pool with the pool's arrivals divided by the replicas that received any.

Attainment stays near 1 and then falls off a cliff, which no line follows, so no shape is
assumed: a decreasing isotonic regression of attainment on load (pool adjacent violators,
weighted by requests), and the knee is where the fitted steps cross the target, interpolated
between the mean loads of the step above and the step below. A bootstrap over minutes (a seed
injected, so a recommendation is reproducible) gives the interval.

Minutes that cannot be complete are left out: a request is recorded when it finishes, so the
arrivals of the last minutes before the data ends (the p99 end-to-end latency) are undercounted,
the slow ones most; the first minute may be partial.

When the fitted attainment never falls below the target, the knee lies beyond the highest load
observed: `knee_load` is then unbounded, and only a latency model (latency_model.py) can say
where it might be, as an extrapolation.
"""

from __future__ import annotations

import itertools
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from servewatch.capacity.bootstrap import outward_interval
from servewatch.capacity.capacity_fit import LoadUnit
from servewatch.capacity.figure import fmt
from servewatch.pipeline.request_sli import with_tpot

MINUTE = "1m"
MINUTE_S = 60.0
COMPLETE_TAIL_QUANTILE = 0.99


@dataclass(frozen=True)
class AttainmentSpec:
    """The SLO a request is judged by, and the bootstrap's settings."""

    ttft_limit_s: float | None
    tpot_limit_s: float | None
    target_ratio: float
    seed: int
    confidence_ratio: float = 0.9
    resamples: int = 400

    def __post_init__(self) -> None:
        if self.ttft_limit_s is None and self.tpot_limit_s is None:
            raise ValueError("an attainment fit needs a TTFT or a TPOT limit; got neither")
        for name in ("ttft_limit_s", "tpot_limit_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} is {value!r}; allowed: > 0 seconds")
        if not 0 < self.target_ratio < 1:
            raise ValueError(
                f"target_ratio is {self.target_ratio!r}; allowed: strictly between 0 and 1"
            )
        if not 0 < self.confidence_ratio < 1:
            raise ValueError(
                f"confidence is {self.confidence_ratio!r}; allowed: strictly between 0 and 1"
            )
        if self.resamples < 10:
            raise ValueError(f"resamples is {self.resamples}; allowed: 10 or more")

    def slo_text(self) -> str:
        limits = []
        if self.ttft_limit_s is not None:
            limits.append(f"TTFT <= {self.ttft_limit_s:g} s")
        if self.tpot_limit_s is not None:
            limits.append(f"TPOT <= {self.tpot_limit_s:g} s")
        return f"{self.target_ratio:.0%} of requests meeting {' and '.join(limits)}"


@dataclass(frozen=True)
class LoadPoint:
    """One minute of one group: its load and how many of its requests met the SLO."""

    load_rps: float
    good: int
    requests: int


@dataclass(frozen=True)
class AttainmentFit:
    """The knee of attainment against load for one group (a pool, a replica), and its data."""

    group: str
    spec: AttainmentSpec
    knee_load: float
    knee_low_load: float
    knee_high_load: float
    points: int
    replicas: int
    requests: int
    load_min: float
    load_max: float
    attainment_ratio: float
    completion_tokens_per_request: float
    prompt_tokens_per_request: float
    data: str

    @property
    def load_unit(self) -> LoadUnit:
        return LoadUnit.REQ_PER_S

    @property
    def confidence_ratio(self) -> float:
        return self.spec.confidence_ratio

    @property
    def observed(self) -> bool:
        """Whether the fitted attainment crossed the target within the observed load."""
        return math.isfinite(self.knee_load) and self.knee_load <= self.load_max

    @property
    def extrapolated(self) -> bool:
        return not self.observed

    @property
    def extrapolation_ratio(self) -> float:
        return self.knee_load / self.load_max if self.load_max > 0 else math.inf

    def summary(self) -> str:
        head = (
            f"{self.group}: attainment ({self.spec.slo_text()}) against load per replica, "
            f"{self.points} minutes of {self.replicas} replicas ({self.data}), load "
            f"{fmt(self.load_min)} to {fmt(self.load_max)} req/s"
        )
        if not self.observed:
            return (
                f"{head}; attainment never fell below {self.spec.target_ratio:.0%} "
                f"({self.attainment_ratio:.1%} overall), so the knee lies beyond the highest "
                "observed load"
            )
        return (
            f"{head}; crosses {self.spec.target_ratio:.0%} at {fmt(self.knee_load)} req/s "
            f"({self.confidence_ratio:.0%} interval {fmt(self.knee_low_load)} to "
            f"{fmt(self.knee_high_load)}), within the observed load"
        )


def request_outcomes(requests: pl.LazyFrame, *, spec: AttainmentSpec) -> pl.LazyFrame:
    """Add `good` (met every stated limit) and `minute_ts` (the minute it arrived in)."""
    good = pl.col("ok").fill_null(value=False)
    if spec.ttft_limit_s is not None:
        good &= pl.col("ttft_s") <= spec.ttft_limit_s
    if spec.tpot_limit_s is not None:
        good &= pl.col("tpot_s").fill_null(0.0) <= spec.tpot_limit_s
    return (
        requests.pipe(with_tpot)
        .with_columns(good=good.fill_null(value=False))
        .with_columns(minute_ts=pl.col("arrival_ts").dt.truncate(MINUTE))
    )


def complete_minutes(
    outcomes: pl.LazyFrame, *, tail_quantile: float = COMPLETE_TAIL_QUANTILE
) -> pl.LazyFrame:
    """Only arrival minutes whose requests have (nearly) all finished within the data, and not
    the first minute, which may have started before the data did."""
    tail = pl.duration(microseconds=(pl.col("e2e_s").quantile(tail_quantile) * 1e6).cast(pl.Int64))
    horizon = pl.col("end_ts").max() - tail
    first = pl.col("minute_ts").min()
    return outcomes.filter(
        (pl.col("minute_ts") + pl.duration(minutes=1) <= horizon) & (pl.col("minute_ts") > first)
    )


def minute_loads(outcomes: pl.LazyFrame, *, by: Sequence[str]) -> pl.LazyFrame:
    """Per group and minute: requests, good requests, serving replicas and `load_rps`, the
    arrivals per serving replica."""
    return (
        outcomes.group_by(*by, "minute_ts")
        .agg(
            pl.len().cast(pl.Int64).alias("requests"),
            pl.col("good").sum().cast(pl.Int64).alias("good"),
            pl.col("replica").n_unique().cast(pl.Int64).alias("replicas"),
            pl.col("completion_tokens").fill_null(0).sum().alias("completion_tokens"),
            pl.col("prompt_tokens").fill_null(0).sum().alias("prompt_tokens"),
        )
        .with_columns(load_rps=pl.col("requests") / pl.col("replicas") / MINUTE_S)
        .sort(*by, "minute_ts")
    )


_load = operator.attrgetter("load_rps")


def isotonic_steps(points: Sequence[LoadPoint]) -> list[tuple[float, float]]:
    """Decreasing isotonic regression of attainment on load (pool adjacent violators, weighted
    by requests): (mean load, attainment) of each step, in load order."""
    # Per block: good, requests, load x requests. A new point takes in the blocks before it
    # while they violate (the sums are those of merging it into them: addition commutes); a
    # bootstrap runs this thousands of times, so plain lists rather than block objects.
    goods: list[float] = []
    totals: list[float] = []
    weights: list[float] = []
    for point in sorted(points, key=_load):
        if point.requests <= 0:
            continue
        good, requests = float(point.good), float(point.requests)
        weighted = point.load_rps * point.requests
        while goods and goods[-1] / totals[-1] < good / requests:
            good += goods.pop()
            requests += totals.pop()
            weighted += weights.pop()
        goods.append(good)
        totals.append(requests)
        weights.append(weighted)
    return [(w / r, g / r) for g, r, w in zip(goods, totals, weights, strict=True)]


def isotonic_knee(points: Sequence[LoadPoint], *, target_ratio: float) -> float:
    """The load where the fitted attainment crosses `target_ratio`: unbounded if it never falls
    below, 0 if even the lightest load misses it."""
    steps = isotonic_steps(points)
    if not steps:
        return math.nan
    if steps[0][1] < target_ratio:
        return 0.0
    for (load0, met0), (load1, met1) in itertools.pairwise(steps):
        if met0 >= target_ratio > met1:
            return load0 + (met0 - target_ratio) / (met0 - met1) * (load1 - load0)
    return math.inf


def bootstrap_knees(
    points: Sequence[LoadPoint], *, target_ratio: float, resamples: int, seed: int
) -> list[float]:
    """The knee of `resamples` resamples of the minutes (drawn with replacement), sorted."""
    draw = random.Random(seed)  # noqa: S311 - a seeded, reproducible resample, not a secret
    knees = [
        isotonic_knee(draw.choices(points, k=len(points)), target_ratio=target_ratio)
        for _ in range(resamples)
    ]
    return sorted(knee for knee in knees if not math.isnan(knee))


def fit_attainment(
    minutes: pl.DataFrame, *, spec: AttainmentSpec, group: str, data: str
) -> AttainmentFit:
    """The knee and its interval from one group's `minute_loads` rows."""
    points = [
        LoadPoint(load, good, requests)
        for load, good, requests in minutes.select("load_rps", "good", "requests").iter_rows()
        if requests > 0 and math.isfinite(load)
    ]
    if len(points) < 5:
        raise ValueError(
            f"attainment fit for {group} ({data}): {len(points)} complete minutes with requests; "
            "a knee needs at least 5"
        )
    knee = isotonic_knee(points, target_ratio=spec.target_ratio)
    knees = bootstrap_knees(
        points, target_ratio=spec.target_ratio, resamples=spec.resamples, seed=spec.seed
    )
    low, high = outward_interval(knees, spec.confidence_ratio)
    totals = minutes.select(
        pl.col("requests").sum(),
        pl.col("good").sum(),
        pl.col("completion_tokens").sum(),
        pl.col("prompt_tokens").sum(),
        pl.col("replicas").max(),
        pl.col("load_rps").min().alias("load_min"),
        pl.col("load_rps").max().alias("load_max"),
    ).row(0, named=True)
    requests = totals["requests"]
    return AttainmentFit(
        group=group,
        spec=spec,
        knee_load=knee,
        knee_low_load=min(low, knee),
        knee_high_load=max(high, knee),
        points=len(points),
        replicas=totals["replicas"],
        requests=requests,
        load_min=totals["load_min"],
        load_max=totals["load_max"],
        attainment_ratio=totals["good"] / requests,
        completion_tokens_per_request=totals["completion_tokens"] / requests,
        prompt_tokens_per_request=totals["prompt_tokens"] / requests,
        data=data,
    )
