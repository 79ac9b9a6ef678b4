"""Capacity fit: one replica's capacity at the SLO, refitted from what the fleet actually did.

Input is a generic frame of observations, one row per replica and window (a minute rollup, say):
`replica`, a load column (req/s per replica, or the running batch) and a latency column (p95 TPOT
or TTFT in seconds). Latency grows with load; like llm-d's variant autoscaler this fits the line
latency = a + b x load (least squares, pooled over replicas so the estimate is per replica), and
the capacity at the SLO is the load where the fitted line meets the latency limit: the knee.

The interval comes from a bootstrap over observations (resampled with replacement, a seed
injected so a recommendation is reproducible); its ends are taken outward (the lower and higher
order statistic), so an unbounded resample shows as an unbounded end rather than a NaN.

A knee beyond the highest observed load is an extrapolation: the line was never seen to hold
there, and the result says so and by how much. A fleet sized on an extrapolated knee rests on the
highest observed load being the only one proven to meet the SLO, which is why that load becomes
the low end of the capacity's range in the risk analysis.

All transforms are pure `LazyFrame -> LazyFrame`; `fit_capacity` is the one edge that collects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import polars as pl

from servewatch.capacity.figure import Figure, fmt, measured

LOAD = "load"
LATENCY = "latency_s"


class LoadUnit(Enum):
    REQ_PER_S = "req/s"
    RUNNING_BATCH = "running requests"


class KneeFit(Protocol):
    """What the risk analysis and the record read of any capacity fit: where the knee lies, its
    interval, and the load the data covered (this module's line fit, or a pool's capacity)."""

    @property
    def load_unit(self) -> LoadUnit: ...

    @property
    def knee_load(self) -> float: ...

    @property
    def knee_low_load(self) -> float: ...

    @property
    def knee_high_load(self) -> float: ...

    @property
    def load_min(self) -> float: ...

    @property
    def load_max(self) -> float: ...

    @property
    def confidence_ratio(self) -> float: ...

    @property
    def points(self) -> int: ...

    @property
    def replicas(self) -> int: ...

    @property
    def data(self) -> str: ...

    @property
    def extrapolated(self) -> bool: ...

    @property
    def extrapolation_ratio(self) -> float: ...

    def summary(self) -> str: ...


@dataclass(frozen=True)
class FitSpec:
    latency_limit_s: float
    load_unit: LoadUnit
    seed: int
    load_column: str = "load"
    latency_column: str = "latency_p95_s"
    confidence_ratio: float = 0.9
    resamples: int = 400

    def __post_init__(self) -> None:
        if not self.latency_limit_s > 0:
            raise ValueError(f"latency limit is {self.latency_limit_s!r} s; allowed: > 0")
        if not 0 < self.confidence_ratio < 1:
            raise ValueError(
                f"confidence is {self.confidence_ratio!r}; allowed: strictly between 0 and 1"
            )
        if self.resamples < 10:
            raise ValueError(f"resamples is {self.resamples}; allowed: 10 or more")


@dataclass(frozen=True)
class CapacityFit:
    """The fitted line, its knee with the bootstrap interval, and what the data covered."""

    latency_limit_s: float
    load_unit: LoadUnit
    intercept_s: float
    slope_s_per_load: float
    knee_load: float
    knee_low_load: float
    knee_high_load: float
    confidence_ratio: float
    points: int
    replicas: int
    load_min: float
    load_max: float
    data: str

    @property
    def extrapolated(self) -> bool:
        return self.knee_load > self.load_max

    @property
    def extrapolation_ratio(self) -> float:
        """Knee / highest observed load: how far beyond the data the knee lies."""
        return self.knee_load / self.load_max if self.load_max > 0 else math.inf

    def summary(self) -> str:
        unit = self.load_unit.value
        line = (
            f"latency = {self.intercept_s:.4g} s + {self.slope_s_per_load:.4g} s per {unit}, "
            f"fitted on {self.points} windows of {self.replicas} replicas ({self.data}), "
            f"load {fmt(self.load_min)} to {fmt(self.load_max)} {unit}"
        )
        if math.isinf(self.knee_load):
            return f"{line}; latency did not rise with load, so no knee can be located"
        interval = (
            f"{fmt(self.knee_load)} {unit} at the {self.latency_limit_s:g} s limit "
            f"({self.confidence_ratio:.0%} interval {fmt(self.knee_low_load)} to "
            f"{fmt(self.knee_high_load)})"
        )
        if self.extrapolated:
            return (
                f"{line}; knee {interval} is extrapolated: "
                f"{self.extrapolation_ratio:.1f}x the highest observed load"
            )
        return f"{line}; knee {interval} lies within the observed load"


def load_latency_points(
    frame: pl.LazyFrame, *, load_column: str, latency_column: str
) -> pl.LazyFrame:
    """`replica`, `load`, `latency_s` rows that can be fitted (finite, load >= 0)."""
    load = pl.col(load_column).cast(pl.Float64)
    latency = pl.col(latency_column).cast(pl.Float64)
    return frame.select(
        pl.col("replica").cast(pl.String),
        load.alias(LOAD),
        latency.alias(LATENCY),
    ).filter(
        pl.col(LOAD).is_finite()
        & pl.col(LATENCY).is_finite()
        & (pl.col(LOAD) >= 0)
        & (pl.col(LATENCY) >= 0)
    )


def least_squares(points: pl.LazyFrame, *, by: Sequence[str] = ()) -> pl.LazyFrame:
    """Per group: the line latency = intercept + slope x load, and what the data covered."""
    x, y = pl.col(LOAD), pl.col(LATENCY)
    terms = [x, y, (x * x).alias("xx"), (x * y).alias("xy"), pl.col("replica")]
    # Each group's rows are gathered into lists, in row order, and summed there: a parallel
    # group-by sum adds a group's rows in whatever order its threads finish, and the bootstrap
    # interval then moved in its last digits from run to run of the same seed.
    listed = (
        points.group_by(list(by)).agg(terms)
        if by
        else points.select(term.implode() for term in terms)
    )
    grouped = listed.select(
        *by,
        pl.col(LOAD).list.len().alias("points"),
        pl.col(LOAD).list.sum().alias("sx"),
        pl.col(LATENCY).list.sum().alias("sy"),
        pl.col("xx").list.sum().alias("sxx"),
        pl.col("xy").list.sum().alias("sxy"),
        pl.col(LOAD).list.min().alias("load_min"),
        pl.col(LOAD).list.max().alias("load_max"),
        pl.col("replica").list.n_unique().alias("replicas"),
    )
    n = pl.col("points").cast(pl.Float64)
    spread = n * pl.col("sxx") - pl.col("sx") ** 2
    # Rounding can leave a tiny positive spread when every load is equal: no line then.
    varied = spread > 1e-12 * (n * pl.col("sxx")).abs()
    slope = pl.when(varied).then((n * pl.col("sxy") - pl.col("sx") * pl.col("sy")) / spread)
    return (
        grouped.with_columns(slope_s_per_load=slope)
        .with_columns(
            intercept_s=(pl.col("sy") - pl.col("slope_s_per_load") * pl.col("sx")) / n,
        )
        .drop("sx", "sy", "sxx", "sxy")
    )


def with_knee(lines: pl.LazyFrame, *, latency_limit_s: float) -> pl.LazyFrame:
    """Add `knee_load`: where the line meets the limit; inf if it never does, 0 if always over."""
    a, b = pl.col("intercept_s"), pl.col("slope_s_per_load")
    knee = (
        pl.when(b > 0)
        .then(((latency_limit_s - a) / b).clip(lower_bound=0.0))
        .when(a <= latency_limit_s)
        .then(pl.lit(math.inf))
        .otherwise(pl.lit(0.0))
    )
    return lines.with_columns(knee_load=pl.when(b.is_not_null()).then(knee))


def bootstrap_resamples(points: pl.LazyFrame, *, resamples: int, seed: int) -> pl.LazyFrame:
    """`resamples` copies of the points drawn with replacement, numbered by `resample`."""
    draw = pl.int_range(pl.len()).sample(
        fraction=float(resamples), with_replacement=True, seed=seed
    )
    return points.select(pl.all().gather(draw)).with_columns(
        resample=pl.int_range(pl.len()) % resamples
    )


def knee_interval(
    points: pl.LazyFrame,
    *,
    latency_limit_s: float,
    resamples: int,
    seed: int,
    confidence_ratio: float,
) -> pl.LazyFrame:
    """One row: `knee_low_load`, `knee_high_load`, the bootstrap interval of the knee."""
    tail = (1.0 - confidence_ratio) / 2.0
    return (
        points.pipe(bootstrap_resamples, resamples=resamples, seed=seed)
        .pipe(least_squares, by=["resample"])
        .pipe(with_knee, latency_limit_s=latency_limit_s)
        .select(
            knee_low_load=pl.col("knee_load").quantile(tail, interpolation="lower"),
            knee_high_load=pl.col("knee_load").quantile(1.0 - tail, interpolation="higher"),
        )
    )


def capacity_fit_frame(frame: pl.LazyFrame, *, spec: FitSpec) -> pl.LazyFrame:
    """One row: the pooled line, its knee and the knee's bootstrap interval."""
    points = frame.pipe(
        load_latency_points, load_column=spec.load_column, latency_column=spec.latency_column
    )
    interval = points.pipe(
        knee_interval,
        latency_limit_s=spec.latency_limit_s,
        resamples=spec.resamples,
        seed=spec.seed,
        confidence_ratio=spec.confidence_ratio,
    )
    return (
        points.pipe(least_squares)
        .pipe(with_knee, latency_limit_s=spec.latency_limit_s)
        .join(interval, how="cross")
    )


def fit_capacity(frame: pl.LazyFrame, *, spec: FitSpec, data: str) -> CapacityFit:
    """Collect the fit; `data` says what the frame holds (fleet, window), for the record."""
    row = capacity_fit_frame(frame, spec=spec).collect().row(0, named=True)
    if row["points"] < 3:
        raise ValueError(
            f"capacity fit on {data}: {row['points']} usable windows "
            f"({spec.load_column}, {spec.latency_column}); a line needs at least 3"
        )
    if row["slope_s_per_load"] is None:
        raise ValueError(
            f"capacity fit on {data}: every window has load {fmt(row['load_min'])} "
            f"{spec.load_unit.value}; a line needs load that varies"
        )
    return CapacityFit(
        latency_limit_s=spec.latency_limit_s,
        load_unit=spec.load_unit,
        intercept_s=row["intercept_s"],
        slope_s_per_load=row["slope_s_per_load"],
        knee_load=row["knee_load"],
        knee_low_load=min(row["knee_low_load"], row["knee_load"]),
        knee_high_load=max(row["knee_high_load"], row["knee_load"]),
        confidence_ratio=spec.confidence_ratio,
        points=row["points"],
        replicas=row["replicas"],
        load_min=row["load_min"],
        load_max=row["load_max"],
        data=data,
    )


def capacity_figure(fit: CapacityFit) -> Figure:
    """The knee as one replica's capacity: req/min for a request-rate load, decode tokens/s for
    a running batch (each running request gets a token every TPOT, at the limit at the knee).

    The range is the bootstrap interval; for an extrapolated knee its low end drops to the
    highest observed load, the only load the data shows meeting the SLO.
    """
    if math.isinf(fit.knee_load):
        raise ValueError(
            f"capacity fit ({fit.data}): latency did not rise with load up to "
            f"{fmt(fit.load_max)} {fit.load_unit.value}, so the data bounds no capacity"
        )
    if not fit.knee_load > 0:
        raise ValueError(
            f"capacity fit ({fit.data}): the fitted latency exceeds the "
            f"{fit.latency_limit_s:g} s limit at every load (intercept "
            f"{fit.intercept_s:.3g} s), so no load meets the SLO by this fit"
        )
    if fit.load_unit is LoadUnit.REQ_PER_S:
        scale, unit, how = 60.0, "req/min", "knee x 60 s"
    else:
        scale, unit = 1.0 / fit.latency_limit_s, "tokens/s"
        how = f"knee batch / {fit.latency_limit_s:g} s per token"
    low, high = fit.knee_low_load * scale, fit.knee_high_load * scale
    why = f"{fit.confidence_ratio:.0%} bootstrap interval"
    if fit.extrapolated:
        low = min(low, fit.load_max * scale)
        why += (
            f", low end lowered to the highest observed load ({fmt(fit.load_max)} "
            f"{fit.load_unit.value}) because the knee is extrapolated "
            f"{fit.extrapolation_ratio:.1f}x beyond it"
        )
    return measured(
        fit.knee_load * scale,
        unit,
        f"capacity fit, {how}: {fit.summary()}; range {why}",
        low=low,
        high=high,
    )
