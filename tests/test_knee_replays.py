"""The knee search's replays of a pool's requests: shapes, each request's own prefill, and the
recorded conversations with the hit ratio they imply."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
import pytest

from servewatch.capacity.conversation_turns import without_continued_prefix
from servewatch.capacity.engine_fit import EngineFit, StepTime
from servewatch.capacity.knee_search import ModelCheck, PrefillShape, engine_params, replays
from servewatch.capacity.knee_search import _shared_prefix_tokens as shared_prefix_tokens
from servewatch.capacity.prefill_fit import fit_first_turn_prefill
from servewatch.emulator.engine_params import EngineParams

T0 = datetime(2026, 11, 20, 9, 0)
STEP = StepTime(base_s=0.01, per_seq_s=0.0001, per_prefill_token_s=0.00002)
FIT = EngineFit(STEP, (STEP,), 6, 2, 3, 4.0, 8.0, 0.05, "test")


def served(rows: list[tuple[str | None, str, int, float, int, int]]) -> pl.DataFrame:
    """Rows of (conversation, replica, arrival offset s, duration s, prompt, completion)."""
    return pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(len(rows))],
            "conversation_id": [r[0] for r in rows],
            "replica": [r[1] for r in rows],
            "arrival_ts": [T0 + timedelta(seconds=r[2]) for r in rows],
            "end_ts": [T0 + timedelta(seconds=r[2] + r[3]) for r in rows],
            "prompt_tokens": [r[4] for r in rows],
            "completion_tokens": [r[5] for r in rows],
            "ok": [True] * len(rows),
            "ttft_s": [0.1] * len(rows),
        },
        schema_overrides={"arrival_ts": pl.Datetime("us"), "end_ts": pl.Datetime("us")},
    )


# Conversation a: three turns on one replica; b: two turns, the second moved replica; and a
# request no gateway named. Rows arrive out of order: the replay orders them.
ROWS = [
    ("a", "vllm-0", 40.0, 2.0, 1500, 30),
    ("b", "vllm-1", 5.0, 1.0, 300, 20),
    ("a", "vllm-0", 0.0, 3.0, 1000, 100),
    ("a", "vllm-0", 20.0, 4.0, 1200, 50),
    ("b", "vllm-2", 16.0, 1.0, 400, 10),
    (None, "vllm-1", 8.0, 1.0, 700, 70),
]


def test_a_prompt_computes_what_the_turn_before_on_its_replica_does_not_cover() -> None:
    # a's second turn reuses 1000 + 100 of its 1200, its third 1200 + 50 of 1500; b's second
    # moved replica and computes all 400; the unnamed request all 700.
    computed = without_continued_prefix(served(ROWS)).sort("request_id")
    assert computed.get_column("prompt_tokens").to_list() == [250, 300, 1000, 100, 400, 700]
    assert without_continued_prefix(served(ROWS).drop("conversation_id")).equals(
        served(ROWS).drop("conversation_id")
    )


def test_recorded_conversations_are_the_one_replay_with_the_cache_on() -> None:
    (replay,) = replays(FIT, served(ROWS), hit_ratio=None, seed=1)
    assert replay.prefill is PrefillShape.CONVERSATIONS
    assert sorted(replay.mix.conversations) == [
        ((300, 20, 0.0), (400, 10, 10.0)),
        ((1000, 100, 0.0), (1200, 50, 17.0), (1500, 30, 16.0)),
    ]
    # Too few first turns to measure prefill on: the fitted step as it is (per computed token).
    assert replay.first_turn_prefill is None
    assert replay.step == STEP
    assert engine_params(replay.step, limits=EngineParams(), mix=replay.mix).enable_prefix_caching
    plain = replays(FIT, served(ROWS).drop("conversation_id"), hit_ratio=None, seed=1)[0]
    assert plain.prefill is PrefillShape.SERVED
    assert not engine_params(plain.step, limits=EngineParams(), mix=plain.mix).enable_prefix_caching


def test_single_turn_requests_replay_as_shapes() -> None:
    rows = [(f"c{i}", "vllm-0", float(i), 1.0, 100 + i, 10) for i in range(40)]
    found = replays(FIT, served(rows), hit_ratio=None, seed=1)
    assert PrefillShape.CONVERSATIONS not in {r.prefill for r in found}


def first_turn_rows(cost_s: float, *, conversations: int) -> pl.DataFrame:
    """Conversations of two turns; a first turn's prefill is 5 ms plus `cost_s` a prompt
    token, a follow-up's far less (its history was cached)."""
    rows = []
    for c in range(conversations):
        prompt = 200 + 37 * (c % 50)
        start = 30.0 * c
        rows += [
            (f"c{c}", "vllm-0", start, 1.0, prompt, 20, 0.005 + cost_s * prompt),
            (f"c{c}", "vllm-0", start + 5.0, 1.0, prompt + 100, 20, 0.005 + cost_s * 100),
        ]
    frame = served([r[:6] for r in rows])
    return frame.with_columns(prefill_s=pl.Series([r[6] for r in rows]), queue_s=pl.lit(0.0))


def test_the_cost_per_uncached_token_is_the_first_turns_slope() -> None:
    fit = fit_first_turn_prefill(first_turn_rows(4e-5, conversations=80), seed=1, resamples=8)
    assert fit is not None
    assert fit.per_token_s == pytest.approx(4e-5)
    assert len(fit.resampled) == 8
    # Conversations under way when the data starts are left out: the first 90th percentile
    # of a conversation's span (6 s) drops conversation c0 only.
    assert fit.first_turns == 79
    assert (
        fit_first_turn_prefill(first_turn_rows(4e-5, conversations=10), seed=1, resamples=8) is None
    )
    found = replays(FIT, first_turn_rows(4e-5, conversations=80), hit_ratio=None, seed=1)
    assert found[0].prefill is PrefillShape.CONVERSATIONS
    assert found[0].step.per_prefill_token_s == pytest.approx(4e-5)
    measured = found[0].first_turn_prefill
    assert measured is not None
    assert (measured.per_token_s, measured.first_turns) == (fit.per_token_s, fit.first_turns)


def check(*, simulated: float | None, observed: float | None) -> ModelCheck:
    return ModelCheck(
        PrefillShape.CONVERSATIONS, 1.0, 0.95, 0.95, 0.1, 0.1, 0.2, 0.2, 0.03, 0.03, 0.0,
        simulated_hit_ratio=simulated, observed_hit_ratio=observed,
    )  # fmt: skip


def test_a_hit_shortfall_against_the_scraped_ratio_becomes_a_shared_prefix() -> None:
    mix = replays(FIT, served(ROWS), hit_ratio=None, seed=1)[0].mix
    # Conversations hold 3700 and 700 prompt tokens (2200 a conversation); the median first
    # prompt (the upper of 300 and 1000) caps what can be shared.
    assert shared_prefix_tokens(mix, check(simulated=0.6, observed=0.7)) == 220
    assert shared_prefix_tokens(mix, check(simulated=0.2, observed=0.9)) == 1000
    assert shared_prefix_tokens(mix, check(simulated=0.695, observed=0.7)) == 0
    assert shared_prefix_tokens(mix, check(simulated=0.6, observed=None)) == 0
