"""A batch of exposition pages (one scrape round of a fleet) parsed into one sample frame.

This module owns the batched form of `collectors.metrics.exposition`: the pages share one
`SeriesCache`, so replicas that expose the same series (every replica of a pool serving one
model does) cost one parse of each series key and label set, and their samples come back as a
single Polars frame with a `page` column, ready to be joined to scrape targets and stored.
Each page keeps its own result (errors, families, skipped `_created` samples) in `pages`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from servewatch.collectors.metrics.exposition import (
    SAMPLES_SCHEMA,
    ParsedPage,
    SeriesCache,
    parse_exposition,
)

BATCH_SCHEMA = pl.Schema({"page": pl.UInt32(), **SAMPLES_SCHEMA})


@dataclass(frozen=True, slots=True)
class ParsedBatch:
    """All samples of the batch in one frame (`page` is the index into the input), and each
    page's own result."""

    samples: pl.DataFrame
    pages: tuple[ParsedPage, ...]


def parse_expositions(
    pages: Sequence[str],
    *,
    openmetrics: bool | Sequence[bool | None] | None = None,
    cache: SeriesCache | None = None,
) -> ParsedBatch:
    """Parse many pages at once; `openmetrics` is one choice for all pages or one per page.

    Like `parse_exposition` it never raises for bad input; a page's malformed lines are in
    that page's `errors`. Pass a long-lived `cache` to carry repeated series across rounds.
    """
    flags = _flags(openmetrics, len(pages))
    shared = SeriesCache() if cache is None else cache
    parsed = tuple(
        parse_exposition(text, openmetrics=flag, cache=shared)
        for text, flag in zip(pages, flags, strict=True)
    )
    return ParsedBatch(samples=_frame(parsed), pages=parsed)


def _flags(openmetrics: bool | Sequence[bool | None] | None, n_pages: int) -> list[bool | None]:
    if openmetrics is None or isinstance(openmetrics, bool):
        return [openmetrics] * n_pages
    flags = list(openmetrics)
    if len(flags) != n_pages:
        raise ValueError(
            f"openmetrics has {len(flags)} entries for {n_pages} pages; "
            "give one bool or None for all pages, or one per page"
        )
    return flags


def _frame(parsed: tuple[ParsedPage, ...]) -> pl.DataFrame:
    chain = itertools.chain.from_iterable
    page_index = chain(itertools.repeat(i, len(page)) for i, page in enumerate(parsed))
    return pl.DataFrame(
        [
            pl.Series("page", list(page_index), dtype=pl.UInt32),
            pl.Series("metric", list(chain(p.metric for p in parsed)), dtype=pl.String),
            pl.Series("labels", list(chain(p.labels for p in parsed)), dtype=pl.String),
            pl.Series("value", list(chain(p.value for p in parsed)), dtype=pl.Float64),
            pl.Series("timestamp_ms", list(chain(p.timestamp_ms for p in parsed)), dtype=pl.Int64),
        ]
    )
