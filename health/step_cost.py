"""The engine's step cost: how long one decode step takes at a decode batch and a prefill load,
`itl = a + b * decode_batch + c * prefill_tokens_per_step`, fitted by least squares over
per-minute means. A step has a fixed part (weights read once per step), a part per decoding
sequence (its KV read) and a part per prefill token chunked into the step (which stalls every
decoding request), so replicas at different loads are compared at the same load through it.
"""

from __future__ import annotations

import polars as pl


def step_cost(x1: pl.Expr, x2: pl.Expr) -> pl.Expr:
    """The fitted step cost (columns a, b, c) at decode batch `x1` and prefill per step `x2`."""
    return pl.col("a") + pl.col("b") * x1 + pl.col("c") * x2


def fit_step_cost(minutes: pl.LazyFrame, *, by: str) -> pl.LazyFrame:
    """Per `by` group: least-squares `a`, `b`, `c` of itl_mean_s = a + b * decode_batch + c *
    prefill_tokens_per_step. A negative slope is noise (a step never gets cheaper with more
    work): it is dropped; a fit without a positive intercept falls back to the mean."""
    x1 = pl.col("decode_batch")
    x2 = pl.col("prefill_tokens_per_step")
    y = pl.col("itl_mean_s")

    def cov(u: pl.Expr, v: pl.Expr) -> pl.Expr:
        return ((u - u.mean()) * (v - v.mean())).mean()

    moments = minutes.group_by(by).agg(
        m1=x1.mean(),
        m2=x2.mean(),
        my=y.mean(),
        s11=cov(x1, x1),
        s22=cov(x2, x2),
        s12=cov(x1, x2),
        s1y=cov(x1, y),
        s2y=cov(x2, y),
    )
    s11, s22, s12, s1y, s2y = (pl.col(c) for c in ("s11", "s22", "s12", "s1y", "s2y"))
    det = s11 * s22 - s12 * s12
    # Without prefill variation (or without the iteration-tokens histogram) the batch alone.
    solvable = det > 1e-9 * s11 * s22
    b = (
        pl.when(solvable)
        .then((s22 * s1y - s12 * s2y) / det)
        .when(s11 > 0)
        .then(s1y / s11)
        .otherwise(0.0)
        .clip(lower_bound=0.0)
    )
    c = pl.when(solvable).then((s11 * s2y - s12 * s1y) / det).otherwise(0.0).clip(lower_bound=0.0)
    fitted = moments.with_columns(b=b, c=c).with_columns(
        a=pl.col("my") - pl.col("b") * pl.col("m1") - pl.col("c") * pl.col("m2")
    )
    sound = pl.col("a") > 0
    return fitted.select(
        by,
        a=pl.when(sound).then("a").otherwise("my"),
        b=pl.when(sound).then("b").otherwise(0.0),
        c=pl.when(sound).then("c").otherwise(0.0),
    )
