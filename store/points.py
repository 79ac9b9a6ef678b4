"""The scrape write path: targets, scrapes, series and points, each sample stored once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property

import duckdb
import polars as pl

from servewatch.pipeline.tables import (
    SAMPLES_SCHEMA,
    SCRAPES_SCHEMA,
    SERIES_SCHEMA,
    TARGETS_SCHEMA,
    UNKNOWN_FAMILIES_SCHEMA,
)
from servewatch.store.compaction import PointCompaction
from servewatch.store.errors import StoreError
from servewatch.store.keyed_points import (
    KeyedPoints,
    SeriesIds,
    keyed_frame,
    keyed_of,
    new_issuer,
)
from servewatch.store.point_layout import POINT_BLOCK, POINT_BLOCK_TRUNCATE
from servewatch.store.sql import check_schema, column_list
from servewatch.store.target_writes import TargetWrites
from servewatch.store.written_keys import SERIES_IDS_SCHEMA, WrittenKeys, max_id, scrape_keys

_SERIES_KEY = ["target_id", "metric", "labels"]


# The stored form of points in `points_head`; reads give `POINTS_SCHEMA` (microsecond
# timestamps).
_POINTS_HEAD_SCHEMA = pl.Schema(
    {"series_id": pl.Int32(), "ts": pl.Datetime("ms"), "value": pl.Float64()}
)


def _points(keyed: pl.LazyFrame) -> pl.LazyFrame:
    """Points as `points_head` stores them, in series and time order."""
    return keyed.select("series_id", ts=pl.col("ts").dt.cast_time_unit("ms"), value="value").sort(
        "series_id", "ts"
    )


_EPOCH = datetime(1970, 1, 1)


def _block_of(ts: datetime) -> datetime:
    """The start of the block `ts` falls in: blocks are counted from the epoch, as
    `dt.truncate` counts them."""
    return _EPOCH + (ts - _EPOCH) // POINT_BLOCK * POINT_BLOCK


def _blocks_of(ts: pl.Series) -> set[datetime]:
    """The blocks (start times) that points at `ts` fall in."""
    first, last = ts.min(), ts.max()
    if first is None:
        return set()
    assert isinstance(first, datetime)
    assert isinstance(last, datetime)
    if _block_of(first) == _block_of(last):  # the common batch: one block, without a unique()
        return {_block_of(first)}
    ends = ts.dt.truncate(POINT_BLOCK_TRUNCATE).dt.cast_time_unit("us")
    return set(ends.unique().to_list())


# Rows of a DuckDB row group (its default, `row_group_size`).
ROW_GROUP_ROWS = 122_880
_SCRAPE_KEY = ["target_id", "scrape_ts"]


def write_chunks(
    scrapes: pl.DataFrame,
    samples: pl.DataFrame,
    *,
    rows: int = ROW_GROUP_ROWS // 2,
    extra: Mapping[tuple[str, datetime], int] | None = None,
) -> list[tuple[pl.DataFrame, pl.DataFrame]]:
    """`scrapes` and their `samples` cut into consecutive chunks of whole scrapes of at most
    `rows` samples each (a scrape of more is a chunk of its own); one chunk when it fits.
    `extra` counts a scrape's points that are not among `samples` (`KeyedPoints`).
    Half a row group by default: an append also fills the row group the last one left open,
    and a day's replay left the fewest free blocks so (38-39 of ~335; a quarter: 38, 20 %
    slower; a whole row group: 49)."""
    extra = extra or {}
    if samples.height + sum(extra.values()) <= rows:
        return [(scrapes, samples)]
    per_scrape = (
        scrapes.select("target_id", scrape_ts="ts")
        .join(
            samples.group_by(_SCRAPE_KEY).len(), on=_SCRAPE_KEY, how="left", maintain_order="left"
        )
        .with_columns(pl.col("len").fill_null(0))
    )
    chunk = 0
    filled = 0
    chunks: list[int] = []
    counts = per_scrape.get_column("len").to_list()
    if extra:
        keys = zip(
            per_scrape.get_column("target_id"), per_scrape.get_column("scrape_ts"), strict=True
        )
        counts = [count + extra.get(key, 0) for count, key in zip(counts, keys, strict=True)]
    for count in counts:
        if filled and filled + count > rows:
            chunk, filled = chunk + 1, 0
        chunks.append(chunk)
        filled += count
    numbered = per_scrape.select(*_SCRAPE_KEY, _chunk=pl.Series(chunks, dtype=pl.Int64)).unique(
        _SCRAPE_KEY, keep="first", maintain_order=True
    )
    keyed_scrapes = scrapes.join(
        numbered.rename({"scrape_ts": "ts"}), on=["target_id", "ts"], how="left"
    )
    keyed_samples = samples.join(numbered, on=_SCRAPE_KEY, how="left")
    return [
        (
            keyed_scrapes.filter(pl.col("_chunk") == k).drop("_chunk"),
            keyed_samples.filter(pl.col("_chunk") == k).drop("_chunk"),
        )
        for k in range(chunk + 1)
    ]


class PointWrites(PointCompaction, TargetWrites):
    """Writes scrapes and their samples (and their targets, `TargetWrites`); knows which keys
    are stored (`WrittenKeys`)."""

    @cached_property
    def issuer(self) -> int:
        """This store object's number among those of the process: its `SeriesIds` carry it."""
        return new_issuer()

    def series_ids(self, target_id: str, keys: pl.DataFrame) -> SeriesIds | None:
        """The series ids of `target_id`'s (metric, labels) `keys`, in their order, for
        `KeyedPoints` to this store; None unless every key is a stored series."""
        known = self._known_series([target_id]).select("metric", "labels", "series_id")
        ids = keys.select("metric", "labels").join(
            known, on=["metric", "labels"], how="left", maintain_order="left"
        )
        column = ids.get_column("series_id")
        if column.null_count() or ids.height != keys.height:
            return None
        return SeriesIds(self.issuer, target_id, tuple(column.to_list()))

    def write_scrapes(
        self,
        scrapes: pl.DataFrame,
        samples: pl.DataFrame,
        *,
        targets: pl.DataFrame | None = None,
        keyed: Sequence[KeyedPoints] = (),
    ) -> tuple[int, int]:
        """Record scrapes and their samples; a scrape already stored (same target and time) is
        skipped with its samples, so replaying a recording twice changes nothing. `targets`,
        if given, are written as `write_targets` does, in the same transaction.

        New (target, metric, labels) combinations get the next integer series ids. Points
        arrive in DuckDB as plain integer and float columns, ordered by series and time;
        blocks that closed meanwhile are then compacted (`compact_points`). Returns (new
        scrapes, new points).

        Cost: a batch in the steady state (known targets and series, scrapes newer than any
        stored for their target, blocks already awaiting compaction) is one transaction of
        an UPDATE of the targets' seen times and two INSERTs, scrapes and points: which
        scrapes are new, the series ids and the open blocks are answered from what this
        store has written (`WrittenKeys`), and only a batch that those cannot vouch for (a
        replayed or late scrape) asks the tables.

        A batch of more samples than half a DuckDB row group is written in consecutive
        transactions of whole scrapes, each within one row group (`write_chunks`): a larger
        transaction has DuckDB write its row groups ahead of the commit, and the checkpoint
        that follows rewrites them and leaves the first copy's blocks free in the file (a
        day's replay in 600-page batches grew its file by a third so).

        `keyed` gives scrapes' points by series id instead of as samples: what a caller that
        had the ids from `series_ids` writes without a join (the steady pages of an ingest).
        """
        check_schema("scrapes", scrapes, SCRAPES_SCHEMA)
        check_schema("samples", samples, SAMPLES_SCHEMA)
        if targets is None:
            targets = pl.DataFrame(schema=TARGETS_SCHEMA)
        check_schema("targets", targets, TARGETS_SCHEMA)
        if scrapes.height == 0:
            self._write_targets(targets, defer=False)
            self._unwritten_seen.clear()
            return (0, 0)
        for points in keyed:
            if points.series.issuer != self.issuer:
                raise ValueError(
                    f"keyed points of {points.series.target_id} carry series ids of another "
                    "store; take them from this store's series_ids"
                )
        by_scrape = {(p.series.target_id, p.scrape_ts): p for p in keyed}
        extra = {key: len(p.values) for key, p in by_scrape.items()}
        new_scrapes = new_points = 0
        chunks = write_chunks(scrapes, samples, extra=extra)
        for index, (some_scrapes, some_samples) in enumerate(chunks):
            own = by_scrape if len(chunks) == 1 else keyed_of(some_scrapes, by_scrape)
            written = self._write_scrapes(
                some_scrapes,
                some_samples,
                targets if index == 0 else targets.clear(),
                list(own.values()),
                retry=True,
            )
            new_scrapes, new_points = new_scrapes + written[0], new_points + written[1]
        return (new_scrapes, new_points)

    def _write_scrapes(
        self,
        scrapes: pl.DataFrame,
        samples: pl.DataFrame,
        targets: pl.DataFrame,
        keyed: list[KeyedPoints],
        *,
        retry: bool,
    ) -> tuple[int, int]:
        new_scrapes = self._new_scrapes(scrapes)
        points, new_series = self._sample_points(new_scrapes, samples)
        if keyed:
            given, ordered = keyed_frame(keyed, new=set(scrape_keys(new_scrapes)))
            if points.height or not ordered:
                points = pl.concat([points, given]).sort("series_id", "ts")
            else:
                points = given
        if self._may_repeat_points(new_scrapes, samples):
            points = self._unstored_points(points)
        blocks = _blocks_of(points.get_column("ts")) - self._open_blocks()
        latest_scrape = scrapes.get_column("ts").max()
        assert isinstance(latest_scrape, datetime)
        self._con.execute("BEGIN TRANSACTION")
        try:
            deferred = self._write_targets(targets, defer=not self._seen_due(latest_scrape))
            self._append_few("scrapes", new_scrapes, SCRAPES_SCHEMA)
            self._append("series", new_series, SERIES_SCHEMA)
            self._append("points_head", points, _POINTS_HEAD_SCHEMA)
            self._mark_blocks(blocks)
            self._con.execute("COMMIT")
        except duckdb.Error as exc:
            self._con.execute("ROLLBACK")
            self._written = WrittenKeys()  # some of it may have been learnt in the transaction
            if retry and isinstance(exc, duckdb.ConstraintException):
                # Keys written by another connection: what was known is read again.
                return self._write_scrapes(scrapes, samples, targets, keyed, retry=False)
            raise StoreError(
                f"writing {scrapes.height} scrapes to {self.path} failed: {exc}"
            ) from exc
        self._written.committed(new_scrapes, new_series, blocks)
        self._seen_committed(deferred, latest_scrape)
        if points.height:
            latest = points.get_column("ts").max()
            assert isinstance(latest, datetime)
            before = latest - POINT_BLOCK / 2
            if any(block + POINT_BLOCK <= before for block in self._open_blocks()):
                self.compact_points(before=before)
        return (new_scrapes.height, points.height)

    def _sample_points(
        self, new_scrapes: pl.DataFrame, samples: pl.DataFrame
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The points of the samples of `new_scrapes`, as `points_head` stores them, and the
        series rows of keys not stored yet."""
        new_series = pl.DataFrame(schema=SERIES_SCHEMA)
        if samples.height == 0:
            return pl.DataFrame(schema=_POINTS_HEAD_SCHEMA), new_series
        known = self._known_series(sorted(set(new_scrapes.get_column("target_id"))))
        keyed = samples.lazy().join(
            new_scrapes.lazy().select("target_id", scrape_ts="ts"),
            on=["target_id", "scrape_ts"],
            how="semi",
        )
        keyed = keyed.join(known.lazy(), on=_SERIES_KEY, how="left")
        # A steady batch knows every series: its points are one query; only a batch with new
        # series collects the keyed samples to number them, then points again.
        points = _points(keyed).collect()
        if points.get_column("series_id").null_count():
            known_keyed = keyed.collect()
            new_series = self._new_series(known_keyed)
            points = _points(
                pl.concat(
                    [
                        known_keyed.filter(pl.col("series_id").is_not_null()),
                        known_keyed.filter(pl.col("series_id").is_null())
                        .drop("series_id")
                        .join(new_series.select(*_SERIES_KEY, "series_id"), on=_SERIES_KEY),
                    ]
                ).lazy()
            ).collect()
        return points, new_series

    def _new_scrapes(self, scrapes: pl.DataFrame) -> pl.DataFrame:
        """The scrapes of the batch not stored yet, each (target, time) once. A scrape later
        than any stored for its target is new; only the others are looked up."""
        keys = scrape_keys(scrapes)
        unique = scrapes
        if len(set(keys)) < len(keys):
            unique = scrapes.unique(["target_id", "ts"], keep="first", maintain_order=True)
            keys = scrape_keys(unique)
        latest = self._latest_scrapes()
        later = [ts > latest[target] if target in latest else True for target, ts in keys]
        if all(later):
            return unique
        doubtful = unique.filter(~pl.Series(later)).select("target_id", "ts")
        self._con.register("incoming_scrapes", doubtful.to_arrow())
        try:
            stored: pl.DataFrame = self._con.sql(
                "SELECT s.target_id, s.ts FROM incoming_scrapes s "
                "JOIN scrapes e ON e.target_id = s.target_id AND e.ts = s.ts"
            ).pl()
        finally:
            self._con.unregister("incoming_scrapes")
        if stored.height == 0:
            return unique
        return unique.join(stored, on=["target_id", "ts"], how="anti", maintain_order="left")

    def _may_repeat_points(self, new_scrapes: pl.DataFrame, samples: pl.DataFrame) -> bool:
        """Whether a point of the batch may already be stored. Not when every sample is at its
        scrape's time and every scrape is later than any stored for its target: the steady
        batch, decided without asking the tables. Samples with their own timestamps (a page
        ingested again under another scrape time) and late scrapes are looked up."""
        latest = self._latest_scrapes()
        if any(
            target in latest and ts <= latest[target] for target, ts in scrape_keys(new_scrapes)
        ):
            return True
        if samples.height == 0:
            return False
        return bool((samples.get_column("ts") != samples.get_column("scrape_ts")).any())

    def _unstored_points(self, points: pl.DataFrame) -> pl.DataFrame:
        """`points` less those whose (series, time) is stored, or comes earlier in the batch:
        a sample is stored once however often its page is ingested."""
        points = points.unique(["series_id", "ts"], keep="first", maintain_order=True)
        if points.height == 0:
            return points
        first, last = points.get_column("ts").min(), points.get_column("ts").max()
        incoming_points = points.select("series_id", "ts").to_arrow()  # noqa: F841 (read below)
        stored: pl.DataFrame = self._con.sql(
            "SELECT p.series_id, CAST(p.ts AS TIMESTAMP_MS) AS ts FROM points p "
            "JOIN incoming_points i ON p.series_id = i.series_id "
            "AND p.ts = CAST(i.ts AS TIMESTAMP) WHERE p.ts BETWEEN ? AND ?",
            params=[first, last],
        ).pl()
        if stored.height == 0:
            return points
        return points.join(
            stored.cast({"series_id": pl.Int32(), "ts": pl.Datetime("ms")}),
            on=["series_id", "ts"],
            how="anti",
            maintain_order="left",
        )

    def _latest_scrapes(self) -> dict[str, datetime]:
        if self._written.latest_scrape is None:
            rows = self._con.execute(
                "SELECT target_id, max(ts) FROM scrapes GROUP BY target_id"
            ).fetchall()
            self._written.latest_scrape = dict(rows)
        return self._written.latest_scrape

    def _known_series(self, targets: list[str]) -> pl.DataFrame:
        """(target_id, metric, labels, series_id) of the stored series of `targets`."""
        if self._written.series is None:
            stored: pl.DataFrame = self._con.sql(
                "SELECT target_id, metric, labels, series_id FROM series"
            ).pl()
            self._written.series = {
                str(key[0]): part.rechunk()
                for key, part in stored.partition_by(
                    "target_id", as_dict=True, maintain_order=False
                ).items()
            }
            self._written.max_series_id = max_id(stored)
        parts = [self._written.series[t] for t in targets if t in self._written.series]
        if not parts:
            return pl.DataFrame(schema=SERIES_IDS_SCHEMA)
        return pl.concat(parts, rechunk=False)

    def _new_series(self, keyed: pl.DataFrame) -> pl.DataFrame:
        """Series rows for the keys of `keyed` without a series id, numbered after the
        highest id in use in (target, metric, labels) order."""
        if keyed.get_column("series_id").null_count() == 0:
            return pl.DataFrame(schema=SERIES_SCHEMA)
        return (
            keyed.filter(pl.col("series_id").is_null())
            .group_by(_SERIES_KEY)
            .agg(pl.col("signal").first(), pl.col("source").first())
            .sort(_SERIES_KEY)
            .with_row_index("series_id", offset=self._written.max_series_id + 1)
            .select(SERIES_SCHEMA.names())
            .cast(SERIES_SCHEMA)
        )

    def _append(self, table: str, frame: pl.DataFrame, schema: pl.Schema) -> None:
        if frame.height == 0:
            return
        self._from_frame(
            f"INSERT INTO {table} ({column_list(schema)}) "
            f"SELECT {column_list(schema)} FROM incoming_frame",
            frame.select(schema.names()),
        )

    def _append_few(self, table: str, frame: pl.DataFrame, schema: pl.Schema) -> None:
        """`_append` for a frame of a few rows (a row a page): its columns go as list
        parameters, which costs DuckDB less than scanning an Arrow table."""
        if frame.height == 0:
            return
        self._con.execute(
            f"INSERT INTO {table} ({column_list(schema)}) "
            f"SELECT {', '.join(['unnest(?)'] * len(schema))}",
            [frame.get_column(name).to_list() for name in schema.names()],
        )

    def _from_frame(self, sql: str, frame: pl.DataFrame) -> None:
        """Run `sql`, which reads `frame` as `incoming_frame`: DuckDB finds this local Arrow
        table by its name (a replacement scan), which spares the catalogue change, and its
        cost of about a millisecond a statement, that registering a view makes."""
        incoming_frame = frame.to_arrow()  # noqa: F841 (read by name in `sql`)
        self._con.execute(sql)

    def _open_blocks(self) -> set[datetime]:
        """Blocks awaiting compaction (start times)."""
        if self._written.open_blocks is None:
            rows = self._con.execute(
                "SELECT block_ts FROM point_blocks WHERE NOT compacted"
            ).fetchall()
            self._written.open_blocks = {row[0] for row in rows}
        return self._written.open_blocks

    def _mark_blocks(self, blocks: set[datetime]) -> None:
        """Flag blocks that received points as awaiting compaction."""
        if not blocks:
            return
        touched = pl.DataFrame({"block_ts": sorted(blocks)}, schema={"block_ts": pl.Datetime("us")})
        self._con.register("touched_blocks", touched.to_arrow())
        try:
            self._con.execute(
                "INSERT INTO point_blocks SELECT block_ts, false FROM touched_blocks "
                "ON CONFLICT (block_ts) DO UPDATE SET compacted = false"
            )
        finally:
            self._con.unregister("touched_blocks")

    def count_unknown_families(self, frame: pl.DataFrame) -> None:
        """Add to the per-target tally of sample families no catalogue knows."""
        check_schema("unknown_families", frame, UNKNOWN_FAMILIES_SCHEMA)
        if frame.height == 0:
            return
        self._con.register("incoming_unknown", frame.to_arrow())
        try:
            self._con.execute(
                f"""
                INSERT INTO unknown_families ({column_list(UNKNOWN_FAMILIES_SCHEMA)})
                SELECT {column_list(UNKNOWN_FAMILIES_SCHEMA)} FROM incoming_unknown
                ON CONFLICT (target_id, family) DO UPDATE SET
                    samples = unknown_families.samples + excluded.samples,
                    first_seen_ts = least(unknown_families.first_seen_ts, excluded.first_seen_ts),
                    last_seen_ts = greatest(unknown_families.last_seen_ts, excluded.last_seen_ts)
                """
            )
        finally:
            self._con.unregister("incoming_unknown")
