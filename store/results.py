"""What analyses write back: alert state changes, recommendations and rejected input."""

from __future__ import annotations

import polars as pl

from servewatch.pipeline.tables import (
    ALERTS_SCHEMA,
    INGEST_ERRORS_SCHEMA,
    RECOMMENDATIONS_SCHEMA,
)
from servewatch.store.connection import StoreBase
from servewatch.store.sql import check_schema, column_list


class Results(StoreBase):
    """Appends and reads alert changes, recommendations and ingest errors, each row once."""

    def write_alert_changes(self, frame: pl.DataFrame) -> int:
        """Append alert state changes (pending, firing, resolved); a change already stored is
        kept once. Returns how many were new."""
        return self._insert_new("alerts", frame, ALERTS_SCHEMA)

    def read_alert_changes(self) -> pl.LazyFrame:
        return self._read(
            f"SELECT {column_list(ALERTS_SCHEMA)} FROM alerts ORDER BY changed_ts, slo",
            table="alerts",
        )

    def write_recommendation(self, frame: pl.DataFrame) -> int:
        return self._insert_new("recommendations", frame, RECOMMENDATIONS_SCHEMA)

    def read_recommendations(self) -> pl.LazyFrame:
        return self._read(
            f"SELECT {column_list(RECOMMENDATIONS_SCHEMA)} FROM recommendations "
            "ORDER BY created_ts",
            table="recommendations",
        )

    def write_ingest_errors(self, frame: pl.DataFrame) -> int:
        """Record rejected input; one row per (source, location), so re-ingest adds nothing."""
        return self._insert_new("ingest_errors", frame, INGEST_ERRORS_SCHEMA)

    def read_ingest_errors(self) -> pl.LazyFrame:
        sql = f"SELECT {column_list(INGEST_ERRORS_SCHEMA)} FROM ingest_errors ORDER BY source"
        return self._read(sql, table="ingest_errors")

    def _insert_new(self, table: str, frame: pl.DataFrame, schema: pl.Schema) -> int:
        check_schema(table, frame, schema)
        if frame.height == 0:
            return 0
        before = self.count(table)
        incoming = frame.to_arrow()
        self._con.register("incoming", incoming)
        try:
            self._con.execute(
                f"INSERT INTO {table} ({column_list(schema)}) "
                f"SELECT {column_list(schema)} FROM incoming ON CONFLICT DO NOTHING"
            )
        finally:
            self._con.unregister("incoming")
        return self.count(table) - before
