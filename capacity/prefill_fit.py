"""Prefill fit: the engine's cost per uncached prompt token, from conversations' first turns.

The engine fit (engine_fit.py) measures prefill's cost as it slows the decode steps around it:
a cost per prompt token as served, cache hits included, and attenuated, because which steps a
prompt was prefilled in is itself reconstructed. Replaying conversations through a prefix cache
needs the cost of a token the cache did not hold. A conversation's first turn has no history
to find (at most a shared system prompt, which moves the intercept, not the slope), and its
prefill time is in its span (`time_in_model_prefill`, else TTFT less the time in queue): the
slope of prefill time on prompt tokens over first turns is that cost. On emulated fleets it
is within 5% of the engine's (docs/capacity.md).

A conversation already under way when the data starts shows a later turn as its first; those
are left out (conversation_turns.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from servewatch.capacity.bootstrap import outward_interval
from servewatch.capacity.conversation_turns import conversation_turns
from servewatch.capacity.figure import fmt

MIN_FIRST_TURNS = 30


@dataclass(frozen=True)
class PrefillFit:
    """Seconds of prefill per uncached prompt token, with its bootstrap resamples."""

    per_token_s: float
    resampled: tuple[float, ...]
    first_turns: int

    def interval(self, confidence_ratio: float) -> tuple[float, float]:
        found = sorted(self.resampled)
        return outward_interval(found, confidence_ratio) if found else (math.nan, math.nan)

    def summary(self) -> str:
        return (
            f"prefill {fmt(self.per_token_s * 1e6)} us per uncached prompt token, the slope of "
            f"prefill time on prompt tokens over {self.first_turns} conversations' first turns"
        )


def _first_turns(served: pl.DataFrame) -> pl.DataFrame:
    prefill = pl.coalesce(pl.col("prefill_s"), pl.col("ttft_s") - pl.col("queue_s").fill_null(0.0))
    return (
        conversation_turns(served, begun_inside=True)
        .filter(pl.col("turn") == 0)
        .select(x=pl.col("prompt_tokens").cast(pl.Float64), y=prefill.cast(pl.Float64))
        .filter(pl.col("y").is_finite())
    )


def _slope(points: pl.DataFrame) -> float | None:
    """The least-squares slope of y on x, None unless positive and finite."""
    slope = points.select(pl.cov("x", "y") / pl.col("x").var()).item()
    return float(slope) if slope is not None and math.isfinite(slope) and slope > 0 else None


def fit_first_turn_prefill(served: pl.DataFrame, *, seed: int, resamples: int) -> PrefillFit | None:
    """The cost per uncached prompt token from `served` (successful requests with
    `conversation_id`, arrival and end times, prompt tokens and prefill or TTFT and queue
    times); None without conversations, with fewer than `MIN_FIRST_TURNS` first turns, or
    when prefill time does not rise with the prompt."""
    needed = {"conversation_id", "arrival_ts", "end_ts", "prompt_tokens", "ttft_s"}
    if not needed <= set(served.columns):
        return None
    for optional in ("prefill_s", "queue_s"):
        if optional not in served.columns:
            served = served.with_columns(pl.lit(None, dtype=pl.Float64).alias(optional))
    points = _first_turns(served.filter(pl.col("prompt_tokens").is_not_null()))
    if points.height < MIN_FIRST_TURNS:
        return None
    slope = _slope(points)
    if slope is None:
        return None
    found: list[float] = []
    for i in range(resamples):
        resampled = _slope(points.sample(points.height, with_replacement=True, seed=seed + i))
        if resampled is not None:
            found.append(resampled)
    return PrefillFit(per_token_s=slope, resampled=tuple(found), first_turns=points.height)
