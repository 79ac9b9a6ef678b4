"""A request source that forwards to another: the base of the wrappers that change one part of
a stream (clients that retry, a ramped rate, a merged backlog, a log of what was sent)."""

from __future__ import annotations

from servewatch.emulator.workload import RequestSource, RequestSpec


class ForwardingSource:
    """Everything goes to `source`; a wrapper overrides what it changes."""

    def __init__(self, source: RequestSource) -> None:
        self._source = source

    def next_arrival(self) -> RequestSpec | None:
        return self._source.next_arrival()

    def follow_up(
        self,
        finished: RequestSpec,
        *,
        completion_tokens: int,
        end_s: float,
        ok: bool,
        refused: bool = False,
    ) -> RequestSpec | None:
        return self._source.follow_up(
            finished, completion_tokens=completion_tokens, end_s=end_s, ok=ok, refused=refused
        )
