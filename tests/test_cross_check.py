"""The trace/histogram cross-check: bucket widths and the divergence flag."""

from __future__ import annotations

import math

import polars as pl
import pytest

from servewatch.pipeline.cross_check import bucket_width, cross_check

TTFT_BOUNDS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, math.inf]


@pytest.mark.parametrize(
    ("value", "width"),
    [(0.0005, 0.001), (0.3, 0.25), (0.5, 0.25), (0.6, 0.25), (0.99, 0.25), (2.0, math.inf)],
)
def test_bucket_width(value: float, width: float) -> None:
    assert bucket_width(value, TTFT_BOUNDS) == pytest.approx(width)


def test_windows_differing_by_more_than_a_bucket_are_flagged() -> None:
    traces = pl.LazyFrame({"window_end_s": [60.0, 120.0, 180.0], "trace_s": [0.3, 0.2, None]})
    histograms = pl.LazyFrame(
        {"window_end_s": [60.0, 120.0, 180.0], "histogram_s": [0.35, 0.6, 0.4]}
    )
    checked = cross_check(traces, histograms, bounds=TTFT_BOUNDS).collect()
    # 0.3 vs 0.35: inside one 0.25 s bucket; 0.2 vs 0.6: 0.4 apart, wider than (0.5, 0.75]
    assert checked["diverges"].to_list() == [False, True, None]
