"""Recorded SLI series: what a fleet's Prometheus recorded from `servewatch rules sli`, stored
as imported, one row per (source, record, labels, instant)."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from servewatch.pipeline.tables import RECORDED_POINTS_SCHEMA
from servewatch.store.connection import StoreBase
from servewatch.store.sql import check_schema, column_list


class RecordedPoints(StoreBase):
    """Writes and reads `recorded_points`; a row already stored is kept once."""

    def write_recorded_points(self, frame: pl.DataFrame) -> int:
        """Store imported recorded samples; returns how many were new (importing a range
        twice adds nothing)."""
        check_schema("recorded_points", frame, RECORDED_POINTS_SCHEMA)
        if frame.height == 0:
            return 0
        before = self.count("recorded_points")
        self._con.register("incoming_recorded", frame.to_arrow())
        try:
            self._con.execute(
                f"INSERT INTO recorded_points ({column_list(RECORDED_POINTS_SCHEMA)}) "
                f"SELECT {column_list(RECORDED_POINTS_SCHEMA)} FROM incoming_recorded "
                "ON CONFLICT DO NOTHING"
            )
        finally:
            self._con.unregister("incoming_recorded")
        return self.count("recorded_points") - before

    def read_recorded_points(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> pl.LazyFrame:
        """Recorded samples with `from_ts <= ts <= to_ts` (either bound optional): the instant
        a rule was evaluated at is its sample's time, so the upper bound is included."""
        clauses: list[str] = []
        params: list[datetime] = []
        if from_ts is not None:
            clauses.append("ts >= ?")
            params.append(from_ts)
        if to_ts is not None:
            clauses.append("ts <= ?")
            params.append(to_ts)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return self._read(
            f"SELECT {column_list(RECORDED_POINTS_SCHEMA)} FROM recorded_points{where} "
            "ORDER BY source, record, labels, ts",
            params,
            table="recorded_points",
        )
