"""The workload an emulated fleet serves: arrivals, lengths, conversations and tenants.

A workload is a source of `RequestSpec`s. Synthetic workloads start conversations at the
times of an arrival process (Poisson, diurnal or a step schedule) and sample every length
and think time of a conversation when it starts, so the random streams a seed drives do not
depend on what the simulation does with the requests. Follow-up turns are closed-loop: turn
k+1 arrives a think time after turn k finished, and its prompt is the whole history so far
(system prompt, earlier messages and answers) plus a new message. Replayed traces are
open-loop: every row arrives at its recorded offset.

Prefix caching sees a request as a chain of segments, each a key and the prompt position
where the segment ends (`PrefixSegment`): a tenant's system prompt, then the conversation's
history. Two requests share cached blocks exactly as far as their chains agree.

Size: over 500 lines on purpose: the arrival processes, length distributions and conversation
sources share the seeded random streams, whose draw order every fixture's reproducibility
depends on.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import NamedTuple, Protocol

from servewatch.emulator.trace_replay import TraceFormat, TraceRecord, read_trace

SECONDS_PER_DAY = 86_400.0


class SpecError(ValueError):
    """A field of a spec holds a value it does not allow; `field` names it."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


def _require(condition: bool, field_name: str, reason: str) -> None:
    if not condition:
        raise SpecError(field_name, reason)


class DistributionKind(Enum):
    FIXED = "fixed"
    UNIFORM = "uniform"
    LOGNORMAL = "lognormal"
    EXPONENTIAL = "exponential"


@dataclass(frozen=True)
class Distribution:
    """A distribution of a positive quantity (tokens or seconds), clamped to [min, max].

    fixed: always `value`; uniform: `low`..`high`; lognormal: median `median`, log-space
    standard deviation `sigma`; exponential: mean `mean`.
    """

    kind: DistributionKind
    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    median: float = 0.0
    sigma: float = 0.0
    mean: float = 0.0
    min_value: float = 0.0
    max_value: float = math.inf

    def __post_init__(self) -> None:
        match self.kind:
            case DistributionKind.FIXED:
                _require(self.value >= 0, "value", f"must be >= 0, got {self.value}")
            case DistributionKind.UNIFORM:
                _require(self.low >= 0, "low", f"must be >= 0, got {self.low}")
                _require(self.high >= self.low, "high", f"must be >= low, got {self.high}")
            case DistributionKind.LOGNORMAL:
                _require(self.median > 0, "median", f"must be > 0, got {self.median}")
                _require(self.sigma >= 0, "sigma", f"must be >= 0, got {self.sigma}")
            case DistributionKind.EXPONENTIAL:
                _require(self.mean > 0, "mean", f"must be > 0, got {self.mean}")
        _require(self.min_value >= 0, "min", f"must be >= 0, got {self.min_value}")
        _require(self.max_value >= self.min_value, "max", f"must be >= min, got {self.max_value}")

    @classmethod
    def fixed(cls, value: float) -> Distribution:
        return cls(DistributionKind.FIXED, value=value)

    @classmethod
    def lognormal(
        cls, median: float, sigma: float, *, min_value: float = 0.0, max_value: float = math.inf
    ) -> Distribution:
        return cls(
            DistributionKind.LOGNORMAL,
            median=median,
            sigma=sigma,
            min_value=min_value,
            max_value=max_value,
        )

    def typical(self) -> float:
        """The mean before clamping, clamped: what a typical draw is near (a lognormal's long
        tail is cut by its max, which this ignores)."""
        match self.kind:
            case DistributionKind.FIXED:
                x = self.value
            case DistributionKind.UNIFORM:
                x = (self.low + self.high) / 2.0
            case DistributionKind.LOGNORMAL:
                x = self.median * math.exp(self.sigma**2 / 2.0)
            case DistributionKind.EXPONENTIAL:
                x = self.mean
        return min(max(x, self.min_value), self.max_value)

    def sample(self, rng: random.Random) -> float:
        match self.kind:
            case DistributionKind.FIXED:
                x = self.value
            case DistributionKind.UNIFORM:
                x = rng.uniform(self.low, self.high)
            case DistributionKind.LOGNORMAL:
                x = self.median * math.exp(self.sigma * rng.gauss())
            case DistributionKind.EXPONENTIAL:
                x = rng.expovariate(1.0 / self.mean)
        return min(max(x, self.min_value), self.max_value)

    def sample_tokens(self, rng: random.Random) -> int:
        """A token count: the sample rounded, at least 1."""
        return max(1, round(self.sample(rng)))

    def sampler(self, rng: random.Random) -> Callable[[], float]:
        """`sample(rng)` as a closure with its constants bound; draws the same values."""
        lo, hi = self.min_value, self.max_value
        match self.kind:
            case DistributionKind.LOGNORMAL:
                gauss, exp, median, sigma = rng.gauss, math.exp, self.median, self.sigma

                def lognormal() -> float:
                    x = median * exp(sigma * gauss())
                    return lo if x < lo else hi if x > hi else x

                return lognormal
            case DistributionKind.EXPONENTIAL:
                expovariate, rate = rng.expovariate, 1.0 / self.mean

                def exponential() -> float:
                    x = expovariate(rate)
                    return lo if x < lo else hi if x > hi else x

                return exponential
            case _:
                return lambda: self.sample(rng)

    def token_sampler(self, rng: random.Random) -> Callable[[], int]:
        """`sample_tokens(rng)` as a closure; draws the same values."""
        if self.kind is DistributionKind.LOGNORMAL:
            gauss, exp, median, sigma = rng.gauss, math.exp, self.median, self.sigma
            lo, hi = self.min_value, self.max_value

            def lognormal_tokens() -> int:
                x = median * exp(sigma * gauss())
                n = round(lo if x < lo else hi if x > hi else x)
                return n if n > 1 else 1

            return lognormal_tokens
        draw = self.sampler(rng)

        def tokens() -> int:
            n = round(draw())
            return n if n > 1 else 1

        return tokens


class ArrivalKind(Enum):
    POISSON = "poisson"
    DIURNAL = "diurnal"  # Poisson with a rate following a 24 h cosine
    STEPS = "steps"  # Poisson with a piecewise-constant rate (steps and bursts)


@dataclass(frozen=True)
class RateStep:
    """From `at_s` seconds after the start on, requests arrive at `rate_rps`."""

    at_s: float
    rate_rps: float


@dataclass(frozen=True)
class ArrivalSpec:
    """How request arrivals are spread in time; rates count requests, follow-up turns included.

    diurnal: the rate swings between (2 - peak_to_mean_ratio) and peak_to_mean_ratio times
    `rate_rps`, peaking at `peak_hour_utc` every day. steps: `rate_rps` until the first step,
    then each step's rate from its time on.
    """

    kind: ArrivalKind = ArrivalKind.POISSON
    rate_rps: float = 6.0
    peak_to_mean_ratio: float = 1.5
    peak_hour_utc: float = 15.0
    steps: tuple[RateStep, ...] = ()

    def __post_init__(self) -> None:
        _require(self.rate_rps >= 0, "rate_rps", f"must be >= 0, got {self.rate_rps}")
        _require(
            1.0 <= self.peak_to_mean_ratio <= 2.0,
            "peak_to_mean_ratio",
            f"must be between 1 and 2, got {self.peak_to_mean_ratio}",
        )
        _require(
            0.0 <= self.peak_hour_utc < 24.0,
            "peak_hour_utc",
            f"must be in [0, 24), got {self.peak_hour_utc}",
        )
        previous = -math.inf
        for i, step in enumerate(self.steps):
            _require(step.at_s >= 0, f"steps[{i}].at_s", f"must be >= 0, got {step.at_s}")
            _require(
                step.at_s > previous,
                f"steps[{i}].at_s",
                f"steps must be in increasing time order, got {step.at_s} after {previous}",
            )
            _require(
                step.rate_rps >= 0, f"steps[{i}].rate_rps", f"must be >= 0, got {step.rate_rps}"
            )
            previous = step.at_s

    def rate_at(self, offset_s: float, *, start_s: float) -> float:
        """The request rate `offset_s` seconds after `start_s` (a Unix time)."""
        match self.kind:
            case ArrivalKind.POISSON:
                return self.rate_rps
            case ArrivalKind.DIURNAL:
                hours = ((start_s + offset_s) % SECONDS_PER_DAY) / 3600.0
                swing = math.cos(2 * math.pi * (hours - self.peak_hour_utc) / 24.0)
                return self.rate_rps * (1.0 + (self.peak_to_mean_ratio - 1.0) * swing)
            case ArrivalKind.STEPS:
                i = bisect.bisect_right([s.at_s for s in self.steps], offset_s)
                return self.rate_rps if i == 0 else self.steps[i - 1].rate_rps

    def scaled(self, factor: float) -> ArrivalSpec:
        """The same shape with every rate multiplied by `factor`."""
        return ArrivalSpec(
            kind=self.kind,
            rate_rps=self.rate_rps * factor,
            peak_to_mean_ratio=self.peak_to_mean_ratio,
            peak_hour_utc=self.peak_hour_utc,
            steps=tuple(RateStep(s.at_s, s.rate_rps * factor) for s in self.steps),
        )


def next_arrival_offset(
    spec: ArrivalSpec, after_s: float, rng: random.Random, *, start_s: float
) -> float:
    """The next arrival (seconds after start) of a Poisson process with spec's rate; inf if none.

    Piecewise-constant rates are inverted exactly (an exponential amount of "rate x time" is
    walked across the steps); the diurnal rate is sampled by thinning at its peak rate.
    """
    match spec.kind:
        case ArrivalKind.POISSON:
            if spec.rate_rps <= 0:
                return math.inf
            return after_s + rng.expovariate(spec.rate_rps)
        case ArrivalKind.DIURNAL:
            peak = spec.rate_rps * spec.peak_to_mean_ratio
            if peak <= 0:
                return math.inf
            t = after_s
            while True:
                t += rng.expovariate(peak)
                if rng.random() * peak <= spec.rate_at(t, start_s=start_s):
                    return t
        case ArrivalKind.STEPS:
            work = rng.expovariate(1.0)
            t = after_s
            i = bisect.bisect_right([s.at_s for s in spec.steps], t)
            while True:
                rate = spec.rate_rps if i == 0 else spec.steps[i - 1].rate_rps
                end = spec.steps[i].at_s if i < len(spec.steps) else math.inf
                if rate > 0 and rate * (end - t) >= work:
                    return t + work / rate
                if end == math.inf:
                    return math.inf
                work -= rate * (end - t)
                t = end
                i += 1


def arrival_clock(
    spec: ArrivalSpec, rng: random.Random, *, start_s: float
) -> Callable[[float], float]:
    """`next_arrival_offset` for one spec and rng as a closure; draws the same values."""
    if spec.kind is ArrivalKind.POISSON and spec.rate_rps > 0:
        expovariate, rate = rng.expovariate, spec.rate_rps
        return lambda after_s: after_s + expovariate(rate)
    if spec.kind is ArrivalKind.DIURNAL and spec.rate_rps > 0:
        expovariate, uniform, cos = rng.expovariate, rng.random, math.cos
        mean, swing = spec.rate_rps, spec.peak_to_mean_ratio - 1.0
        peak = mean * spec.peak_to_mean_ratio
        radians_per_s = 2 * math.pi / SECONDS_PER_DAY
        phase = start_s - spec.peak_hour_utc * 3600.0

        def diurnal(after_s: float) -> float:
            t = after_s
            while True:
                t += expovariate(peak)
                if uniform() * peak <= mean * (1.0 + swing * cos(radians_per_s * (t + phase))):
                    return t

        return diurnal
    return lambda after_s: next_arrival_offset(spec, after_s, rng, start_s=start_s)


@dataclass(frozen=True)
class TenantSpec:
    """A tenant: its share of conversations and the system prompt all its requests start with."""

    name: str
    weight: float = 1.0
    system_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        _require(bool(self.name), "name", "must not be empty")
        _require(self.weight > 0, "weight", f"must be > 0, got {self.weight}")
        _require(
            self.system_prompt_tokens >= 0,
            "system_prompt_tokens",
            f"must be >= 0, got {self.system_prompt_tokens}",
        )


@dataclass(frozen=True)
class ConversationSpec:
    """Turns per conversation are geometric with mean `turns_mean`; think time per turn."""

    turns_mean: float = 1.0
    think_time_s: Distribution = field(
        default_factory=lambda: Distribution.lognormal(20.0, 0.8, max_value=600.0)
    )

    def __post_init__(self) -> None:
        _require(self.turns_mean >= 1.0, "turns_mean", f"must be >= 1, got {self.turns_mean}")


@dataclass(frozen=True)
class ReplaySpec:
    """A recorded trace to replay instead of synthetic arrivals.

    Offsets are divided by `speedup`; `tenant` is given to every replayed request.
    """

    path: Path
    format: TraceFormat
    speedup: float = 1.0
    tenant: str | None = None

    def __post_init__(self) -> None:
        _require(self.speedup > 0, "speedup", f"must be > 0, got {self.speedup}")


@dataclass(frozen=True)
class WorkloadSpec:
    """What clients send: arrivals, message and answer lengths, conversations, tenants.

    `user_tokens` is the length of each new user message; a first turn's prompt is the
    tenant's system prompt plus one message. `output_tokens` is how long the model's answer
    would be; `max_tokens` caps it (the request then ends with finished_reason=length). A
    conversation ends early when its next prompt would pass `max_context_tokens`.
    """

    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    user_tokens: Distribution = field(
        default_factory=lambda: Distribution.lognormal(400.0, 0.9, min_value=4, max_value=6000)
    )
    output_tokens: Distribution = field(
        default_factory=lambda: Distribution.lognormal(150.0, 0.9, min_value=1, max_value=4000)
    )
    max_tokens: int = 1024
    conversation: ConversationSpec = field(default_factory=ConversationSpec)
    tenants: tuple[TenantSpec, ...] = (TenantSpec("default"),)
    max_context_tokens: int = 12_000
    replay: ReplaySpec | None = None

    def __post_init__(self) -> None:
        _require(self.max_tokens >= 1, "max_tokens", f"must be >= 1, got {self.max_tokens}")
        _require(bool(self.tenants), "tenants", "needs at least one tenant")
        names = [t.name for t in self.tenants]
        _require(len(set(names)) == len(names), "tenants", f"names must be unique, got {names}")
        _require(
            self.max_context_tokens >= 2,
            "max_context_tokens",
            f"must be >= 2, got {self.max_context_tokens}",
        )

    def with_rate(self, rate_rps: float) -> WorkloadSpec:
        """The same mix arriving as a Poisson stream of `rate_rps` requests per second."""
        return WorkloadSpec(
            arrival=ArrivalSpec(kind=ArrivalKind.POISSON, rate_rps=rate_rps),
            user_tokens=self.user_tokens,
            output_tokens=self.output_tokens,
            max_tokens=self.max_tokens,
            conversation=self.conversation,
            tenants=self.tenants,
            max_context_tokens=self.max_context_tokens,
            replay=None,
        )


# PrefixSegment and RequestSpec are built once per request on the simulation's hot path; as
# named tuples they are immutable like frozen dataclasses and several times cheaper to build.
class PrefixSegment(NamedTuple):
    """Prompt tokens [previous segment's end, end_tokens) belong to the prefix chain `key`."""

    key: str
    end_tokens: int


class RequestSpec(NamedTuple):
    """One request as the client sends it. `output_tokens` is where the answer would stop."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    tenant: str | None
    conversation_id: str | None
    prefix: tuple[PrefixSegment, ...]
    # True when the answer continues the last prefix chain (a conversation's history), so the
    # answer's blocks are cached under that chain for the next turn.
    answer_extends_prefix: bool = False


class RequestSource(Protocol):
    """Where a simulation's requests come from, in arrival order."""

    def next_arrival(self) -> RequestSpec | None:
        """The next open-loop arrival (non-decreasing times), None when there are no more."""
        ...

    def follow_up(
        self,
        finished: RequestSpec,
        *,
        completion_tokens: int,
        end_s: float,
        ok: bool,
        refused: bool = False,
    ) -> RequestSpec | None:
        """The next turn after `finished` ended at `end_s`, None when the conversation is over.
        `ok` is False for a failed request; `refused` says no replica saw it (the fleet
        turned it away: no replica up or free, the gateway's admission limit, too long)."""
        ...


@dataclass(slots=True)
class _Conversation:
    conversation_id: str
    tenant: TenantSpec
    system: PrefixSegment | None  # the tenant's system prompt, shared by its conversations
    # (new message tokens, answer tokens, think time before this turn) per remaining turn
    turns: list[tuple[int, int, float]]
    history_tokens: int


class SyntheticWorkload:
    """A `RequestSource` drawing conversations from a `WorkloadSpec` with seeded randomness."""

    def __init__(
        self,
        spec: WorkloadSpec,
        *,
        seed: int,
        start_s: float,
        until_s: float = math.inf,
        id_prefix: str = "cmpl-",
    ) -> None:
        self._spec = spec
        self._start_s = start_s
        self._until_offset_s = until_s - start_s
        # Each concern draws from its own stream, so changing one leaves the others alone.
        self._arrival_rng = random.Random(f"{seed}:arrivals")  # noqa: S311 (not secrets)
        self._length_rng = random.Random(f"{seed}:lengths")  # noqa: S311 (not secrets)
        self._next_offset = arrival_clock(
            spec.arrival.scaled(1.0 / spec.conversation.turns_mean),
            self._arrival_rng,
            start_s=start_s,
        )
        self._offset_s = 0.0
        self._tenants = spec.tenants
        total = sum(t.weight for t in spec.tenants)
        running = 0.0
        self._tenant_cumulative: list[float] = []
        for tenant in spec.tenants:
            running += tenant.weight / total
            self._tenant_cumulative.append(running)
        self._systems = {
            t.name: PrefixSegment(f"system:{t.name}", t.system_prompt_tokens)
            if t.system_prompt_tokens
            else None
            for t in spec.tenants
        }
        self._id_prefix = id_prefix
        self._max_tokens = spec.max_tokens
        self._max_context_tokens = spec.max_context_tokens
        self._requests = 0
        self._conversations_started = 0
        self._active: dict[str, _Conversation] = {}
        rng = self._length_rng
        self._user_tokens = spec.user_tokens.token_sampler(rng)
        self._output_tokens = spec.output_tokens.token_sampler(rng)
        self._think_s = spec.conversation.think_time_s.sampler(rng)
        turns_mean = spec.conversation.turns_mean
        self._log_keep = math.log(1.0 - 1.0 / turns_mean) if turns_mean > 1.0 else 0.0

    def _draw_turns(self) -> list[tuple[int, int, float]]:
        user, output = self._user_tokens, self._output_tokens
        out = [(user(), output(), 0.0)]
        if self._log_keep:
            # Geometric number of turns with mean turns_mean.
            turns = 1 + int(math.log(1.0 - self._length_rng.random()) / self._log_keep)
            think = self._think_s
            out += [(user(), output(), think()) for _ in range(turns - 1)]
        return out

    def _request(self, conv: _Conversation, arrival_s: float) -> RequestSpec | None:
        message, answer, _ = conv.turns.pop(0)
        prompt = conv.history_tokens + message
        if prompt >= self._max_context_tokens:
            self._active.pop(conv.conversation_id, None)
            return None
        conv.history_tokens = prompt
        prefix: tuple[PrefixSegment, ...]
        if conv.system is not None:
            prefix = (conv.system, PrefixSegment(conv.conversation_id, prompt))
        else:
            prefix = (PrefixSegment(conv.conversation_id, prompt),)
        if conv.turns:
            self._active[conv.conversation_id] = conv
        else:
            self._active.pop(conv.conversation_id, None)
        self._requests += 1
        return RequestSpec(
            f"{self._id_prefix}{self._requests}",
            arrival_s,
            prompt,
            answer,
            self._max_tokens,
            conv.tenant.name,
            conv.conversation_id,
            prefix,
            True,  # the answer continues the conversation's prefix chain
        )

    def next_arrival(self) -> RequestSpec | None:
        while True:
            self._offset_s = self._next_offset(self._offset_s)
            if self._offset_s >= self._until_offset_s:
                return None
            self._conversations_started += 1
            pick = self._length_rng.random()
            tenant = self._tenants[
                min(
                    bisect.bisect_left(self._tenant_cumulative, pick),
                    len(self._tenants) - 1,
                )
            ]
            conv_id = f"conv-{self._conversations_started}"
            conv = _Conversation(
                conversation_id=conv_id,
                tenant=tenant,
                system=self._systems[tenant.name],
                turns=self._draw_turns(),
                history_tokens=tenant.system_prompt_tokens,
            )
            request = self._request(conv, self._start_s + self._offset_s)
            if request is not None:
                return request

    def follow_up(
        self,
        finished: RequestSpec,
        *,
        completion_tokens: int,
        end_s: float,
        ok: bool,
        refused: bool = False,
    ) -> RequestSpec | None:
        conv_id = finished.conversation_id
        if conv_id is None:
            return None
        conv = self._active.get(conv_id)
        if conv is None:
            return None
        if not ok:
            # A user whose request failed abandons the conversation.
            del self._active[conv_id]
            return None
        conv.history_tokens += completion_tokens
        think_s = conv.turns[0][2]
        return self._request(conv, end_s + think_s)

    @property
    def active_conversations(self) -> int:
        return len(self._active)


class ReplayWorkload:
    """A `RequestSource` replaying trace records; every row is its own single-turn request.

    Mooncake `hash_ids` become prefix segments (each id covers 512 prompt tokens), so rows
    sharing leading ids share cached blocks; Azure rows have no prefix information.
    """

    def __init__(
        self,
        records: Iterator[TraceRecord],
        *,
        start_s: float,
        speedup: float = 1.0,
        tenant: str | None = None,
        id_prefix: str = "cmpl-",
    ) -> None:
        self._records = records
        self._start_s = start_s
        self._speedup = speedup
        self._tenant = tenant
        self._id_prefix = id_prefix
        self._requests = 0

    @classmethod
    def from_spec(cls, spec: ReplaySpec, *, start_s: float) -> ReplayWorkload:
        return cls(
            read_trace(spec.path, spec.format),
            start_s=start_s,
            speedup=spec.speedup,
            tenant=spec.tenant,
        )

    def next_arrival(self) -> RequestSpec | None:
        record = next(self._records, None)
        if record is None:
            return None
        self._requests += 1
        request_id = f"{self._id_prefix}{self._requests}"
        if record.hash_ids:
            block = record.hash_block_tokens
            prefix = tuple(
                PrefixSegment(f"hash:{h}", min((i + 1) * block, record.prompt_tokens))
                for i, h in enumerate(record.hash_ids)
                if i * block < record.prompt_tokens
            )
        else:
            prefix = (PrefixSegment(request_id, record.prompt_tokens),)
        return RequestSpec(
            request_id=request_id,
            arrival_s=self._start_s + record.offset_s / self._speedup,
            prompt_tokens=record.prompt_tokens,
            output_tokens=record.output_tokens,
            max_tokens=record.output_tokens,
            tenant=self._tenant,
            conversation_id=None,
            prefix=prefix,
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


def request_source(
    spec: WorkloadSpec, *, seed: int, start_s: float, until_s: float = math.inf
) -> RequestSource:
    """The source a spec describes: its replay file when it names one, else synthetic."""
    if spec.replay is not None:
        return ReplayWorkload.from_spec(spec.replay, start_s=start_s)
    return SyntheticWorkload(spec, seed=seed, start_s=start_s, until_s=until_s)
