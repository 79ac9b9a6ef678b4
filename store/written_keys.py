"""What the points write path remembers of the keys it stored, so a steady batch need not ask."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl

SERIES_IDS_SCHEMA = pl.Schema(
    {
        "target_id": pl.String(),
        "metric": pl.String(),
        "labels": pl.String(),
        "series_id": pl.Int32(),
    }
)


@dataclass
class WrittenKeys:
    """What the write path knows of the keys stored, so that a steady batch need not ask
    the tables: targets as stored, each target's latest scrape time, each target's series
    ids (and the highest id), the blocks awaiting compaction. None: not read yet; each is
    read from its table when first needed. Changed only after a commit, so a rolled-back
    batch leaves it as the tables are. Valid while this Store is the only writer of its file
    (DuckDB locks a file to one process; within one, `write_scrapes` is the only writer of
    scrapes and series); should another connection write anyway, the tables' keys still
    refuse a duplicate, and `write_scrapes` then reads them again and retries once."""

    targets: dict[str, tuple[object, ...]] | None = None
    latest_scrape: dict[str, datetime] | None = None
    series: dict[str, pl.DataFrame] | None = None
    max_series_id: int = 0
    open_blocks: set[datetime] | None = None

    def committed(self, scrapes: pl.DataFrame, series: pl.DataFrame, blocks: set[datetime]) -> None:
        if self.latest_scrape is not None:
            # A row a page: few enough for Python, which costs less here than a group-by.
            for target, ts in scrape_keys(scrapes):
                known = self.latest_scrape.get(target)
                self.latest_scrape[target] = ts if known is None else max(known, ts)
        if self.series is not None and series.height:
            ids = series.select(SERIES_IDS_SCHEMA.names())
            for (target,), part in ids.partition_by("target_id", as_dict=True).items():
                known_ids = self.series.get(str(target))
                self.series[str(target)] = (
                    part if known_ids is None else pl.concat([known_ids, part], rechunk=True)
                )
            self.max_series_id = max(self.max_series_id, max_id(ids))
        if self.open_blocks is not None:
            self.open_blocks |= blocks

    def compacted(self, block_ts: datetime) -> None:
        if self.open_blocks is not None:
            self.open_blocks.discard(block_ts)


def scrape_keys(scrapes: pl.DataFrame) -> list[tuple[str, datetime]]:
    """(target, time) of each scrape: a row a page, few enough for Python lists, which cost
    less here than a Polars select."""
    targets: list[str] = scrapes.get_column("target_id").to_list()
    times: list[datetime] = scrapes.get_column("ts").to_list()
    return list(zip(targets, times, strict=True))


def max_id(ids: pl.DataFrame) -> int:
    return int(ids.select(pl.col("series_id").max().fill_null(0)).item())
