"""Minute rollups read from compacted Parquet partitions, one changed partition at a time.

The partitions (`pipeline.partitions`) hold one UTC hour of request completions each, so the
minutes of an hour come from that hour's partition alone. A partition is fingerprinted by its
files' names, sizes and modification times together with how the rollup is computed (its
version, or the SLO criteria); `rollup_partitions` keeps the fingerprint each rollup was last
computed from. A run reads only the partitions whose fingerprint moved (new, rewritten by a
late span, or a change of criteria), recomputes that hour's 60 minutes with the same SQL the
`requests` table is rolled up with, and swaps them in together with the new fingerprint in one
transaction: an interrupted run leaves every hour either as it was or done, and the next run
finishes the rest. A partition that disappeared has its minutes removed. The cost of a run is
the changed partitions', whatever the history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import polars as pl

from servewatch.pipeline.partitions import (
    HOUR,
    FileState,
    PartitionNameError,
    fingerprint,
    hour_minutes,
    partition_hour,
)
from servewatch.pipeline.tables import REQUESTS_SCHEMA
from servewatch.store.partitions import PartitionError
from servewatch.store.rollups import (
    REQUEST_MINUTES_VERSION,
    GoodEventLimits,
    MinuteRollups,
    Statement,
    criteria_fingerprint,
)
from servewatch.store.sql import column_list, path_list, window_clauses

# A relation with the requests table's columns and no rows: the source of a partition gone.
_NO_REQUESTS = "(SELECT * FROM requests WHERE false)"
_ROLLUPS = ("request_minutes", "slo_minutes")


@dataclass(frozen=True)
class PartitionRollupReport:
    """One run: the partitions found on disk, those read for each rollup (in time order),
    those whose minutes were removed because their files are gone, and the requests the
    recomputed minutes count (per rollup)."""

    partitions_found: int
    read: dict[str, tuple[str, ...]]
    removed: tuple[str, ...]
    requests: dict[str, int]

    @property
    def partitions_read(self) -> int:
        """Distinct partitions read by either rollup."""
        return len({p for partitions in self.read.values() for p in partitions})


def partition_files(folder: Path) -> dict[str, list[Path]]:
    """The partitions below `folder` (`date=YYYY-MM-DD/hour=HH`) with their Parquet files;
    temporary files of a merge under way (hidden, `.partial`) are not among them."""
    if not folder.is_dir():
        raise PartitionError(f"--partitions {folder}: not a folder of compacted partitions")
    found: dict[str, list[Path]] = {}
    for hour in sorted(folder.glob("date=*/hour=*")):
        if not hour.is_dir():
            continue
        name = f"{hour.parent.name}/{hour.name}"
        try:
            partition_hour(name)
        except PartitionNameError as exc:
            raise PartitionError(f"{hour}: {exc}") from exc
        files = sorted(hour.glob("*.parquet"))
        if files:
            found[name] = files
    return found


def files_state(files: Sequence[Path]) -> list[FileState]:
    states = []
    for path in files:
        stat = path.stat()
        states.append(FileState(path.name, stat.st_size, stat.st_mtime_ns))
    return states


def _source(files: Sequence[Path]) -> str:
    return f"read_parquet({path_list(files)}, hive_partitioning = true)"


class PartitionRollups(MinuteRollups):
    """Rolls up `request_minutes` and `slo_minutes` from compacted partitions, and reads their
    requests where an analysis needs them whole (the capacity fit)."""

    def rolled_minute_span(
        self, *, from_ts: datetime | None = None, to_ts: datetime | None = None
    ) -> tuple[datetime, datetime] | None:
        """`request_minute_span` of a store rolled up from partitions, which holds the minutes
        but not the requests: the first and last minute `request_minutes` holds in
        [from_ts, to_ts)."""
        clauses, params = window_clauses("minute_ts", from_ts, to_ts)
        rows = self._con.execute(
            f"SELECT min(minute_ts), max(minute_ts) FROM request_minutes{clauses}", params
        ).fetchall()
        first, last = rows[0]
        return None if first is None else (first, last)

    def read_partition_requests(
        self, folder: Path, *, from_ts: datetime, to_ts: datetime
    ) -> pl.LazyFrame:
        """Requests that finished in [from_ts, to_ts), oldest first, as `read_requests` reads
        the store's: only the partitions of the hours the range touches are opened."""
        files = [
            path
            for name, paths in partition_files(folder).items()
            if partition_hour(name) < to_ts and partition_hour(name) + HOUR > from_ts
            for path in paths
        ]
        if not files:
            return pl.LazyFrame(schema=REQUESTS_SCHEMA)
        sql = (
            f"SELECT {column_list(REQUESTS_SCHEMA)} FROM {_source(files)} "
            "WHERE end_ts >= ? AND end_ts < ? ORDER BY end_ts"
        )
        return self._read(sql, [from_ts, to_ts], table="requests")

    def partition_fingerprints(self, rollup: str) -> dict[str, str]:
        rows = self._con.execute(
            "SELECT partition, fingerprint FROM rollup_partitions WHERE rollup = ?", [rollup]
        ).fetchall()
        return {str(p): str(f) for p, f in rows}

    def roll_up_partitions(
        self,
        folder: Path,
        *,
        criteria: Sequence[GoodEventLimits],
        on_partition: Callable[[str], None] | None = None,
    ) -> PartitionRollupReport:
        """Bring both minute rollups up to date with the partitions below `folder`, reading
        only the partitions that changed since they were last rolled up (see the module text).
        `on_partition` is told each partition once both rollups are done with it."""
        on_disk = partition_files(folder)
        states = {name: files_state(files) for name, files in on_disk.items()}
        computed_as = {
            "request_minutes": REQUEST_MINUTES_VERSION,
            "slo_minutes": criteria_fingerprint(criteria),
        }
        read: dict[str, list[str]] = {rollup: [] for rollup in _ROLLUPS}
        requests = dict.fromkeys(_ROLLUPS, 0)
        removed: set[str] = set()
        stored = {rollup: self.partition_fingerprints(rollup) for rollup in _ROLLUPS}
        names = sorted(set(on_disk) | {p for s in stored.values() for p in s}, key=partition_hour)
        for name in names:
            for rollup in _ROLLUPS:
                present = name in on_disk
                wanted = (
                    fingerprint(states[name], computed_as=computed_as[rollup]) if present else None
                )
                if stored[rollup].get(name) == wanted:
                    continue
                also: list[Statement] = (
                    [
                        (
                            "INSERT OR REPLACE INTO rollup_partitions VALUES (?, ?, ?, ?)",
                            [rollup, name, wanted, self._clock()],
                        )
                    ]
                    if present
                    else [
                        (
                            "DELETE FROM rollup_partitions WHERE rollup = ? AND partition = ?",
                            [rollup, name],
                        )
                    ]
                )
                source = _source(on_disk[name]) if present else _NO_REQUESTS
                swap = self._recompute(
                    rollup,
                    name=name,
                    source=source,
                    criteria=criteria,
                    computed_as=computed_as,
                    also=also,
                )
                requests[rollup] += swap
                if present:
                    read[rollup].append(name)
                else:
                    removed.add(name)
            if on_partition is not None:
                on_partition(name)
        return PartitionRollupReport(
            partitions_found=len(on_disk),
            read={rollup: tuple(p) for rollup, p in read.items()},
            removed=tuple(sorted(removed, key=partition_hour)),
            requests=requests,
        )

    def _recompute(
        self,
        rollup: str,
        *,
        name: str,
        source: str,
        criteria: Sequence[GoodEventLimits],
        computed_as: dict[str, str],
        also: list[Statement],
    ) -> int:
        minutes = hour_minutes(partition_hour(name))
        watermark_ts = self._clock()
        if rollup == "request_minutes":
            swap = self.recompute_request_minutes(
                minutes,
                watermark_ts=watermark_ts,
                fingerprint=computed_as[rollup],
                source=source,
                also=also,
            )
        else:
            swap = self.recompute_slo_minutes(
                minutes,
                criteria=criteria,
                watermark_ts=watermark_ts,
                fingerprint=computed_as[rollup],
                source=source,
                also=also,
            )
        return swap.requests
