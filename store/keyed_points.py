"""Points given by series id: what a writer that had the ids from the store writes unjoined.

The store numbers series; `SeriesIds` are a target's ids for some keys as one store numbered
them, and `KeyedPoints` a scrape's values by those ids (an ingest's steady pages).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

import polars as pl

from servewatch.store.written_keys import scrape_keys

_ISSUERS = itertools.count(1)


def new_issuer() -> int:
    """A number for a store object, unique in the process: its `SeriesIds` carry it."""
    return next(_ISSUERS)


@dataclass(frozen=True)
class SeriesIds:
    """A target's series ids for some (metric, labels) keys, in the keys' order, as one store
    numbered them (`PointWrites.series_ids`); good for that store alone."""

    issuer: int
    target_id: str
    ids: tuple[int, ...]

    @cached_property
    def ascending(self) -> bool:
        return all(a < b for a, b in itertools.pairwise(self.ids))

    @cached_property
    def column(self) -> pl.Series:
        """The ids as a `series_id` column, made once for every scrape that repeats them."""
        return pl.Series("series_id", self.ids, dtype=pl.Int32)


@dataclass(frozen=True)
class KeyedPoints:
    """One scrape's points given by series id: `values[i]` of series `series.ids[i]` at the
    scrape's time. Its scrape is among those written with it; the store skips the points of a
    scrape it already holds, as it skips that scrape's samples."""

    series: SeriesIds
    scrape_ts: datetime
    values: Sequence[float | None]


def keyed_of(
    scrapes: pl.DataFrame, keyed: Mapping[tuple[str, datetime], KeyedPoints]
) -> dict[tuple[str, datetime], KeyedPoints]:
    """The keyed points of `scrapes` (one chunk of a batch)."""
    return {key: keyed[key] for key in scrape_keys(scrapes) if key in keyed}


def keyed_frame(
    keyed: Sequence[KeyedPoints], *, new: set[tuple[str, datetime]]
) -> tuple[pl.DataFrame, bool]:
    """The points of the `new` scrapes among `keyed`, as `points_head` stores them, and
    whether they are in series and time order already: pages whose ids ascend and whose id
    ranges follow one another need no sort."""
    taken = sorted(
        (p for p in keyed if (p.series.target_id, p.scrape_ts) in new and p.series.ids),
        key=lambda p: (p.series.ids[0], p.scrape_ts),
    )
    ordered = all(p.series.ascending for p in taken) and all(
        a.series.ids[-1] < b.series.ids[0] for a, b in itertools.pairwise(taken)
    )
    # As `_points` makes a sample's time: microseconds cast to milliseconds.
    times_ms = (
        pl.Series([p.scrape_ts for p in taken], dtype=pl.Datetime("us"))
        .dt.cast_time_unit("ms")
        .to_physical()
        .to_list()
    )
    chain = itertools.chain.from_iterable
    times = chain(
        itertools.repeat(ms, len(p.values)) for p, ms in zip(taken, times_ms, strict=True)
    )
    frame = pl.DataFrame(
        [
            pl.concat([p.series.column for p in taken]) if taken else _NO_IDS,
            pl.Series("ts", list(times), dtype=pl.Int64).cast(pl.Datetime("ms")),
            pl.Series("value", list(chain(p.values for p in taken)), dtype=pl.Float64),
        ]
    )
    return frame, ordered


_NO_IDS = pl.Series("series_id", [], dtype=pl.Int32)
