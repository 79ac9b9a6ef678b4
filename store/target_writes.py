"""The targets write path: target rows upserted, and their seen times moved, or held back.

A scrape round re-sends every target it scraped. A target that is new or changed is upserted;
one whose row would not change is not written; one whose seen times only moved gets them
written by an UPDATE, or, in a steady batch, held in memory (`SEEN_HELD_BACK`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import polars as pl

from servewatch.pipeline.tables import TARGETS_SCHEMA
from servewatch.store.connection import StoreBase
from servewatch.store.sql import check_schema, column_list

# Target rows as `_write_targets` compares them: the attributes, then the two seen times.
_SEEN = ("first_seen_ts", "last_seen_ts")
_TARGET_ROW_SCHEMA = pl.Schema(
    [(name, dtype) for name, dtype in TARGETS_SCHEMA.items() if name not in _SEEN]
    + [(name, TARGETS_SCHEMA[name]) for name in _SEEN]
)


# How far (in scrape time) targets' seen times may lag in the table while steady batches only
# move them: they are held in memory meanwhile (`_settle` writes them before any read of the
# targets, and at close), which spares most batches an UPDATE of ~1-2 ms. A crash loses at
# most this much of their movement; scrapes and points are written with every batch.
SEEN_HELD_BACK = timedelta(seconds=60)


def _merged(
    stored: object, incoming: object, pick: Callable[[datetime, datetime], datetime]
) -> object:
    """A seen time merged as the targets upsert does (least / greatest, ignoring nulls)."""
    if isinstance(stored, datetime) and isinstance(incoming, datetime):
        return pick(stored, incoming)
    return incoming if stored is None else stored


class TargetWrites(StoreBase):
    """Writes targets; holds back seen times that steady batches only move."""

    def write_targets(self, frame: pl.DataFrame) -> None:
        """Insert or update targets; first_seen_ts keeps the earliest, last_seen_ts the latest.

        A scrape round re-sends every target it scraped; targets whose row would not change
        are not written again, and targets known with the same attributes only get their
        seen times moved (an UPDATE, cheaper in DuckDB than an upsert)."""
        check_schema("targets", frame, TARGETS_SCHEMA)
        self._write_targets(frame, defer=False)
        self._unwritten_seen.clear()

    def _write_targets(
        self, frame: pl.DataFrame, *, defer: bool
    ) -> list[tuple[object, ...]] | None:
        """Write `frame`'s targets in the open transaction. With `defer`, seen times that
        only moved are not written but returned, for `_seen_committed` once the batch is;
        else (or when a target is new or changed) they are written with every seen time held
        back so far, and None is returned."""
        stored = self._stored_targets()
        moved: list[tuple[object, ...]] = []
        upserted: list[tuple[object, ...]] = []
        for row in frame.select(_TARGET_ROW_SCHEMA.names()).iter_rows():
            known = stored.get(row[0])
            if known is None or known[:-2] != row[:-2]:
                upserted.append(row)
                continue
            first = _merged(known[-2], row[-2], min)
            last = _merged(known[-1], row[-1], max)
            if (first, last) != known[-2:]:
                moved.append((*known[:-2], first, last))
        if defer and not upserted:
            stored.update((str(row[0]), row) for row in moved)
            return moved
        # Held-back seen times first: an upsert below then keeps the later of its own and them.
        self._write_seen([*self._unwritten_seen.values(), *moved])
        if upserted:
            self._con.register(
                "incoming_targets",
                pl.DataFrame(upserted, _TARGET_ROW_SCHEMA, orient="row").to_arrow(),
            )
            try:
                self._con.execute(
                    f"""
                    INSERT INTO targets ({column_list(_TARGET_ROW_SCHEMA)})
                    SELECT {column_list(_TARGET_ROW_SCHEMA)} FROM incoming_targets
                    ON CONFLICT (target_id) DO UPDATE SET
                        kind = excluded.kind, url = excluded.url, replica = excluded.replica,
                        host = excluded.host, zone = excluded.zone, model = excluded.model,
                        pool = excluded.pool, gpus = excluded.gpus,
                        gpu_uuids = excluded.gpu_uuids,
                        first_seen_ts = least(targets.first_seen_ts, excluded.first_seen_ts),
                        last_seen_ts = greatest(targets.last_seen_ts, excluded.last_seen_ts)
                    """
                )
            finally:
                self._con.unregister("incoming_targets")
            self._written.targets = None  # the upsert merged rows in SQL: read them when needed
        else:
            stored.update((str(row[0]), row) for row in moved)
        return None

    def _write_seen(self, rows: Sequence[tuple[object, ...]]) -> None:
        """Set targets' seen times to those of `rows` (target rows as `_TARGET_ROW_SCHEMA`)."""
        if not rows:
            return
        # The few rows go as list parameters: cheaper than scanning an Arrow table.
        self._con.execute(
            "UPDATE targets SET first_seen_ts = m.first_seen_ts, "
            "last_seen_ts = m.last_seen_ts FROM (SELECT unnest(?) AS target_id, "
            "unnest(?) AS first_seen_ts, unnest(?) AS last_seen_ts) m "
            "WHERE targets.target_id = m.target_id",
            [[row[0] for row in rows], [row[-2] for row in rows], [row[-1] for row in rows]],
        )

    def _seen_due(self, latest: datetime) -> bool:
        """Whether held-back seen times are to be written with a batch whose latest scrape is
        at `latest`: when none were written yet, or the last write is SEEN_HELD_BACK behind."""
        written = self._seen_written_ts
        return written is None or latest - written >= SEEN_HELD_BACK or latest < written

    def _seen_committed(self, deferred: list[tuple[object, ...]] | None, latest: datetime) -> None:
        """After a batch's commit: its held-back seen times join the others, or, if the batch
        wrote them (`deferred` None), none is held back any more."""
        if deferred is not None:
            for row in deferred:
                held = self._unwritten_seen.get(str(row[0]))
                if held is not None:  # the earliest and latest of both, as the UPDATE would
                    first = _merged(held[-2], row[-2], min)
                    row = (*row[:-2], first, _merged(held[-1], row[-1], max))  # noqa: PLW2901
                self._unwritten_seen[str(row[0])] = row
        else:
            self._unwritten_seen.clear()
            self._seen_written_ts = latest

    def _settle(self) -> None:
        """Write the seen times held back, before anything reads targets."""
        if self._unwritten_seen:
            self._write_seen(list(self._unwritten_seen.values()))
            self._unwritten_seen.clear()

    def _stored_targets(self) -> dict[str, tuple[object, ...]]:
        if self._written.targets is None:
            rows = self._con.execute(
                f"SELECT {column_list(_TARGET_ROW_SCHEMA)} FROM targets"
            ).fetchall()
            self._written.targets = {row[0]: tuple(row) for row in rows}
        return self._written.targets
