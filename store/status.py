"""A store's state for `servewatch status`: per target, when it was last scraped and whether
that scrape answered."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from servewatch.store.connection import StoreBase

TARGET_STATUS_SCHEMA = pl.Schema(
    {
        "target_id": pl.String(),
        "kind": pl.String(),
        "last_scrape_ts": pl.Datetime("us"),
        "last_ok_ts": pl.Datetime("us"),
        "last_ok": pl.Boolean(),
        "last_error": pl.String(),
        "scrapes_since": pl.Int64(),
        "failed_since": pl.Int64(),
    }
)


class StatusReads(StoreBase):
    """What a shard's health is judged on."""

    def read_target_status(self, *, since: datetime) -> pl.DataFrame:
        """One row per stored target (`TARGET_STATUS_SCHEMA`), by target: its last scrape and
        last answered scrape ever, whether the last one answered (and its error), and its
        scrapes and failed scrapes at or after `since`."""
        frame: pl.DataFrame = self._con.sql(
            """
            SELECT t.target_id, t.kind,
                   max(s.ts) AS last_scrape_ts,
                   max(s.ts) FILTER (WHERE s.ok) AS last_ok_ts,
                   arg_max(s.ok, s.ts) AS last_ok,
                   arg_max(s.error, s.ts) AS last_error,
                   count(s.ts) FILTER (WHERE s.ts >= ?) AS scrapes_since,
                   count(s.ts) FILTER (WHERE s.ts >= ? AND NOT s.ok) AS failed_since
            FROM targets t LEFT JOIN scrapes s USING (target_id)
            GROUP BY t.target_id, t.kind
            ORDER BY t.target_id
            """,
            params=[since, since],
        ).pl()
        return frame.cast(TARGET_STATUS_SCHEMA)
