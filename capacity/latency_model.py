"""Latency models: how TTFT and TPOT grow with a replica's load, fitted per replica-minute.

Two lines, the relations the engines' own sizing tools use (REFERENCE section 7):
- TPOT against the running batch, TPOT = a + b x batch (each decode step reads the weights once
  and adds work per sequence, as in llm-d's variant autoscaler);
- TTFT against the arrival rate and the uncached prompt tokens per request,
  TTFT = c0 + c1 x req/s + c2 x uncached tokens (prefill work grows with both).
The quantile fitted is the SLO's attainment target (p90 for 90% of requests meeting the limits),
so a line meeting its limit is where that share of requests stops meeting it.

Each line's knee is the load where it meets its limit, in req/s per replica: for TTFT directly
(at the mean uncached prompt length observed); for TPOT the knee batch is turned into a request
rate by Little's law, batch = req/s x time a request spends running, with that time fitted from
the same minutes (through the origin). Running time grows near the knee, so this overstates the
rate there; the models serve where the attainment fit saw no knee, and such a knee is always
marked extrapolated. Intervals come from a bootstrap over minutes.
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import polars as pl

from servewatch.capacity.attainment_fit import MINUTE_S
from servewatch.capacity.bootstrap import outward_interval
from servewatch.capacity.figure import fmt


class LatencyKind(Enum):
    TTFT = "TTFT"
    TPOT = "TPOT"


@dataclass(frozen=True)
class LatencyModel:
    """A fitted line, its knee in req/s per replica with a bootstrap interval, and its data."""

    kind: LatencyKind
    quantile: float
    limit_s: float
    coefficients: tuple[float, ...]
    regressors: tuple[str, ...]
    knee_rps: float
    knee_low_rps: float
    knee_high_rps: float
    points: int
    load_max_rps: float
    detail: str

    @property
    def extrapolated(self) -> bool:
        return not self.knee_rps <= self.load_max_rps

    def formula(self) -> str:
        terms = [f"{self.coefficients[0]:.4g} s"] + [
            f"{c:.4g} s x {name}"
            for c, name in zip(self.coefficients[1:], self.regressors, strict=True)
        ]
        return f"p{self.quantile * 100:g} {self.kind.value} = " + " + ".join(terms)

    def summary(self) -> str:
        where = "beyond" if self.extrapolated else "within"
        knee = (
            "never meets the limit"
            if math.isinf(self.knee_rps)
            else f"meets {self.limit_s:g} s at {fmt(self.knee_rps)} req/s "
            f"(interval {fmt(self.knee_low_rps)} to {fmt(self.knee_high_rps)}), {where} the "
            f"observed {fmt(self.load_max_rps)} req/s"
        )
        return f"{self.formula()} over {self.points} replica-minutes{self.detail}; {knee}"


def latency_minutes(outcomes: pl.LazyFrame, *, quantile: float) -> pl.LazyFrame:
    """Per replica and arrival minute: `load_rps`, `ttft_q_s` and `tpot_q_s` (the quantile over
    successful requests) and traced prompt tokens per request."""
    ok = pl.col("ok").fill_null(value=False)
    return (
        outcomes.group_by("replica", "minute_ts")
        .agg(
            (pl.len() / MINUTE_S).alias("load_rps"),
            pl.col("ttft_s")
            .filter(ok)
            .quantile(quantile, interpolation="linear")
            .alias("ttft_q_s"),
            pl.col("tpot_s")
            .filter(ok)
            .quantile(quantile, interpolation="linear")
            .alias("tpot_q_s"),
            pl.col("prompt_tokens").mean().alias("prompt_tokens_per_request"),
        )
        .sort("replica", "minute_ts")
    )


def least_squares(rows: Sequence[Sequence[float]]) -> tuple[float, ...] | None:
    """y = c0 + c1 x1 + ... from rows (x1, ..., y) by the normal equations; None if singular."""
    if not rows:
        return None
    k = len(rows[0])  # regressors + 1, the size of the system with the intercept
    # Column sums at C speed, each added in row order from 0.0 as a running sum would be.
    *regressors, y = (list(map(float, column)) for column in zip(*rows, strict=True))
    x = [[1.0] * len(rows), *regressors]
    xtx = [[sum(map(operator.mul, x[i], x[j]), 0.0) for j in range(k)] for i in range(k)]
    xty = [sum(map(operator.mul, x[i], y), 0.0) for i in range(k)]
    return _solve_normal(xtx, xty)


def resampled_least_squares(
    rows: Sequence[Sequence[float]], *, draw: random.Random, resamples: int
) -> list[tuple[float, ...] | None]:
    """`least_squares` of `resamples` bootstrap resamples of `rows` (each drawn as
    `draw.choices(rows, k=len(rows))` would draw it), the normal equations of each summed by
    Polars from the rows' products: a bootstrap over thousands of minutes, hundreds of times."""
    if not rows:
        return [None] * resamples
    k = len(rows[0])
    columns = pl.DataFrame({f"c{i}": [float(row[i]) for row in rows] for i in range(k)}).select(
        pl.lit(1.0).alias("one"), pl.all()
    )
    names = columns.columns  # the intercept's ones, the regressors, then y
    products = columns.select(
        [
            (pl.col(names[i]) * pl.col(names[j])).alias(f"{i}_{j}")
            for i in range(k)
            for j in range(i, k + 1)
        ]
    )
    population = range(len(rows))
    found: list[tuple[float, ...] | None] = []
    for _ in range(resamples):
        picked = pl.Series(draw.choices(population, k=len(rows)), dtype=pl.UInt32)
        sums = products[picked].sum().row(0, named=True)
        xtx = [[sums[f"{min(i, j)}_{max(i, j)}"] for j in range(k)] for i in range(k)]
        xty = [sums[f"{i}_{k}"] for i in range(k)]
        found.append(_solve_normal(xtx, xty))
    return found


def _solve_normal(xtx: list[list[float]], xty: list[float]) -> tuple[float, ...] | None:
    """Gaussian elimination with partial pivoting on the small k x k system; None if
    singular."""
    k = len(xty)
    scale = max(abs(v) for line in xtx for v in line) or 1.0
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(xtx[r][col]))
        if abs(xtx[pivot][col]) <= 1e-12 * scale:
            return None
        xtx[col], xtx[pivot] = xtx[pivot], xtx[col]
        xty[col], xty[pivot] = xty[pivot], xty[col]
        for r in range(col + 1, k):
            factor = xtx[r][col] / xtx[col][col]
            for c in range(col, k):
                xtx[r][c] -= factor * xtx[col][c]
            xty[r] -= factor * xty[col]
    solution = [0.0] * k
    for r in reversed(range(k)):
        done = sum(xtx[r][c] * solution[c] for c in range(r + 1, k))
        solution[r] = (xty[r] - done) / xtx[r][r]
    return tuple(solution)


def _ttft_knee(coefficients: tuple[float, ...] | None, *, limit_s: float, tokens: float) -> float:
    if coefficients is None:
        return math.nan
    c0, c1, c2 = coefficients
    at_zero = c0 + c2 * tokens
    if c1 <= 0:
        return math.inf if at_zero <= limit_s else 0.0
    return max(0.0, (limit_s - at_zero) / c1)


def _tpot_knee(
    coefficients: tuple[float, ...] | None, *, limit_s: float, running_s: float
) -> float:
    if coefficients is None or not running_s > 0:
        return math.nan
    a, b = coefficients
    if b <= 0:
        return math.inf if a <= limit_s else 0.0
    return max(0.0, (limit_s - a) / b) / running_s


def _running_s(rows: Sequence[Sequence[float]]) -> float:
    """Little's law through the origin: batch = req/s x running time; rows are (req/s, batch)."""
    denominator = sum(rate * rate for rate, _ in rows)
    return sum(rate * batch for rate, batch in rows) / denominator if denominator > 0 else math.nan


def _interval(knees: list[float], confidence_ratio: float, knee: float) -> tuple[float, float]:
    """Outward order statistics of the resampled knees, widened to hold the fitted one."""
    usable = sorted(k for k in knees if not math.isnan(k))
    if not usable:
        return knee, knee
    low, high = outward_interval(usable, confidence_ratio)
    return min(low, knee), max(high, knee)


def fit_ttft(
    minutes: pl.DataFrame,
    *,
    limit_s: float,
    quantile: float,
    seed: int,
    resamples: int = 400,
    confidence_ratio: float = 0.9,
) -> LatencyModel | None:
    """TTFT against req/s and uncached prompt tokens per request (`uncached_tokens`); None
    when fewer than 5 minutes or no spread in load."""
    rows = [
        (rate, tokens, ttft)
        for rate, tokens, ttft in minutes.select(
            "load_rps", "uncached_tokens", "ttft_q_s"
        ).iter_rows()
        if rate is not None and tokens is not None and ttft is not None
    ]
    if len(rows) < 5:
        return None
    coefficients = least_squares(rows)
    if coefficients is None:
        return None
    tokens = sum(row[1] for row in rows) / len(rows)
    draw = random.Random(seed)  # noqa: S311 - a seeded, reproducible resample, not a secret
    knees = [
        _ttft_knee(fitted, limit_s=limit_s, tokens=tokens)
        for fitted in resampled_least_squares(rows, draw=draw, resamples=resamples)
    ]
    knee = _ttft_knee(coefficients, limit_s=limit_s, tokens=tokens)
    if math.isnan(knee):
        return None
    low, high = _interval(knees, confidence_ratio, knee)
    return LatencyModel(
        kind=LatencyKind.TTFT,
        quantile=quantile,
        limit_s=limit_s,
        coefficients=coefficients,
        regressors=("req/s", "uncached prompt tokens"),
        knee_rps=knee,
        knee_low_rps=low,
        knee_high_rps=high,
        points=len(rows),
        load_max_rps=max(row[0] for row in rows),
        detail=f", at the mean {fmt(tokens)} uncached prompt tokens per request",
    )


def fit_tpot(
    minutes: pl.DataFrame,
    *,
    limit_s: float,
    quantile: float,
    seed: int,
    resamples: int = 400,
    confidence_ratio: float = 0.9,
) -> LatencyModel | None:
    """TPOT against the running batch (`running_batch`), its knee turned into req/s by Little's
    law; None when fewer than 5 minutes or no spread in the batch."""
    rows = [
        (rate, batch, tpot)
        for rate, batch, tpot in minutes.select("load_rps", "running_batch", "tpot_q_s").iter_rows()
        if rate is not None and batch is not None and tpot is not None
    ]
    if len(rows) < 5:
        return None

    def fit(sample: Sequence[tuple[float, float, float]]) -> float:
        line = least_squares([(batch, tpot) for _, batch, tpot in sample])
        running = _running_s([(rate, batch) for rate, batch, _ in sample])
        return _tpot_knee(line, limit_s=limit_s, running_s=running)

    coefficients = least_squares([(batch, tpot) for _, batch, tpot in rows])
    if coefficients is None:
        return None
    running_s = _running_s([(rate, batch) for rate, batch, _ in rows])
    draw = random.Random(seed)  # noqa: S311 - a seeded, reproducible resample, not a secret
    knees = [fit(draw.choices(rows, k=len(rows))) for _ in range(resamples)]
    knee = fit(rows)
    if math.isnan(knee):
        return None
    low, high = _interval(knees, confidence_ratio, knee)
    return LatencyModel(
        kind=LatencyKind.TPOT,
        quantile=quantile,
        limit_s=limit_s,
        coefficients=coefficients,
        regressors=("running batch",),
        knee_rps=knee,
        knee_low_rps=low,
        knee_high_rps=high,
        points=len(rows),
        load_max_rps=max(row[0] for row in rows),
        detail=f", batch per req/s {fmt(running_s)} s running time (Little's law)",
    )
