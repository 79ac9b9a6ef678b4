"""A sampled workload: request shapes, or whole conversations, drawn from what a fleet served.

What a capacity model replays. Without conversations: the prompt and answer lengths a fleet
actually served (jointly, as pairs, so a long prompt keeps its own answer length), drawn with
replacement as a Poisson stream at a rate the search chooses. Each request answers exactly its
drawn length; none carries a cached prefix, so prefill costs what the engine's per-token rate
says (a rate fitted from served requests already counts the cache hits they had).

With conversations (the spans named the conversation each request belonged to): whole
conversations are drawn instead, started as a Poisson stream at the rate over the mean turns,
each follow-up its recorded think time after the previous turn ended, with its recorded prompt
and answer lengths, under the conversation's prefix chain (a turn shares with the one before
as much of its prompt as the earlier prompt and answer cover). The engine's prefix
cache then decides which follow-ups hit, so a router that spills conversations off their
replicas as load grows loses its hits in the replay as it would in the fleet.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

from servewatch.emulator.workload import PrefixSegment, RequestSpec, SpecError


@dataclass(frozen=True)
class SampledMix:
    """Request shapes (prompt tokens, completion tokens) to draw from; with `conversations`,
    the conversations those requests made, each a tuple of (prompt tokens, completion tokens,
    think time s since the previous turn ended, 0 for the first) per turn, replayed instead."""

    shapes: tuple[tuple[int, int], ...]
    conversations: tuple[tuple[tuple[int, int, float], ...], ...] = ()
    # Prompt tokens every replayed conversation opens with, shared by all (a system prompt);
    # conversations whose first prompt is not longer do without.
    shared_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.shapes:
            raise SpecError("shapes", "needs at least one (prompt, completion) pair")
        for i, (prompt, completion) in enumerate(self.shapes):
            if prompt < 1 or completion < 1:
                raise SpecError(
                    f"shapes[{i}]", f"tokens must be >= 1, got ({prompt}, {completion})"
                )
        if self.shared_prefix_tokens < 0:
            raise SpecError(
                "shared_prefix_tokens", f"must be >= 0, got {self.shared_prefix_tokens}"
            )
        for i, turns in enumerate(self.conversations):
            if not turns:
                raise SpecError(f"conversations[{i}]", "needs at least one turn")
            for k, (prompt, completion, think_s) in enumerate(turns):
                if prompt < 1 or completion < 1 or not think_s >= 0:
                    raise SpecError(
                        f"conversations[{i}][{k}]",
                        "tokens must be >= 1 and the think time >= 0, got "
                        f"({prompt}, {completion}, {think_s})",
                    )

    @property
    def replays_prefixes(self) -> bool:
        """True when requests carry their conversation's prefix chain (the engine's cache is
        then what decides the hits); False when the cache's savings are in the cost."""
        return bool(self.conversations)

    @property
    def turns_mean(self) -> float:
        if not self.conversations:
            return 1.0
        return sum(len(turns) for turns in self.conversations) / len(self.conversations)

    @property
    def completion_tokens_mean(self) -> float:
        return sum(c for _, c in self.shapes) / len(self.shapes)

    @functools.cached_property
    def think_s_p90(self) -> float:
        """The think time of a conversation between its turns, in all: its 90th percentile
        over the conversations (how long most take to reach their last turn), 0 without."""
        totals = sorted(sum(t for _, _, t in turns) for turns in self.conversations)
        return totals[max(0, math.ceil(0.9 * len(totals)) - 1)] if totals else 0.0

    def source(
        self, rate_rps: float, *, seed: int, start_s: float, until_s: float
    ) -> SampledSource | ConversationSource:
        if self.conversations:
            return ConversationSource(
                self, rate_rps=rate_rps, seed=seed, start_s=start_s, until_s=until_s
            )
        return SampledSource(self, rate_rps=rate_rps, seed=seed, start_s=start_s, until_s=until_s)


SHARED_PREFIX_KEY = "replayed-shared"


class SampledSource:
    """Poisson arrivals from `start_s` to `until_s`, each a shape drawn from the mix."""

    def __init__(
        self, mix: SampledMix, *, rate_rps: float, seed: int, start_s: float, until_s: float
    ) -> None:
        if not rate_rps > 0:
            raise SpecError("rate_rps", f"must be > 0, got {rate_rps}")
        self._shapes = mix.shapes
        self._rng = random.Random(f"{seed}:sampled")  # noqa: S311 (simulation, not secrets)
        self._rate_rps = rate_rps
        self._t_s = start_s
        self._until_s = until_s
        self._count = 0

    def next_arrival(self) -> RequestSpec | None:
        self._t_s += self._rng.expovariate(self._rate_rps)
        if self._t_s >= self._until_s:
            return None
        prompt, completion = self._shapes[self._rng.randrange(len(self._shapes))]
        self._count += 1
        return RequestSpec(
            f"sampled-{self._count}", self._t_s, prompt, completion, completion, None, None, ()
        )

    def follow_up(
        self,
        finished: RequestSpec,
        *,
        completion_tokens: int,
        end_s: float,
        ok: bool,
        refused: bool = False,
    ) -> RequestSpec | None:
        return None


@dataclass(slots=True)
class _Replaying:
    turns: tuple[tuple[int, int, float], ...]
    next_turn: int  # index of the turn after the one in flight
    shared: PrefixSegment | None  # the prefix all conversations share, when this one has it


class ConversationSource:
    """Conversations started as a Poisson stream (`rate_rps` over the mean turns, so requests
    arrive at about `rate_rps` once follow-ups are flowing) from `start_s` to `until_s`; each
    follow-up arrives its think time after the previous turn ended, and not after a failure
    (a user whose request failed abandons the conversation, as the synthetic workload's do)."""

    def __init__(
        self, mix: SampledMix, *, rate_rps: float, seed: int, start_s: float, until_s: float
    ) -> None:
        if not rate_rps > 0:
            raise SpecError("rate_rps", f"must be > 0, got {rate_rps}")
        self._conversations = mix.conversations
        shared = mix.shared_prefix_tokens
        self._shared = PrefixSegment(SHARED_PREFIX_KEY, shared) if shared else None
        self._rng = random.Random(f"{seed}:conversations")  # noqa: S311 (not secrets)
        self._rate_rps = rate_rps / mix.turns_mean
        self._t_s = start_s
        self._until_s = until_s
        self._started = 0
        self._requests = 0
        self._active: dict[str, _Replaying] = {}

    def _request(self, conversation_id: str, state: _Replaying, arrival_s: float) -> RequestSpec:
        prompt, completion, _ = state.turns[state.next_turn]
        state.next_turn += 1
        self._requests += 1
        own = PrefixSegment(conversation_id, prompt)
        return RequestSpec(
            f"replayed-{self._requests}",
            arrival_s,
            prompt,
            completion,
            completion,
            None,
            conversation_id,
            (own,) if state.shared is None else (state.shared, own),
            True,  # the answer continues the conversation's prefix chain
        )

    def next_arrival(self) -> RequestSpec | None:
        self._t_s += self._rng.expovariate(self._rate_rps)
        if self._t_s >= self._until_s:
            return None
        self._started += 1
        conversation_id = f"replayed-conv-{self._started}"
        turns = self._conversations[self._rng.randrange(len(self._conversations))]
        shared = self._shared
        state = _Replaying(turns, 0, shared if shared and turns[0][0] > shared.end_tokens else None)
        if len(turns) > 1:
            self._active[conversation_id] = state
        return self._request(conversation_id, state, self._t_s)

    def follow_up(
        self,
        finished: RequestSpec,
        *,
        completion_tokens: int,
        end_s: float,
        ok: bool,
        refused: bool = False,
    ) -> RequestSpec | None:
        conversation_id = finished.conversation_id
        state = None if conversation_id is None else self._active.get(conversation_id)
        if state is None or conversation_id is None:
            return None
        if not ok or state.next_turn >= len(state.turns):
            del self._active[conversation_id]
            return None
        arrival_s = end_s + state.turns[state.next_turn][2]
        if state.next_turn + 1 >= len(state.turns):
            del self._active[conversation_id]
        return self._request(conversation_id, state, arrival_s)
