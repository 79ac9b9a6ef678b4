"""Reading the stored tables back as Polars frames, windowed by time where a table has one."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import polars as pl

from servewatch.pipeline.tables import (
    REQUEST_MINUTES_SCHEMA,
    REQUESTS_SCHEMA,
    SCRAPES_SCHEMA,
    SERIES_SCHEMA,
    SLO_MINUTES_SCHEMA,
    TARGETS_SCHEMA,
    UNKNOWN_FAMILIES_SCHEMA,
)
from servewatch.store.connection import StoreBase
from servewatch.store.errors import StoreError
from servewatch.store.sql import column_list, ms_ceiling, window_clauses

# The request dimensions of `slo_minutes`: what an SLO's scope may select on.
SLO_MINUTE_DIMENSIONS = ("replica", "pool", "model", "tenant", "adapter")


class Reads(StoreBase):
    """Reads every table back, ordered so no caller depends on storage order."""

    def read_requests(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        """Requests that finished in [from_ts, to_ts) (naive UTC), oldest first."""
        clauses, params = window_clauses("end_ts", from_ts, to_ts)
        sql = f"SELECT {column_list(REQUESTS_SCHEMA)} FROM requests{clauses} ORDER BY end_ts"
        return self._read(sql, params, table="requests")

    def read_targets(self) -> pl.LazyFrame:
        self._settle()
        sql = f"SELECT {column_list(TARGETS_SCHEMA)} FROM targets ORDER BY target_id"
        return self._read(sql, table="targets")

    def read_scrapes(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        clauses, params = window_clauses("ts", from_ts, to_ts)
        sql = f"SELECT {column_list(SCRAPES_SCHEMA)} FROM scrapes{clauses} ORDER BY target_id, ts"
        return self._read(sql, params, table="scrapes")

    def read_series(self) -> pl.LazyFrame:
        sql = f"SELECT {column_list(SERIES_SCHEMA)} FROM series ORDER BY series_id"
        return self._read(sql, table="series")

    def read_points(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        """Points in [from_ts, to_ts), ordered by series and time."""
        sql, params = points_query(from_ts, to_ts)
        return self._read(sql, params, table="points")

    def points_range(self) -> tuple[datetime, datetime] | None:
        """First and last sample time stored, or None without points."""
        rows = self._con.execute(
            "SELECT CAST(min(ts) AS TIMESTAMP), CAST(max(ts) AS TIMESTAMP) FROM ("
            "SELECT ts FROM point_instants UNION ALL SELECT ts FROM points_head)"
        ).fetchall()
        first, last = rows[0]
        return None if first is None else (first, last)

    def requests_range(self) -> tuple[datetime, datetime] | None:
        """First and last completion time stored, or None without requests."""
        rows = self._con.execute("SELECT min(end_ts), max(end_ts) FROM requests").fetchall()
        first, last = rows[0]
        return None if first is None else (first, last)

    def last_slo_minute(self) -> datetime | None:
        """The last minute `slo_minutes` counts requests in (rows counted from metrics aside),
        or None: where the data of a store rolled up from compacted partitions, which holds
        no requests itself, ends."""
        rows = self._con.execute(
            "SELECT max(minute_ts) FROM slo_minutes WHERE output_tokens IS NOT NULL"
        ).fetchall()
        last: datetime | None = rows[0][0]
        return last

    def request_minute_span(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> tuple[datetime, datetime] | None:
        """First and last minute (of completion) with requests among the minutes in
        [from_ts, to_ts): the minutes `request_minutes` holds there once rolled up."""
        minute = "date_trunc('minute', end_ts)"
        clauses, params = window_clauses(minute, from_ts, to_ts)
        rows = self._con.execute(
            f"SELECT min({minute}), max({minute}) FROM requests{clauses}", params
        ).fetchall()
        first, last = rows[0]
        return None if first is None else (first, last)

    def read_unknown_families(self) -> pl.LazyFrame:
        return self._read(
            f"SELECT {column_list(UNKNOWN_FAMILIES_SCHEMA)} FROM unknown_families "
            "ORDER BY target_id, family",
            table="unknown_families",
        )

    def read_request_minutes(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        clauses, params = window_clauses("minute_ts", from_ts, to_ts)
        return self._read(
            f"SELECT {column_list(REQUEST_MINUTES_SCHEMA)} FROM request_minutes{clauses} "
            "ORDER BY minute_ts, replica",
            params,
            table="request_minutes",
        )

    def read_slo_minutes(
        self,
        *,
        from_ts: datetime | None = None,
        to_ts: datetime | None = None,
        by: Sequence[str] | None = None,
    ) -> pl.LazyFrame:
        """`slo_minutes` in [from_ts, to_ts). With `by` (dimension columns), the counts are
        summed per SLO, minute and those columns in the store and the other dimensions are
        null: a status reads an SLO's 30 days as 43,200 rows, not one per replica, tenant and
        minute (5.8M a day at 1,000 replicas)."""
        clauses, params = window_clauses("minute_ts", from_ts, to_ts)
        if by is None:
            return self._read(
                f"SELECT {column_list(SLO_MINUTES_SCHEMA)} FROM slo_minutes{clauses} "
                "ORDER BY slo, minute_ts, replica",
                params,
                table="slo_minutes",
            )
        unknown = sorted(set(by) - set(SLO_MINUTE_DIMENSIONS))
        if unknown:
            raise StoreError(
                f"cannot sum slo_minutes by {unknown}; allowed: {list(SLO_MINUTE_DIMENSIONS)}"
            )
        columns = []
        for name in SLO_MINUTES_SCHEMA.names():
            if name in {"minute_ts", "slo"} or name in by:
                columns.append(name)
            elif name in SLO_MINUTE_DIMENSIONS:
                columns.append(f"NULL::VARCHAR AS {name}")
            else:
                columns.append(f"sum({name})::BIGINT AS {name}")
        return self._read(
            f"SELECT {', '.join(columns)} FROM slo_minutes{clauses} "
            f"GROUP BY {', '.join(['slo', 'minute_ts', *by])} ORDER BY slo, minute_ts",
            params,
            table="slo_minutes",
        )


def points_query(from_ts: datetime | None, to_ts: datetime | None) -> tuple[str, list[datetime]]:
    """The SQL (and its parameters) of the points in [from_ts, to_ts) as the `points` view
    shows them, `(series_id, ts, value)` ordered by series and time: what `read_points` reads
    and the Parquet export writes."""
    # Stored times are whole milliseconds, so `ts >= t` is `ts >= t rounded up to a
    # millisecond`; comparing in the stored type lets DuckDB skip blocks by min/max.
    clauses, params = window_clauses(
        "ts",
        None if from_ts is None else ms_ceiling(from_ts),
        None if to_ts is None else ms_ceiling(to_ts),
        cast="TIMESTAMP_MS",
    )
    # The window picks instants first; a compacted block's instants are one contiguous id
    # range, so bounding point_rows by the picked ids lets DuckDB skip other blocks' row
    # groups by their min/max.
    sql = f"""
        WITH picked AS (SELECT instant, ts FROM point_instants{clauses})
        SELECT p.series_id, CAST(i.ts AS TIMESTAMP) AS ts, p.value
        FROM point_rows p JOIN picked i USING (instant)
        WHERE p.instant BETWEEN (SELECT min(instant) FROM picked)
                            AND (SELECT max(instant) FROM picked)
        UNION ALL
        SELECT series_id, CAST(ts AS TIMESTAMP) AS ts, value FROM points_head{clauses}
        ORDER BY series_id, ts
    """
    return sql, params + params
