"""Request SLIs against hand-computed cases: vLLM's TPOT and `vllm bench serve --goodput`."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
import pytest

from servewatch.pipeline.request_sli import GoodputLimits, request_slis, with_good, with_tpot
from servewatch.pipeline.tables import REQUESTS_SCHEMA

T0 = datetime(2026, 11, 18, 10, 0, 0)


def frame(rows: list[dict[str, object]]) -> pl.LazyFrame:
    defaults: dict[str, object] = {name: None for name in REQUESTS_SCHEMA.names()}
    defaults |= {
        "trace_id": "t",
        "span_id": "s",
        "arrival_ts": T0,
        "end_ts": T0,
        "ok": True,
        "emulated": True,
        "replica": "r0",
    }
    return pl.LazyFrame([defaults | row for row in rows], schema=REQUESTS_SCHEMA)


def test_tpot_is_decode_time_over_tokens_after_the_first() -> None:
    lf = frame(
        [
            {"completion_tokens": 11, "decode_s": 0.5, "ttft_s": 0.2, "e2e_s": 0.75},
            {"completion_tokens": 2, "decode_s": 0.03, "ttft_s": 0.2, "e2e_s": 0.25},
            {"completion_tokens": 1, "decode_s": 0.0, "ttft_s": 0.2, "e2e_s": 0.2},
            # No decode time on the span: (e2e - ttft) / (n - 1), the benchmark's formula.
            {"completion_tokens": 5, "decode_s": None, "ttft_s": 0.2, "e2e_s": 0.6},
        ]
    )
    tpot = lf.pipe(with_tpot).collect()["tpot_s"].to_list()
    assert tpot[0] == pytest.approx(0.05)
    assert tpot[1] == pytest.approx(0.03)
    assert tpot[2] is None
    assert tpot[3] == pytest.approx(0.1)


def test_goodput_limits_are_inclusive_and_failed_requests_are_never_good() -> None:
    lf = frame(
        [
            # exactly on both limits: good
            {"completion_tokens": 3, "ttft_s": 0.5, "decode_s": 0.1, "e2e_s": 0.6},
            # TTFT just over: bad
            {"completion_tokens": 3, "ttft_s": 0.5000001, "decode_s": 0.1, "e2e_s": 0.6},
            # TPOT 0.06 over 0.05: bad
            {"completion_tokens": 3, "ttft_s": 0.1, "decode_s": 0.12, "e2e_s": 0.22},
            # single token: no TPOT, counts as 0 against the TPOT limit: good
            {"completion_tokens": 1, "ttft_s": 0.1, "decode_s": 0.0, "e2e_s": 0.1},
            # fast but failed: never good
            {"completion_tokens": 3, "ttft_s": 0.1, "decode_s": 0.01, "e2e_s": 0.11, "ok": False},
        ]
    )
    limits = GoodputLimits(ttft_s=0.5, tpot_s=0.05)
    good = lf.pipe(with_tpot).pipe(with_good, limits=limits).collect()["good"].to_list()
    assert good == [True, False, False, True, False]


def test_summary_counts_percentiles_and_goodput_by_hand() -> None:
    ttfts = [0.1, 0.2, 0.3, 0.4, 1.0]
    rows: list[dict[str, object]] = [
        {
            "completion_tokens": 11,
            "ttft_s": ttft,
            "decode_s": 0.2,
            "e2e_s": ttft + 0.2,
            "arrival_ts": T0 + timedelta(seconds=i),
            "end_ts": T0 + timedelta(seconds=i + 1),
            "prompt_tokens": 100,
        }
        for i, ttft in enumerate(ttfts)
    ]
    rows.append(
        {
            "completion_tokens": 0,
            "ttft_s": 0.05,
            "e2e_s": 0.05,
            "ok": False,
            "arrival_ts": T0 + timedelta(seconds=9),
            "end_ts": T0 + timedelta(seconds=10),
            "prompt_tokens": 100,
        }
    )
    out = (
        frame(rows)
        .pipe(request_slis, limits=GoodputLimits(ttft_s=0.3))
        .collect()
        .row(0, named=True)
    )
    assert out["requests"] == 6
    assert out["failed_requests"] == 1
    # good: ttft 0.1, 0.2, 0.3 (inclusive); the failed one is fast but not good
    assert out["good_requests"] == 3
    assert out["attainment_ratio"] == pytest.approx(3 / 6)
    # window: first arrival T0 to last completion T0+10 s
    assert out["window_s"] == pytest.approx(10.0)
    assert out["goodput_rps"] == pytest.approx(0.3)
    assert out["throughput_rps"] == pytest.approx(0.5)
    # percentiles over the 5 successful requests, linear: rank = p * (n - 1)
    assert out["ttft_p50_s"] == pytest.approx(0.3)
    assert out["ttft_p90_s"] == pytest.approx(0.4 + 0.6 * 0.6)
    assert out["ttft_samples"] == 5
    assert out["tpot_p50_s"] == pytest.approx(0.02)
    assert out["prompt_tokens"] == 500


def test_token_goodput_counts_output_tokens_of_good_requests_against_all_by_hand() -> None:
    rows: list[dict[str, object]] = [
        # good: TTFT within 0.3 s
        {"completion_tokens": 100, "ttft_s": 0.2, "decode_s": 1.0, "e2e_s": 1.2},
        # too slow: its tokens are output, not good
        {"completion_tokens": 50, "ttft_s": 0.4, "decode_s": 0.5, "e2e_s": 0.9},
        # failed after streaming 30 tokens: output, never good
        {"completion_tokens": 30, "ttft_s": 0.1, "decode_s": 0.3, "e2e_s": 0.4, "ok": False},
        # good, but the span has no token count: adds no tokens to either side
        {"completion_tokens": None, "ttft_s": 0.1, "decode_s": 0.3, "e2e_s": 0.4},
    ]
    out = (
        frame(rows)
        .pipe(request_slis, limits=GoodputLimits(ttft_s=0.3), window_s=10.0)
        .collect()
        .row(0, named=True)
    )
    assert out["good_requests"] == 2
    assert out["good_output_tokens"] == 100
    assert out["output_tokens"] == 180
    # completion_tokens stays what it was: the successful requests' tokens.
    assert out["completion_tokens"] == 150
    assert out["token_goodput_tps"] == pytest.approx(10.0)
    assert out["token_goodput_ratio"] == pytest.approx(100 / 180)


def test_without_limits_goodput_is_not_invented() -> None:
    lf = frame([{"completion_tokens": 3, "ttft_s": 0.1, "decode_s": 0.1, "e2e_s": 0.2}])
    out = lf.pipe(request_slis, limits=GoodputLimits()).collect().row(0, named=True)
    assert out["good_requests"] is None
    assert out["goodput_rps"] is None
    assert out["attainment_ratio"] is None
    assert out["good_output_tokens"] is None
    assert out["token_goodput_tps"] is None
    assert out["token_goodput_ratio"] is None
    assert out["output_tokens"] == 3


def test_explicit_window_sets_the_rate_denominator() -> None:
    lf = frame([{"completion_tokens": 3, "ttft_s": 0.1, "decode_s": 0.1, "e2e_s": 0.2}])
    out = (
        lf.pipe(request_slis, limits=GoodputLimits(ttft_s=1.0), window_s=60.0)
        .collect()
        .row(0, named=True)
    )
    assert out["goodput_rps"] == pytest.approx(1 / 60)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_non_positive_limits_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="tpot_s must be a positive"):
        GoodputLimits(tpot_s=bad)
