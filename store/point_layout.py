"""How points lie on disk: one-hour blocks, a head for open ones, compacted rows for the rest."""

from __future__ import annotations

from datetime import timedelta

# Migration 7 splits points into three tables, because DuckDB bit-packs a column in groups of
# 2,048 values whose width is set by the group's widest delta, and in series order every series
# boundary jumps a timestamp back by a whole block (23 bits a value in a 2 h block):
# - `points_head`: points as written (series_id, ts TIMESTAMP_MS, value), until their block
#   closes; small, and its deleted rows free blocks that the next head reuses.
# - `point_instants`: each distinct (target, sample time) of a compacted block once, numbered
#   consecutively per target within the block (all series of a target share its scrapes).
# - `point_rows`: (series_id, instant, value) of compacted blocks, ordered by target, series,
#   and time, alternating direction from one series to the next, so the instant column moves by
#   +-1 along a series and by about 0 across a boundary: ~0.3 B a sample instead of ~3.1 B.
#   A target's series follow one another by their mean value in the block, because ALP packs
#   1,024 values at the width of their range: neighbours of like magnitude (a counter beside
#   counters, a ratio beside ratios) cost ~12 % fewer bytes than neighbours in id order.
# Blocks are 1 h: a block is compacted half a block after its end, so the head peaks at 1.5 h of
# points, whose blocks are left free in the file when it empties; 2 h blocks compress ~0.1 B a
# sample better but double that slack. docs/design-notes.md ("Points storage") has the
# measurements.
POINT_BLOCK = timedelta(hours=1)


POINT_BLOCK_SQL = "INTERVAL 1 HOUR"


POINT_BLOCK_TRUNCATE = "1h"


# The statements below (re)write the rows of the temp table `compacting` (series_id, ts,
# value), which the caller has already removed from wherever they were; they are shared by
# `Store.compact_points` and migration 7. Instant ids continue after the highest in use, so a
# block's instants are always one contiguous id range (reads and deletes use it).
COMPACT_STATEMENTS: tuple[str, ...] = (
    f"""
    CREATE OR REPLACE TEMP TABLE compacting_instants AS
    SELECT (SELECT coalesce(max(instant), 0) FROM point_instants)
               + row_number() OVER (ORDER BY block_ts, target_id, ts) AS instant,
           block_ts, target_id, ts
    FROM (
        SELECT DISTINCT time_bucket({POINT_BLOCK_SQL}, c.ts) AS block_ts, s.target_id, c.ts
        FROM compacting c LEFT JOIN series s USING (series_id)
    )
    """,
    "INSERT INTO point_instants SELECT instant, ts FROM compacting_instants ORDER BY instant",
    """
    INSERT INTO point_rows
    SELECT series_id, instant, value FROM (
        SELECT series_id, instant, value, block_ts, target_id,
               dense_rank() OVER (
                   PARTITION BY block_ts ORDER BY target_id, level NULLS LAST, series_id
               ) AS nth_series
        FROM (
            SELECT c.series_id, i.instant, c.value, i.block_ts, i.target_id,
                   avg(c.value) OVER (PARTITION BY i.block_ts, c.series_id) AS level
            FROM compacting c
            LEFT JOIN series s USING (series_id)
            JOIN compacting_instants i
                ON i.target_id IS NOT DISTINCT FROM s.target_id AND i.ts = c.ts
        )
    )
    ORDER BY block_ts, nth_series,
             CASE WHEN nth_series % 2 = 0 THEN -instant ELSE instant END
    """,
    "DROP TABLE compacting_instants",
    "DROP TABLE compacting",
)


POINTS_VIEW_SQL = """
    CREATE VIEW points AS
    SELECT p.series_id, CAST(i.ts AS TIMESTAMP) AS ts, p.value
    FROM point_rows p JOIN point_instants i USING (instant)
    UNION ALL
    SELECT series_id, CAST(ts AS TIMESTAMP) AS ts, value FROM points_head
"""
