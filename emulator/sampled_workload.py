"""A sampled workload: request shapes drawn from a list, arriving as a Poisson stream.

What a capacity model replays: the prompt and answer lengths a fleet actually served (jointly,
as pairs, so a long prompt keeps its own answer length), drawn with replacement at a rate the
search chooses. Each request answers exactly its drawn length; none carries a cached prefix, so
prefill costs what the engine's per-token rate says (a rate fitted from served requests already
counts the cache hits they had).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from emulator.workload import RequestSpec, SpecError


@dataclass(frozen=True)
class SampledMix:
    """Request shapes (prompt tokens, completion tokens) to draw from."""

    shapes: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.shapes:
            raise SpecError("shapes", "needs at least one (prompt, completion) pair")
        for i, (prompt, completion) in enumerate(self.shapes):
            if prompt < 1 or completion < 1:
                raise SpecError(
                    f"shapes[{i}]", f"tokens must be >= 1, got ({prompt}, {completion})"
                )

    def source(
        self, rate_rps: float, *, seed: int, start_s: float, until_s: float
    ) -> SampledSource:
        return SampledSource(self, rate_rps=rate_rps, seed=seed, start_s=start_s, until_s=until_s)


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
