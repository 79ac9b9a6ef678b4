"""Clients that retry: a request refused or failed is sent again after a backoff, a bounded
number of times, under its own identity.

`RetryingClients` wraps a `RequestSource`. When the fleet reports a request refused (no
replica up or free, the gateway's admission limit) or failed (an error, an abort when its
replica went down), the client sends the same request again (same `request_id`, so a retried
request counts once among useful completions) after `backoff_s x multiplier^attempt`, jittered
by up to `jitter_ratio` either way and never sooner than the gateway's retry-after for a shed
request. After `max_retries` retries, or on success, the wrapped source hears the final outcome
(a conversation goes on, or its user gives up).

Every attempt's end is logged (`attempts`): what a drill needs to measure the effective
arrival rate, the retries and the useful completions, none of which the fleet's own records
show for refused attempts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

from servewatch.emulator.forwarding_source import ForwardingSource
from servewatch.emulator.workload import RequestSource, RequestSpec, SpecError


@dataclass(frozen=True)
class RetryPolicy:
    """How clients retry; the default sends every request once."""

    max_retries: int = 0
    backoff_s: float = 1.0
    multiplier: float = 2.0
    jitter_ratio: float = 0.2
    retry_after_s: float = 0.0  # the gateway's retry-after for shed requests

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise SpecError("max_retries", f"must be >= 0, got {self.max_retries}")
        if not self.backoff_s >= 0:
            raise SpecError("backoff_s", f"must be >= 0 seconds, got {self.backoff_s}")
        if not self.multiplier >= 1.0:
            raise SpecError("multiplier", f"must be >= 1, got {self.multiplier}")
        if not 0.0 <= self.jitter_ratio < 1.0:
            raise SpecError("jitter_ratio", f"must be in [0, 1), got {self.jitter_ratio}")
        if not self.retry_after_s >= 0:
            raise SpecError("retry_after_s", f"must be >= 0 seconds, got {self.retry_after_s}")


class AttemptOutcome(Enum):
    SERVED = "served"  # a replica finished it (the SLO judges its latencies)
    FAILED = "failed"  # a replica failed or aborted it
    REFUSED = "refused"  # no replica saw it: shed at the gateway, or nothing up or free


@dataclass(frozen=True, slots=True)
class Attempt:
    request_id: str
    attempt: int  # 0 for the first send
    arrival_s: float
    end_s: float
    outcome: AttemptOutcome
    retry_at_s: float | None  # when the client sends it again; None: it does not


class RetryingClients(ForwardingSource):
    """A `RequestSource` whose clients retry refused and failed requests (module docstring)."""

    def __init__(self, source: RequestSource, policy: RetryPolicy, *, seed: int) -> None:
        super().__init__(source)
        self._policy = policy
        self._rng = random.Random(f"{seed}:retries")  # noqa: S311 (simulation, not secrets)
        self._tries: dict[str, int] = {}
        self.attempts: list[Attempt] = []

    def follow_up(
        self,
        finished: RequestSpec,
        *,
        completion_tokens: int,
        end_s: float,
        ok: bool,
        refused: bool = False,
    ) -> RequestSpec | None:
        policy = self._policy
        tried = self._tries.get(finished.request_id, 0)
        retry = not ok and tried < policy.max_retries
        outcome = (
            AttemptOutcome.SERVED
            if ok
            else AttemptOutcome.REFUSED
            if refused
            else AttemptOutcome.FAILED
        )
        if retry:
            self._tries[finished.request_id] = tried + 1
            wait_s = policy.backoff_s * policy.multiplier**tried
            wait_s *= 1.0 + policy.jitter_ratio * (2.0 * self._rng.random() - 1.0)
            if refused:
                wait_s = max(wait_s, policy.retry_after_s)
            self.attempts.append(
                Attempt(
                    finished.request_id, tried, finished.arrival_s, end_s, outcome, end_s + wait_s
                )
            )
            return finished._replace(arrival_s=end_s + wait_s)
        self.attempts.append(
            Attempt(finished.request_id, tried, finished.arrival_s, end_s, outcome, None)
        )
        self._tries.pop(finished.request_id, None)
        return super().follow_up(
            finished, completion_tokens=completion_tokens, end_s=end_s, ok=ok, refused=refused
        )
