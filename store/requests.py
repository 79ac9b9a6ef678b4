"""The request write path: spans stored once however often they arrive."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl

from servewatch.pipeline.tables import (
    REQUESTS_SCHEMA,
)
from servewatch.store.connection import StoreBase
from servewatch.store.sql import check_schema, column_list

# Ranges of end times a requests batch is checked against at most.
MAX_TIME_RANGES = 8


# How long after a span is stored a copy of it with other fields (another end time) is still
# recognised: longer than exporters retry (the Collector's exporters give up after 5 minutes).
RETRY_HORIZON = timedelta(minutes=15)


def time_ranges(times: pl.Series) -> list[tuple[datetime, datetime]]:
    """A batch's end (or arrival) times as at most `MAX_TIME_RANGES` inclusive ranges, split at
    the widest gaps between them: a few late spans (or a client whose clock is off) then add
    their own row groups to the deduplication check, not all the hours between them and the
    rest."""
    ends = times.unique().sort()
    cuts = ends.diff().arg_sort(descending=True, nulls_last=True).head(MAX_TIME_RANGES - 1)
    starts = [0, *sorted(int(c) for c in cuts if c > 0)]
    return [
        (ends[start], ends[stop - 1])
        for start, stop in zip(starts, [*starts[1:], ends.len()], strict=True)
    ]


class RequestWrites(StoreBase):
    """Writes request rows, each (trace, span) once."""

    def write_requests(self, frame: pl.DataFrame) -> int:
        """Insert request rows, ignoring ones already stored (same trace and span id) and
        repeats within the frame (the first is kept).

        A stored row counts when its end time or its arrival time lies in the batch's ranges of
        those times (any delay, the same end or the same start), or it was ingested within
        `RETRY_HORIZON` (any other fields): see docs/design-notes.md. Rows are stamped with
        `ingested_ts` (now) unless they carry one; rollups use it to find what arrived since
        they last ran. Returns how many rows were new.
        """
        check_schema("requests", frame, REQUESTS_SCHEMA)
        if frame.height == 0:
            return 0
        # The writer merges exports of ~1,000 rows without copying them; DuckDB reads an Arrow
        # table batch by batch, and a batch that small costs nearly what a full vector of
        # 2,048 rows does at every step of the check and the insert. One copy into a single
        # chunk first: 3.2 us of CPU a row against 3.4-3.6 in 1,000,000 rows stored in batches
        # of 67 exports (docs/benchmarks.md, otlp_receive).
        frame = frame.rechunk()
        # Span ids alone are 64 random bits: when they are all distinct, so are the keys, and
        # that check hashes one column instead of two.
        if frame["span_id"].n_unique() < frame.height:
            frame = frame.unique(["trace_id", "span_id"], keep="first", maintain_order=True)
        now = self._clock()
        # A stored copy of a span ends when the span ends, so it lies among the stored rows of
        # the batch's completion times; a copy re-emitted with another end time still starts
        # when the request arrived, and any copy sent again lies among the rows ingested lately.
        # Those are the only rows compared: requests are stored roughly in completion (and so
        # arrival) order and exactly in ingest order, so DuckDB skips every other row group by
        # its min/max and the check costs what the batch overlaps plus the last
        # RETRY_HORIZON's rows, not what the table holds.
        ranges = time_ranges(frame["end_ts"])
        starts = time_ranges(frame["arrival_ts"])
        within = " OR ".join(
            ["(r.end_ts >= ? AND r.end_ts <= ?)"] * len(ranges)
            + ["(r.arrival_ts >= ? AND r.arrival_ts <= ?)"] * len(starts)
        )
        # The stored rows compared are matched on the span id alone, and the pairs found
        # compared whole below: DuckDB then reads (and decompresses) one key column of the
        # rows it scans instead of two, which on a busy store is most of the check's cost.
        self._con.register("incoming_keys", frame.select("span_id").to_arrow())
        try:
            stored: pl.DataFrame = self._con.sql(
                f"SELECT trace_id, span_id FROM requests r WHERE ({within} OR r.ingested_ts >= ?)"
                " AND r.span_id IN (SELECT span_id FROM incoming_keys)",
                params=[*(t for r in (*ranges, *starts) for t in r), now - RETRY_HORIZON],
            ).pl()
        finally:
            self._con.unregister("incoming_keys")
        if stored.height:
            # A filter, not a join: the rows keep their order, which is the order stored. A
            # stored row of the same span id but another trace leaves the row in.
            key = pl.struct("trace_id", "span_id")
            frame = frame.filter(~key.is_in(stored.select(key).to_series().implode()))
            if frame.height == 0:
                return 0
        stamped = frame.with_columns(
            pl.col("ingested_ts").fill_null(pl.lit(now, dtype=pl.Datetime("us")))
        ).to_arrow()
        columns = column_list(REQUESTS_SCHEMA)
        self._con.register("incoming_requests", stamped)
        try:
            inserted = self._con.execute(
                f"INSERT INTO requests ({columns}) SELECT {columns} FROM incoming_requests"
            ).fetchall()
        finally:
            self._con.unregister("incoming_requests")
        # An INSERT answers with the number of rows it stored.
        return int(inserted[0][0])
