"""vLLM's latency histograms: their metric names and bucket bounds, and which thresholds they
can answer.

A histogram can only say how many requests took at most one of its bucket bounds, so a
latency SLI read from a histogram (`good = bucket{le="T"}`) needs T to be a bound. Servers may
override the bounds (`--custom-histogram-buckets`), so callers pass the bounds their fleet uses;
the defaults are vLLM's since April 2025.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from enum import Enum


class LatencyMetric(Enum):
    """The per-request latencies an SLO can bound."""

    TTFT = "ttft"
    TPOT = "tpot"
    E2E = "e2e"


# Names without the `vllm:` prefix (some pipelines rewrite it to `vllm_`).
HISTOGRAMS: Mapping[LatencyMetric, str] = {
    LatencyMetric.TTFT: "time_to_first_token_seconds",
    LatencyMetric.TPOT: "request_time_per_output_token_seconds",
    LatencyMetric.E2E: "e2e_request_latency_seconds",
}

_TTFT_BOUNDS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
)
_TTFT_BOUNDS += (5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TPOT_BOUNDS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
)
_TPOT_BOUNDS += (7.5, 10.0, 20.0, 40.0, 80.0)
_E2E_BOUNDS: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
)
_E2E_BOUNDS += (60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

VLLM_DEFAULT_BUCKETS: Mapping[LatencyMetric, tuple[float, ...]] = {
    LatencyMetric.TTFT: _TTFT_BOUNDS,
    LatencyMetric.TPOT: _TPOT_BOUNDS,
    LatencyMetric.E2E: _E2E_BOUNDS,
}


def nearest_bounds(bounds: Sequence[float], value: float) -> tuple[float | None, float | None]:
    """The bounds just below and just above `value` (None past either end)."""
    ordered = sorted(bounds)
    i = bisect.bisect_left(ordered, value)
    below = ordered[i - 1] if i > 0 else None
    above = ordered[i] if i < len(ordered) else None
    return below, above


def bucket_bound(bounds: Sequence[float], threshold_s: float) -> float | None:
    """The bound equal to `threshold_s` (within float noise such as 0.1 + 0.2), else None."""
    for bound in bounds:
        if math.isclose(bound, threshold_s, rel_tol=1e-9, abs_tol=0.0):
            return bound
    return None


def not_a_bound_message(metric: LatencyMetric, bounds: Sequence[float], threshold_s: float) -> str:
    below, above = nearest_bounds(bounds, threshold_s)
    near = " and ".join(f"{b:g}" for b in (below, above) if b is not None)
    return (
        f"{threshold_s:g} s is not a bucket bound of vllm:{HISTOGRAMS[metric]}, so a histogram "
        f"cannot count requests under it; nearest bounds: {near} (or measure it from traces "
        "with source: traces, or pass the buckets your servers use)"
    )


def le_label(bound: float) -> str:
    """The `le` label value vLLM's prometheus_client writes for a bound: 1 -> "1.0"."""
    if math.isinf(bound):
        return "+Inf" if bound > 0 else "-Inf"
    text = repr(float(bound))
    dot = text.find(".")
    # prometheus_client mimics Go, which switches to exponent notation sooner than Python.
    if bound > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text
