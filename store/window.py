"""Reading a window: every frame an analysis of [from, to) needs, each table read once."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl

from servewatch.pipeline.request_minutes import request_minutes
from servewatch.pipeline.window import (
    POINTS_LEAD,
    TimeSpan,
    Window,
    WindowQuery,
    points_bounds,
)
from servewatch.store.reads import Reads
from servewatch.store.rollups import REQUEST_MINUTES_VERSION, MinuteRollups


class WindowReads(Reads, MinuteRollups):
    """Reads a `Window` for the report, the SLI report and the detectors."""

    def current_request_minutes(
        self,
        requests: pl.LazyFrame,
        *,
        from_ts: datetime | None = None,
        to_ts: datetime | None = None,
    ) -> tuple[pl.LazyFrame, bool]:
        """`request_minutes` over [from_ts, to_ts), and whether the stored rollup served them.
        A store written without its rollup (requests stored since the last one, and a reader
        may not run it): the minutes are counted from `requests`, the same window's, as the
        rollup would count them."""
        if self.rollup_is_current("request_minutes", fingerprint=REQUEST_MINUTES_VERSION):
            return self.read_request_minutes(from_ts=from_ts, to_ts=to_ts), True
        return request_minutes(requests), False

    def read_window(
        self,
        *,
        from_ts: datetime | None = None,
        to_ts: datetime | None = None,
        points_before: timedelta = POINTS_LEAD,
        points_after: timedelta = timedelta(),
    ) -> Window:
        """Every frame of [from_ts, to_ts) an analysis reads, each table read once: the
        window's requests, minute rollups and scrapes, its points widened by `points_before`
        and `points_after` (both ends inclusive), every series and target, and the store's
        spans of points and requests."""
        points_from, points_to = points_bounds(
            from_ts, to_ts, before=points_before, after=points_after
        )
        stored_points, stored_requests = self.points_range(), self.requests_range()
        requests = self.read_requests(from_ts=from_ts, to_ts=to_ts).collect()
        minutes, current = self.current_request_minutes(
            requests.lazy(), from_ts=from_ts, to_ts=to_ts
        )
        return Window(
            from_ts=from_ts,
            to_ts=to_ts,
            points_from_ts=points_from,
            points_to_ts=points_to,
            requests=requests,
            request_minutes=minutes.collect(),
            request_minutes_current=current,
            slo_minutes=self.read_slo_minutes(from_ts=from_ts, to_ts=to_ts).collect(),
            points=self.read_points(
                from_ts=points_from,
                to_ts=None if points_to is None else points_to + timedelta(microseconds=1),
            ).collect(),
            series=self.read_series().collect(),
            targets=self.read_targets().collect(),
            scrapes=self.read_scrapes(from_ts=from_ts, to_ts=to_ts).collect(),
            stored_points=None if stored_points is None else TimeSpan(*stored_points),
            stored_requests=None if stored_requests is None else TimeSpan(*stored_requests),
        )

    def read_query(self, query: WindowQuery) -> Window:
        """`read_window` for a `WindowQuery` (what the local API is asked)."""
        return self.read_window(
            from_ts=query.from_ts,
            to_ts=query.to_ts,
            points_before=query.points_before,
            points_after=query.points_after,
        )
