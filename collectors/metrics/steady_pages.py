"""Steady pages: a target's page that repeats its last page's text in everything but values.

A target exposes the same series in the same order scrape after scrape; only the values move.
So the ingest remembers, per target, what its last clean page became: the page's shape (its
`#` lines and series keys, `exposition.PageShape`), the rows it stored (canonical name, labels,
signal and source, and which of the page's values each row holds), its uncatalogued tally, its
dropped count and its kind. A later page of that target with the same shape is stored from
this memory: its values are read by the parser's own steps (`shaped_values`) and put in place,
with no series key parsed, no catalogue join and no kind told again.

Exact by construction: what a page becomes is a function of its text outside the values, its
target's kind, the catalogue and the ingest's options, and the memory is learnt from the full
path's own result for a page, checked against the values the steady path reads from it. Only a
clean page is learnt (no malformed line, no timestamps, no infinite value, a kind that could be
told, no block-counted counters to convert); any other page, or a page whose shape moved, goes
the full way, and the golden replays and differential tests hold both ways to one result.
"""

from __future__ import annotations

import array
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from servewatch.collectors.metrics.catalogue import Catalogue, entry_value
from servewatch.collectors.metrics.exposition import (
    PageShape,
    ParsedPage,
    page_shape,
    picker,
    shaped_values,
)
from servewatch.collectors.metrics.page_kind import PageKind
from servewatch.pipeline.tables import UNKNOWN_FAMILIES_SCHEMA
from servewatch.store import Store
from servewatch.store.keyed_points import KeyedPoints, SeriesIds

# Remembered pages per thread and options. A vLLM page's memory is ~80 KB of Python objects
# (its lines but values) and ~40 KB of rows, about what the parser's series cache already keeps
# for the target: ~120 MB for 1,000 targets. Past the bound the memory starts again.
MAX_TARGETS = 10_000
MAX_STORES = 4  # stores a remembered page keeps series ids for
MISSES_BEFORE_BACKING_OFF = 3
LEARN_EVERY = 16
# The stored columns a steady page's rows repeat, and the catalogue's value columns of the rows
# whose entry rescales, blanks or clamps their values.
ROW_COLUMNS = ("metric", "labels", "signal", "source")
_VALUE_COLUMNS = (
    "_cat_scale",
    "_cat_blank_at",
    "_cat_blank_values",
    "_cat_clamp_lo",
    "_cat_clamp_hi",
)
_RESCALES = "_rescales"


Picker = Callable[[Sequence[float]], tuple[float, ...]]


@dataclass(frozen=True)
class SteadyPage:
    """What a clean page of a target became, for the next page of the same shape."""

    kind: str  # the target's kind as configured: a remembered page holds for that kind only
    shape: PageShape
    told: PageKind
    rows: pl.DataFrame  # ROW_COLUMNS (and the value columns where `rescales`)
    values: Picker  # the rows' values from the page's values
    rescales: bool
    unknown: tuple[tuple[str, int], ...]  # uncatalogued samples by family
    dropped: int
    positions: tuple[int, ...] = ()  # each row's value: its index among the page's values
    # The rows' series ids in the stores that hold them (by `Store.issuer`), in ascending
    # order, with the values' picker in that order: a page whose values need no catalogue
    # expression is then written by id (`KeyedPoints`), in the order points are stored.
    series: dict[int, tuple[SeriesIds, Picker]] = field(default_factory=dict)

    def keyed(self, issuer: int) -> tuple[SeriesIds, Picker] | None:
        return None if self.rescales else self.series.get(issuer)

    def remember_ids(self, ids: SeriesIds) -> None:
        """Keep `ids` (the rows' series ids in one store, in row order) in ascending order."""
        if len(self.series) >= MAX_STORES:
            self.series.clear()
        order = sorted(range(len(ids.ids)), key=ids.ids.__getitem__)
        ascending = SeriesIds(ids.issuer, ids.target_id, tuple(ids.ids[i] for i in order))
        self.series[ids.issuer] = (ascending, picker([self.positions[i] for i in order]))


@dataclass(frozen=True)
class SteadyMatch:
    """A page recognised as steady: its index in the batch, memory and values."""

    index: int
    page: SteadyPage
    values: list[float]


class SteadyPages:
    """The remembered pages of one thread's ingests with one set of options, by target."""

    def __init__(self, *, max_targets: int = MAX_TARGETS) -> None:
        self._pages: dict[str, SteadyPage] = {}
        self._max_targets = max_targets
        # Pages in a row that did not match their target's memory. A target whose page moves
        # every scrape (a label that changes each time) would otherwise be learnt again on
        # every one; past MISSES_BEFORE_BACKING_OFF it is learnt only now and then.
        self._misses: dict[str, int] = {}

    def recognise(
        self, pages: Sequence[tuple[str, str, str | None, bool | None]]
    ) -> list[SteadyMatch]:
        """The steady ones among (target id, kind, body, openmetrics) pages."""
        found: list[SteadyMatch] = []
        for index, (target_id, kind, body, openmetrics) in enumerate(pages):
            remembered = self._pages.get(target_id)
            if body is None or remembered is None or remembered.kind != kind:
                continue
            values = shaped_values(body, remembered.shape, openmetrics=openmetrics)
            if values is None:
                self._misses[target_id] = self._misses.get(target_id, 0) + 1
            else:
                self._misses.pop(target_id, None)
                found.append(SteadyMatch(index, remembered, values))
        return found

    def learns(self, target_id: str) -> bool:
        """Whether to learn this target's clean page: always, unless its pages have missed
        their memory MISSES_BEFORE_BACKING_OFF times in a row; then one miss in LEARN_EVERY."""
        misses = self._misses.get(target_id, 0)
        return misses < MISSES_BEFORE_BACKING_OFF or misses % LEARN_EVERY == 0

    def unkeyed(self, target_ids: Sequence[str], issuer: int) -> list[tuple[str, SteadyPage]]:
        """The remembered pages of `target_ids` without series ids in store `issuer` (whose
        values need no catalogue expression)."""
        found = []
        for target_id in dict.fromkeys(target_ids):
            page = self._pages.get(target_id)
            if page is not None and not page.rescales and issuer not in page.series:
                found.append((target_id, page))
        return found

    def learn_series_ids(self, target_ids: Sequence[str], store: Store) -> None:
        """Remember the series ids `store` gave the rows of these targets' remembered pages,
        so that their next pages are written by id."""
        for target_id, page in self.unkeyed(target_ids, store.issuer):
            ids = store.series_ids(target_id, page.rows)
            if ids is not None:
                page.remember_ids(ids)

    def learn_pages(
        self,
        pages: Mapping[int, CleanPage],
        *,
        rows: pl.DataFrame,
        unknown: pl.DataFrame,
        undropped: Mapping[int, int],
    ) -> None:
        """Remember what each of `pages` (by page number, each one the memory `learns`)
        became: `rows` are the rows the full path stored for them (`page`, `position` in
        the batch frame and ROW_COLUMNS), `unknown` their uncatalogued samples by `page` and
        `family`, `undropped` their samples left after the drop rules, by page."""
        tallies: dict[int, list[tuple[str, int]]] = {}
        for index, family, count in unknown.sort("page", "family").iter_rows():
            tallies.setdefault(index, []).append((family, count))
        for (index,), own in rows.partition_by("page", as_dict=True).items():
            clean = pages[int(index)]
            learnt = learnt_page(
                clean,
                rows=own.with_columns(pl.col("position") - clean.start),
                unknown=tuple(tallies.get(int(index), ())),
                dropped=len(clean.parsed) - undropped.get(int(index), 0),
            )
            if learnt is None:
                continue
            if clean.target_id not in self._pages and len(self._pages) >= self._max_targets:
                self._pages.clear()
                self._misses.clear()
            self._pages[clean.target_id] = learnt


@dataclass(frozen=True)
class CleanPage:
    """A page the full path read with nothing to note, as the memory learns it."""

    target_id: str
    kind: str  # the target's kind as configured
    body: str
    openmetrics: bool | None
    parsed: ParsedPage
    told: PageKind
    catalogue: Catalogue  # the catalogue of its told kind
    start: int  # its first sample's position in the batch frame


def learnt_page(
    clean: CleanPage, *, rows: pl.DataFrame, unknown: tuple[tuple[str, int], ...], dropped: int
) -> SteadyPage | None:
    """The memory of a clean page, or None if the steady path would not read it so. `rows`
    are the rows the full path stored for it: ROW_COLUMNS and `position`, the index among the
    page's parsed samples of the sample each row holds."""
    shape = page_shape(clean.body, openmetrics=clean.openmetrics)
    if shape is None:
        return None
    read = shaped_values(clean.body, shape, openmetrics=clean.openmetrics)
    if read is None or _bits(read) != _bits(clean.parsed.value):
        return None
    positions: list[int] = rows.get_column("position").to_list()
    changing = {e.exposed for e in clean.catalogue.entries if e.changes_value}
    names = [clean.parsed.metric[p] for p in positions]
    rescales = any(name in changing for name in names)
    kept = rows.select(ROW_COLUMNS)
    if rescales:
        entries = clean.catalogue.entry_frame().select("exposed", *_VALUE_COLUMNS).collect()
        kept = (
            kept.with_columns(exposed=pl.Series(names, dtype=pl.String))
            .join(entries, on="exposed", how="left", maintain_order="left")
            .with_columns(pl.col("exposed").is_in(list(changing)).alias(_RESCALES))
            .drop("exposed")
        )
    values = picker(positions)
    return SteadyPage(
        clean.kind, shape, clean.told, kept, values, rescales, unknown, dropped, tuple(positions)
    )


def keyed_points(
    matches: Sequence[SteadyMatch], *, issuer: int, scrape_ts: Sequence[datetime]
) -> tuple[list[SteadyMatch], list[KeyedPoints]]:
    """The matches whose remembered page holds series ids in store `issuer`, as its
    `KeyedPoints` (`scrape_ts` gives each match's scrape time); the others, to be stored as
    rows (`steady_rows`)."""
    by_rows: list[SteadyMatch] = []
    keyed: list[KeyedPoints] = []
    for match, ts in zip(matches, scrape_ts, strict=True):
        by_id = match.page.keyed(issuer)
        if by_id is None:
            by_rows.append(match)
        else:
            ids, values = by_id
            keyed.append(KeyedPoints(ids, ts, values(match.values)))
    return by_rows, keyed


def steady_rows(matches: Sequence[SteadyMatch]) -> pl.DataFrame:
    """The rows the matched pages store: ROW_COLUMNS, `page` (the match's index) and `value`,
    each from its page's values and, where its entry changes values, through the catalogue's
    own expression (`entry_value`)."""
    pages = [m.index for m in matches for _ in range(m.page.rows.height)]
    values = [v for m in matches for v in m.page.values(m.values)]
    rows = [m.page.rows for m in matches]
    # Pages whose rows carry the catalogue's value columns are concatenated by name.
    rescaled = any(m.page.rescales for m in matches)
    frame = pl.concat(
        rows, how="diagonal_relaxed" if rescaled else "vertical", rechunk=False
    ).with_columns(
        page=pl.Series(pages, dtype=pl.UInt32), value=pl.Series(values, dtype=pl.Float64)
    )
    if rescaled:
        frame = frame.with_columns(
            value=pl.when(pl.col(_RESCALES).fill_null(value=False))
            .then(entry_value(pl.col("value")))
            .otherwise(pl.col("value"))
        ).drop(_RESCALES, *_VALUE_COLUMNS)
    return frame


def steady_unknown(
    matches: Sequence[SteadyMatch],
    scrapes: Sequence[tuple[str, datetime]],
    unknown: pl.DataFrame,
) -> pl.DataFrame:
    """`unknown` (the full path's uncatalogued tally by target and family) with the matched
    pages' added; `scrapes` gives each match's target and scrape time."""
    tallied = [
        (target_id, family, count, ts, ts)
        for m, (target_id, ts) in zip(matches, scrapes, strict=True)
        for family, count in m.page.unknown
    ]
    if not tallied:
        return unknown
    added = pl.DataFrame(tallied, schema=UNKNOWN_FAMILIES_SCHEMA, orient="row")
    return (
        pl.concat([unknown, added.select(unknown.columns)], how="vertical_relaxed")
        .group_by("target_id", "family")
        .agg(
            pl.col("samples").sum(),
            pl.col("first_seen_ts").min(),
            pl.col("last_seen_ts").max(),
        )
    )


def _bits(values: Sequence[float]) -> bytes:
    """The values' bits, so that a NaN equals itself and -0.0 differs from 0.0."""
    return array.array("d", values).tobytes()


_THREAD = threading.local()


def steady_memory(options: tuple[object, ...]) -> SteadyPages:
    """This thread's remembered pages for ingests with `options` (what a page becomes besides
    its text: whether uncatalogued families are kept, the drop rules)."""
    memories: dict[tuple[object, ...], SteadyPages] | None = getattr(_THREAD, "memories", None)
    if memories is None:
        memories = {}
        _THREAD.memories = memories
    if options not in memories:
        if len(memories) >= 8:  # options change rarely; a few sets are kept
            memories.clear()
        memories[options] = SteadyPages()
    return memories[options]
