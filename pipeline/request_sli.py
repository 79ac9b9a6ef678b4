"""Per-request SLIs from traced requests: TTFT, TPOT, e2e percentiles, attainment and goodput.

Definitions follow vLLM so numbers can be held against `vllm bench serve`:
- TPOT = decode time / (completion tokens - 1); a single-token output has no TPOT. Where a span
  lacks the decode time, (e2e - TTFT) stands in, which is the benchmark's own formula.
- Percentiles interpolate linearly (numpy's default) over successful requests only.
- A request is good iff it succeeded and every given limit holds, limits inclusive. For the TPOT
  limit a single-token output counts as TPOT 0, as the benchmark does.
- Goodput = good requests / window length (req/s); attainment = good / all requests.
- Token goodput = output tokens of good requests / window length (tokens/s); the token
  goodput ratio = those tokens / the output tokens of every request, failed ones included
  (tokens a failed request produced were produced and not delivered within the SLO). A
  request without a token count adds none. See docs/sli.md.
All functions are pure LazyFrame -> LazyFrame transforms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
LATENCY_SLIS: tuple[str, ...] = ("ttft_s", "tpot_s", "e2e_s")


@dataclass(frozen=True)
class GoodputLimits:
    """Inclusive per-request limits in seconds; None means the metric is not constrained."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"goodput limit {name} must be a positive number, got {value}")

    @property
    def is_empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2e_s is None


TPOT_SQL = (
    "CASE WHEN completion_tokens > 1 "
    "THEN coalesce(decode_s, e2e_s - ttft_s) / (completion_tokens - 1) END"
)
"""TPOT as vLLM defines it, over a `requests` row: decode time per output token after the
first (e2e - TTFT where the span lacks the decode time), null for single-token outputs. One
expression for both engines: Polars evaluates it here, the store's rollups in DuckDB."""


def with_tpot(requests: pl.LazyFrame) -> pl.LazyFrame:
    """Add `tpot_s` (`TPOT_SQL`)."""
    return requests.with_columns(tpot_s=pl.sql_expr(TPOT_SQL))


def with_good(requests: pl.LazyFrame, *, limits: GoodputLimits) -> pl.LazyFrame:
    """Add `good` (needs `tpot_s`); null for every row when no limit is given."""
    if limits.is_empty:
        return requests.with_columns(good=pl.lit(None, dtype=pl.Boolean))
    condition = pl.col("ok")
    if limits.ttft_s is not None:
        condition &= pl.col("ttft_s") <= limits.ttft_s
    if limits.tpot_s is not None:
        condition &= pl.col("tpot_s").fill_null(0.0) <= limits.tpot_s
    if limits.e2e_s is not None:
        condition &= pl.col("e2e_s") <= limits.e2e_s
    return requests.with_columns(good=condition.fill_null(value=False))


def with_bad(requests: pl.LazyFrame, *, limits: GoodputLimits) -> pl.LazyFrame:
    """Add `bad`: the request failed, or missed a goodput limit (adds `tpot_s` and `good`;
    with no limits only failures are bad)."""
    failed = ~pl.col("ok").fill_null(value=False)
    return (
        requests.pipe(with_tpot)
        .pipe(with_good, limits=limits)
        .with_columns(bad=failed | ~pl.col("good").fill_null(value=True))
    )


def with_window(requests: pl.LazyFrame, *, window_s: float | None = None) -> pl.LazyFrame:
    """Add `window_s`: the given length, else first arrival to last completion of all rows."""
    if window_s is not None:
        return requests.with_columns(window_s=pl.lit(window_s, dtype=pl.Float64))
    span = pl.col("end_ts").max() - pl.col("arrival_ts").min()
    return requests.with_columns(window_s=span.dt.total_microseconds().cast(pl.Float64) / 1e6)


def _aggregations() -> list[pl.Expr]:
    ok = pl.col("ok")
    exprs: list[pl.Expr] = [
        pl.len().alias("requests"),
        (~ok).sum().alias("failed_requests"),
        pl.col("good").sum().alias("good_requests"),
        pl.col("good").is_not_null().any().alias("has_limits"),
        pl.col("prompt_tokens").filter(ok).sum().alias("prompt_tokens"),
        pl.col("completion_tokens").filter(ok).sum().alias("completion_tokens"),
        pl.col("completion_tokens").filter(pl.col("good")).sum().alias("good_output_tokens"),
        pl.col("completion_tokens").sum().alias("output_tokens"),
        pl.col("window_s").first().alias("window_s"),
    ]
    for sli in LATENCY_SLIS:
        values = pl.col(sli).filter(ok & pl.col(sli).is_not_null())
        exprs.append(values.len().alias(f"{sli.removesuffix('_s')}_samples"))
        exprs.extend(
            values.quantile(p / 100, interpolation="linear").alias(
                f"{sli.removesuffix('_s')}_p{p}_s"
            )
            for p in PERCENTILES
        )
    return exprs


def summarize(requests: pl.LazyFrame, *, by: Sequence[str] = ()) -> pl.LazyFrame:
    """One row per group of `by` (one row overall when empty) with counts, percentiles, goodput.

    Expects the columns added by `with_tpot`, `with_good` and `with_window`.
    """
    aggs = _aggregations()
    grouped = (
        requests.group_by(list(by), maintain_order=True).agg(aggs).sort(list(by), nulls_last=True)
        if by
        else requests.select(aggs)
    )
    window_ok = pl.col("window_s") > 0
    has_limits = pl.col("has_limits")
    return grouped.with_columns(
        good_requests=pl.when(has_limits).then(pl.col("good_requests")).otherwise(None),
        good_output_tokens=pl.when(has_limits).then(pl.col("good_output_tokens")).otherwise(None),
        token_goodput_tps=pl.when(has_limits & window_ok)
        .then(pl.col("good_output_tokens") / pl.col("window_s"))
        .otherwise(None),
        token_goodput_ratio=pl.when(has_limits & (pl.col("output_tokens") > 0))
        .then(pl.col("good_output_tokens") / pl.col("output_tokens"))
        .otherwise(None),
        attainment_ratio=pl.when(has_limits & (pl.col("requests") > 0))
        .then(pl.col("good_requests") / pl.col("requests"))
        .otherwise(None),
        goodput_rps=pl.when(has_limits & window_ok)
        .then(pl.col("good_requests") / pl.col("window_s"))
        .otherwise(None),
        throughput_rps=pl.when(window_ok)
        .then((pl.col("requests") - pl.col("failed_requests")) / pl.col("window_s"))
        .otherwise(None),
    ).drop("has_limits")


def request_slis(
    requests: pl.LazyFrame,
    *,
    limits: GoodputLimits,
    window_s: float | None = None,
    by: Sequence[str] = (),
) -> pl.LazyFrame:
    """The whole chain: TPOT, goodness, window length, then the summary per group."""
    return (
        requests.pipe(with_tpot)
        .pipe(with_good, limits=limits)
        .pipe(with_window, window_s=window_s)
        .pipe(summarize, by=by)
    )
