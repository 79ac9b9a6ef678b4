"""Bootstrap intervals: the central interval of resampled estimates, by outward order statistics.

Every refit in capacity/ (attainment knees, latency-line knees, engine step terms, engine-model
knees) resamples its data and reads its interval here, so one rule holds for all of them: the
lower end rounds down and the upper end up, so an interval never narrows below what its
resamples show, and an unbounded resample shows as an unbounded end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def outward_interval(values: Sequence[float], confidence_ratio: float) -> tuple[float, float]:
    """The central `confidence_ratio` interval of sorted `values`; NaN ends when empty."""
    if not values:
        return math.nan, math.nan
    tail = (1.0 - confidence_ratio) / 2.0
    low = values[max(0, math.floor(tail * len(values)))]
    high = values[min(len(values) - 1, math.ceil((1.0 - tail) * len(values)) - 1)]
    return low, high
