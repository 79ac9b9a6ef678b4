"""Point compaction and retention: closed blocks rewritten in series order, old points dropped."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import duckdb

from servewatch.store.connection import StoreBase
from servewatch.store.errors import StoreError
from servewatch.store.point_layout import COMPACT_STATEMENTS, POINT_BLOCK, POINT_BLOCK_SQL
from servewatch.store.sql import ms_ceiling


@dataclass(frozen=True)
class CompactionReport:
    """Blocks of points rewritten in series order, and the points they held."""

    blocks: int = 0
    points: int = 0

    def plus(self, other: CompactionReport) -> CompactionReport:
        return CompactionReport(self.blocks + other.blocks, self.points + other.points)


class PointCompaction(StoreBase):
    """Moves closed blocks from the head into compacted rows; drops points past retention."""

    def compact_points(self, *, before: datetime) -> CompactionReport:
        """Move every block of points that received writes and ends at or before `before` from
        `points_head` into `point_instants` and `point_rows` (see `COMPACT_STATEMENTS`), as
        Prometheus compacts its head into blocks: a series' instants then form a +-1 run and
        its values a run DuckDB's codecs compress well. One transaction a block, so a crash
        leaves each block either as it was or compacted. Called by `write_scrapes` for blocks
        half a block behind the newest point; call it with a later `before` to compact the head
        too (e.g. before a backup)."""
        rows = self._con.execute(
            "SELECT block_ts FROM point_blocks WHERE NOT compacted AND block_ts + "
            f"{POINT_BLOCK_SQL} <= ? ORDER BY block_ts",
            [before],
        ).fetchall()
        report = CompactionReport()
        for (block_ts,) in rows:
            report = report.plus(self._compact_block(block_ts))
        return report

    def _compact_block(self, block_ts: datetime) -> CompactionReport:
        bounds = [block_ts, block_ts + POINT_BLOCK]
        where = "ts >= CAST(? AS TIMESTAMP_MS) AND ts < CAST(? AS TIMESTAMP_MS)"
        self._con.execute("BEGIN TRANSACTION")
        try:
            self._con.execute(
                "CREATE OR REPLACE TEMP TABLE compacting AS "
                f"SELECT series_id, ts, value FROM points_head WHERE {where}",
                bounds,
            )
            # A block compacted before and reopened by late points: its compacted rows are
            # merged with the late ones and the block is written again.
            first, last = self._con.execute(
                f"SELECT min(instant), max(instant) FROM point_instants WHERE {where}", bounds
            ).fetchall()[0]
            if first is not None:
                self._con.execute(
                    "INSERT INTO compacting "
                    "SELECT p.series_id, i.ts, p.value FROM point_rows p "
                    "JOIN point_instants i USING (instant) WHERE p.instant BETWEEN ? AND ?",
                    [first, last],
                )
                self._con.execute(
                    "DELETE FROM point_rows WHERE instant BETWEEN ? AND ?", [first, last]
                )
                self._con.execute(
                    "DELETE FROM point_instants WHERE instant BETWEEN ? AND ?", [first, last]
                )
            moved = self._scalar("SELECT count(*) FROM compacting")
            self._con.execute(f"DELETE FROM points_head WHERE {where}", bounds)
            for statement in COMPACT_STATEMENTS:
                self._con.execute(statement)
            self._con.execute(
                "UPDATE point_blocks SET compacted = true WHERE block_ts = ?", [block_ts]
            )
            self._con.execute("COMMIT")
            self._written.compacted(block_ts)
        except duckdb.Error as exc:
            self._con.execute("ROLLBACK")
            raise StoreError(
                f"compacting the points of {block_ts.isoformat()}Z (+{POINT_BLOCK}) in "
                f"{self.path} failed: {exc}"
            ) from exc
        return CompactionReport(blocks=1, points=moved)

    def drop_points_before(self, cutoff: datetime) -> int:
        """Retention: delete raw points older than `cutoff`; rollups are kept. Returns rows
        deleted."""
        before = self.count("points")
        older = "ts < CAST(? AS TIMESTAMP_MS)"
        at = [ms_ceiling(cutoff)]
        self._con.execute("BEGIN TRANSACTION")
        try:
            self._con.execute(f"DELETE FROM points_head WHERE {older}", at)
            self._con.execute(
                "DELETE FROM point_rows WHERE instant IN "
                f"(SELECT instant FROM point_instants WHERE {older})",
                at,
            )
            self._con.execute(f"DELETE FROM point_instants WHERE {older}", at)
            self._con.execute(
                f"DELETE FROM point_blocks WHERE block_ts + {POINT_BLOCK_SQL} <= ?", [cutoff]
            )
            self._con.execute("COMMIT")
            self._written.open_blocks = None  # read again when next needed
        except duckdb.Error as exc:
            self._con.execute("ROLLBACK")
            raise StoreError(
                f"dropping points before {cutoff} in {self.path} failed: {exc}"
            ) from exc
        return before - self.count("points")
