"""A window of the store: every frame the analyses of one time window read, each read once.

The store fills it (`Store.read_window`), or the `run` service's local API does while the
service holds the store; the report, the SLI report and the health detectors are then pure
functions of it. Frames are in the store's order (requests by completion, points by series and
time); the `*_between` accessors cut them to a narrower range as the store's reads would.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from servewatch.pipeline.metric_sli import series_dimensions
from servewatch.pipeline.tables import (
    POINTS_SCHEMA,
    REQUEST_MINUTES_SCHEMA,
    REQUESTS_SCHEMA,
    SCRAPES_SCHEMA,
    SERIES_SCHEMA,
    SLO_MINUTES_SCHEMA,
    TARGETS_SCHEMA,
)

WINDOW_TABLES: dict[str, pl.Schema] = {
    "requests": REQUESTS_SCHEMA,
    "request_minutes": REQUEST_MINUTES_SCHEMA,
    "slo_minutes": SLO_MINUTES_SCHEMA,
    "points": POINTS_SCHEMA,
    "series": SERIES_SCHEMA,
    "targets": TARGETS_SCHEMA,
    "scrapes": SCRAPES_SCHEMA,
}
"""The frames of a window, by table, with their schemas."""

# How far before the window points are read by default: the first minute's counter increments
# need the sample before it.
POINTS_LEAD = timedelta(minutes=1)
_INSTANT = timedelta(microseconds=1)


@dataclass(frozen=True)
class TimeSpan:
    """First and last time of something stored (both inclusive)."""

    first: datetime
    last: datetime


@dataclass(frozen=True)
class Window:
    """[from_ts, to_ts) of the store (an open end: everything stored on that side).

    `requests`, `request_minutes`, `slo_minutes` and `scrapes` hold the window itself; `points`
    hold [points_from_ts, points_to_ts] (the window widened by what the analyses need around
    it, both ends inclusive); `series` and `targets` hold every row. `stored_points` and
    `stored_requests` are the whole store's spans (None when it holds none), which open-ended
    analyses default to. `request_minutes_current` is false when the stored rollup lagged the
    requests and the window's minutes were counted from its requests instead.
    """

    from_ts: datetime | None
    to_ts: datetime | None
    points_from_ts: datetime | None
    points_to_ts: datetime | None
    requests: pl.DataFrame
    request_minutes: pl.DataFrame
    slo_minutes: pl.DataFrame
    points: pl.DataFrame
    series: pl.DataFrame
    targets: pl.DataFrame
    scrapes: pl.DataFrame
    stored_points: TimeSpan | None
    stored_requests: TimeSpan | None
    request_minutes_current: bool = True

    def __post_init__(self) -> None:
        for table, schema in WINDOW_TABLES.items():
            frame: pl.DataFrame = getattr(self, table)
            if frame.schema != schema:
                raise ValueError(
                    f"window frame {table} has columns {dict(frame.schema)}, expected "
                    f"{dict(schema)}"
                )

    def dimensions(self) -> pl.LazyFrame:
        """Every series with its target's dimensions (`metric_sli.series_dimensions`).

        Collected here, once per call: the frame is one row per series, and the GPU
        attribution behind it would otherwise be planned again inside every query that
        reads it (seconds of planning for a report's few dozen plans)."""
        return series_dimensions(self.series.lazy(), self.targets.lazy()).collect().lazy()

    def frames(self) -> dict[str, pl.DataFrame]:
        """The window's frames by table name (`WINDOW_TABLES` order)."""
        return {table: getattr(self, table) for table in WINDOW_TABLES}

    def points_between(
        self, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        """Points in [from_ts, to_ts), as `Store.read_points` would read them. The range must
        lie inside what the window read."""
        self._check_inside(
            "points", from_ts, to_ts, self.points_from_ts, self.points_to_ts, inclusive=True
        )
        return _between(self.points.lazy(), "ts", from_ts, to_ts)

    def requests_between(
        self, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        """Requests that finished in [from_ts, to_ts), oldest first."""
        self._check_inside("requests", from_ts, to_ts, self.from_ts, self.to_ts, inclusive=False)
        return _between(self.requests.lazy(), "end_ts", from_ts, to_ts)

    def scrapes_between(
        self, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        self._check_inside("scrapes", from_ts, to_ts, self.from_ts, self.to_ts, inclusive=False)
        return _between(self.scrapes.lazy(), "ts", from_ts, to_ts)

    def _check_inside(
        self,
        what: str,
        from_ts: datetime | None,
        to_ts: datetime | None,
        read_from: datetime | None,
        read_to: datetime | None,
        *,
        inclusive: bool,
    ) -> None:
        # A range reaching past what was read would silently lose rows: a caller's bug.
        upper = None if read_to is None else read_to + (_INSTANT if inclusive else timedelta())
        if read_from is not None and (from_ts is None or from_ts < read_from):
            raise ValueError(f"{what} from {from_ts} asked of a window read from {read_from}")
        if upper is not None and (to_ts is None or to_ts > upper):
            raise ValueError(f"{what} until {to_ts} asked of a window read until {read_to}")


def _between(
    frame: pl.LazyFrame, column: str, from_ts: datetime | None, to_ts: datetime | None
) -> pl.LazyFrame:
    condition = pl.lit(value=True)
    if from_ts is not None:
        condition &= pl.col(column) >= from_ts
    if to_ts is not None:
        condition &= pl.col(column) < to_ts
    return frame.filter(condition)


def points_bounds(
    from_ts: datetime | None,
    to_ts: datetime | None,
    *,
    before: timedelta = POINTS_LEAD,
    after: timedelta = timedelta(),
) -> tuple[datetime | None, datetime | None]:
    """The points a window reads: [from_ts - before, to_ts + after], open ends kept open."""
    return (
        None if from_ts is None else from_ts - before,
        None if to_ts is None else to_ts + after,
    )


@dataclass(frozen=True)
class WindowQuery:
    """Which window to read: what `Store.read_window` takes, and the local API's query."""

    from_ts: datetime | None = None
    to_ts: datetime | None = None
    points_before: timedelta = POINTS_LEAD
    points_after: timedelta = timedelta()

    def to_params(self) -> dict[str, str]:
        params = {
            "points_before_s": repr(self.points_before.total_seconds()),
            "points_after_s": repr(self.points_after.total_seconds()),
        }
        if self.from_ts is not None:
            params["from"] = self.from_ts.isoformat()
        if self.to_ts is not None:
            params["to"] = self.to_ts.isoformat()
        return params

    @classmethod
    def from_params(cls, params: dict[str, str]) -> WindowQuery:
        """The query of `to_params`; ValueError names the bad parameter and what is allowed."""
        allowed = {"from", "to", "points_before_s", "points_after_s"}
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise ValueError(f"unknown parameters {unknown}; allowed: {sorted(allowed)}")

        def moment(name: str) -> datetime | None:
            if name not in params:
                return None
            try:
                return datetime.fromisoformat(params[name])
            except ValueError as exc:
                raise ValueError(f"{name}: {params[name]!r} is not an ISO 8601 time") from exc

        def seconds(name: str, default: timedelta) -> timedelta:
            if name not in params:
                return default
            try:
                value = float(params[name])
            except ValueError as exc:
                raise ValueError(f"{name}: {params[name]!r} is not a number") from exc
            if not 0 <= value < 366 * 86400:
                raise ValueError(f"{name}: {value} is not within [0, 1 year) of seconds")
            return timedelta(seconds=value)

        query = cls(
            from_ts=moment("from"),
            to_ts=moment("to"),
            points_before=seconds("points_before_s", POINTS_LEAD),
            points_after=seconds("points_after_s", timedelta()),
        )
        if query.from_ts and query.to_ts and query.to_ts <= query.from_ts:
            raise ValueError(f"to ({query.to_ts}) must be after from ({query.from_ts})")
        return query


# A window on the wire (the `run` service's local API): a zip of one Arrow IPC file per frame
# and `window.json` for the bounds, so frames keep their exact types and no row is re-parsed.
WINDOW_MEDIA_TYPE = "application/vnd.servewatch.window+zip"
_META = "window.json"


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _moment(text: object) -> datetime | None:
    return None if text is None else datetime.fromisoformat(str(text))


def _span(value: list[str] | None) -> TimeSpan | None:
    if value is None:
        return None
    first, last = value
    return TimeSpan(datetime.fromisoformat(first), datetime.fromisoformat(last))


def window_to_bytes(window: Window) -> bytes:
    """The window as a zip of Arrow IPC frames and its bounds."""
    meta: dict[str, Any] = {
        "from_ts": _iso(window.from_ts),
        "to_ts": _iso(window.to_ts),
        "points_from_ts": _iso(window.points_from_ts),
        "points_to_ts": _iso(window.points_to_ts),
        "stored_points": None
        if window.stored_points is None
        else [_iso(window.stored_points.first), _iso(window.stored_points.last)],
        "stored_requests": None
        if window.stored_requests is None
        else [_iso(window.stored_requests.first), _iso(window.stored_requests.last)],
        "request_minutes_current": window.request_minutes_current,
    }
    buffer = io.BytesIO()
    # Stored, not deflated: Arrow buffers are what they are, and the API answers on loopback.
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(_META, json.dumps(meta))
        for table, frame in window.frames().items():
            ipc = io.BytesIO()
            frame.write_ipc(ipc)
            archive.writestr(f"{table}.arrow", ipc.getvalue())
    return buffer.getvalue()


def window_from_bytes(data: bytes) -> Window:
    """A window `window_to_bytes` wrote; ValueError names what is missing or malformed."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            meta = json.loads(archive.read(_META))
            frames = {
                table: pl.read_ipc(io.BytesIO(archive.read(f"{table}.arrow")))
                for table in WINDOW_TABLES
            }
        return Window(
            from_ts=_moment(meta["from_ts"]),
            to_ts=_moment(meta["to_ts"]),
            points_from_ts=_moment(meta["points_from_ts"]),
            points_to_ts=_moment(meta["points_to_ts"]),
            stored_points=_span(meta["stored_points"]),
            stored_requests=_span(meta["stored_requests"]),
            request_minutes_current=bool(meta["request_minutes_current"]),
            **frames,
        )
    except (zipfile.BadZipFile, KeyError, TypeError, json.JSONDecodeError, OSError) as exc:
        raise ValueError(f"not a servewatch window: {type(exc).__name__}: {exc}") from exc
