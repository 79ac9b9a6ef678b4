"""Conversation turns: the conversations a pool's requests made, when their spans name them.

A gateway or client that tracks sessions names each request's conversation
(`gen_ai.conversation.id`, or `session.id`); vLLM's own spans do not. With it, the requests of
one conversation are its turns in arrival order: each turn's prompt holds the history so far,
and a turn served on the replica of the turn before can find that history in its prefix cache.

The data starts in the middle of some conversations: their first turn seen is a later one,
with a long prompt and a history cached before the window. Where first turns must be first
(prefill's cost is measured on them) those are left out: a conversation counts when its first
turn arrived after most conversations would have run their course from the start of the data
(the 90th percentile of a conversation's span, first arrival to last end), unless that leaves
fewer than `MIN_CONVERSATIONS` (a short window keeps them all). A replay keeps them: their
turns were load the fleet carried.
"""

from __future__ import annotations

import polars as pl

MIN_CONVERSATIONS = 30
_SECONDS = 1e6  # microseconds per second


def conversation_turns(served: pl.DataFrame, *, begun_inside: bool = False) -> pl.DataFrame:
    """The turns of the conversations in `served` (requests with `conversation_id`,
    `arrival_ts`, `end_ts`): those rows in conversation and arrival order with `turn` (0 for
    the first) and `think_s` (from the end of the turn before, 0 for the first); with
    `begun_inside`, only for conversations begun inside the data (module docstring). Empty
    without conversation ids."""
    if "conversation_id" not in served.columns:
        return served.clear().with_columns(turn=pl.lit(0, pl.UInt32), think_s=pl.lit(0.0))
    by = "conversation_id"
    turns = (
        served.filter(pl.col(by).is_not_null())
        .sort(by, "arrival_ts", "prompt_tokens", nulls_last=True)
        .with_columns(
            turn=pl.int_range(pl.len(), dtype=pl.UInt32).over(by),
            think_s=(
                (pl.col("arrival_ts") - pl.col("end_ts").shift(1).over(by)).dt.total_microseconds()
                / _SECONDS
            )
            .fill_null(0.0)
            .clip(lower_bound=0.0),
        )
    )
    spans = turns.group_by(by).agg(
        begun=pl.col("arrival_ts").min(),
        span_s=(pl.col("end_ts").max() - pl.col("arrival_ts").min()).dt.total_microseconds()
        / _SECONDS,
    )
    if spans.height == 0 or not begun_inside:
        return turns
    lead_s = float(spans.get_column("span_s").quantile(0.9, interpolation="nearest") or 0.0)
    start = spans.get_column("begun").min()
    inside = spans.filter(
        pl.col("begun") >= pl.lit(start) + pl.duration(microseconds=round(lead_s * _SECONDS))
    )
    if inside.height < MIN_CONVERSATIONS:
        return turns
    return turns.join(inside.select(by), on=by, how="semi", maintain_order="left")


def _continued_tokens() -> pl.Expr:
    """Per request (sorted by conversation and arrival): the prompt tokens its conversation's
    turn before (prompt and answer) covers when it ran on the same replica, else 0."""
    by = "conversation_id"
    kept = pl.col(by).is_not_null() & (pl.col("replica") == pl.col("replica").shift(1).over(by))
    context = (pl.col("prompt_tokens") + pl.col("completion_tokens").fill_null(0)).shift(1).over(by)
    return pl.when(kept).then(pl.min_horizontal(context, pl.col("prompt_tokens"))).otherwise(0)


def _by_conversation(served: pl.DataFrame) -> pl.DataFrame:
    return served.sort("conversation_id", "arrival_ts", "prompt_tokens", nulls_last=True)


def without_continued_prefix(requests: pl.DataFrame) -> pl.DataFrame:
    """`requests` with each prompt less what the turn before on its replica covers (at least
    one token left): the prompt tokens its prefill most likely computed. An estimate: a
    system prompt shared across conversations, or history kept from an older turn, is still
    counted as computed."""
    if "conversation_id" not in requests.columns:
        return requests
    return _by_conversation(requests).with_columns(
        prompt_tokens=(pl.col("prompt_tokens") - _continued_tokens()).clip(lower_bound=1)
    )
