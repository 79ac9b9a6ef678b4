"""Metric ingest: scraped pages parsed, catalogued and written to the store as scrapes.

A page is one target's exposition at one instant, from a live scrape, a recorded fixture or a
file. Bad input loses nothing else: a malformed line is left out, named (line number and what
was wrong) in the scrape's `error` and in `ingest_errors`, and every well-formed sample of the
page is stored. Prometheus drops a whole page for one bad line; an observability tool that goes
blind to a replica because of one odd label would hide exactly the fleet it should show.
By default only catalogued families are stored; the others are tallied in `unknown_families`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import polars as pl

from servewatch.collectors.metrics.block_counts import BlockPages, block_pages, in_tokens
from servewatch.collectors.metrics.catalogue import (
    Catalogue,
    Disposition,
    SourceRule,
)
from servewatch.collectors.metrics.drop_rules import DropRules
from servewatch.collectors.metrics.exposition import LineError, ParsedPage, SeriesCache
from servewatch.collectors.metrics.exposition_batch import parse_expositions
from servewatch.collectors.metrics.key_catalogue import catalogued_by_key
from servewatch.collectors.metrics.page import Page, scrape_row
from servewatch.collectors.metrics.page_kind import CATALOGUES, PageKind, page_kinds
from servewatch.collectors.metrics.steady_pages import (
    ROW_COLUMNS,
    CleanPage,
    SteadyPages,
    keyed_points,
    steady_memory,
    steady_rows,
    steady_unknown,
)
from servewatch.collectors.scrape.targets import Target, TargetKind, targets_frame
from servewatch.collectors.traces.ingest import Reject, rejects_frame
from servewatch.pipeline.tables import SAMPLES_SCHEMA, SCRAPES_SCHEMA, UNKNOWN_FAMILIES_SCHEMA
from servewatch.store import Store
from servewatch.store.keyed_points import KeyedPoints

NO_DROP = DropRules()
_PAGE = ["target_id", "scrape_ts"]


@dataclass
class MetricIngestReport:
    pages: int = 0
    new_scrapes: int = 0
    new_points: int = 0
    stored_samples: int = 0
    steady_pages: int = 0  # pages stored from their target's last page (`steady_pages`)
    unknown_samples: int = 0
    dropped_samples: int = 0
    line_errors: list[Reject] = field(default_factory=list)
    failed_scrapes: list[Reject] = field(default_factory=list)


# A page whose kind cannot be told: every sample is kept uncatalogued, from no known source.
_UNTOLD = Catalogue(name="untold", entries=(), source_rule=SourceRule(default=None))


def _catalogue_of(told: PageKind) -> Catalogue:
    return _UNTOLD if told.kind is None else CATALOGUES[told.kind]


def _page_kinds(
    pages: Sequence[Page], fetched: Sequence[int], samples: pl.DataFrame
) -> dict[int, PageKind]:
    """Each fetched page's kind: its target's, or told from its families (`page_kind`)."""
    told = [i for i in fetched if pages[i].target.kind is TargetKind.AUTO]
    kinds = page_kinds(samples.lazy(), pages=told) if told else {}
    return {i: kinds[i] if i in kinds else PageKind(pages[i].target.kind) for i in fetched}


_THREAD = threading.local()


def _series_cache() -> SeriesCache:
    """The parser's cache of series keys, kept across calls: each scrape of a target repeats
    its series keys, so from a target's second scrape on its keys are looked up, not parsed
    (results are the same with or without a cache). One per thread, since a cache must not be
    shared by threads (it is cleared when full); it is bounded by `SeriesCache.max_entries`."""
    cache: SeriesCache | None = getattr(_THREAD, "series_cache", None)
    if cache is None:
        cache = SeriesCache()
        _THREAD.series_cache = cache
    return cache


@dataclass(frozen=True)
class _Prepared:
    """A batch made ready for the store: its scrape rows, samples and uncatalogued tally."""

    scrapes: pl.DataFrame
    samples: pl.DataFrame
    unknown: pl.DataFrame
    targets: pl.DataFrame
    keyed: list[KeyedPoints]  # steady pages' points, by the series ids this store gave

    @property
    def stored_samples(self) -> int:
        return self.samples.height + sum(len(points.values) for points in self.keyed)


def ingest_pages(
    pages: Sequence[Page],
    *,
    store: Store,
    keep_uncatalogued: bool = True,
    drop: DropRules = NO_DROP,
) -> MetricIngestReport:
    """Parse, catalogue and store `pages`; scrapes already stored are skipped (idempotent).

    Every sample is stored, catalogued or not, unless `drop` names its family or
    `keep_uncatalogued` is off (then uncatalogued families are only counted). A page of a
    target of kind AUTO is catalogued as the kind its families show; one that shows none, or
    several, is stored uncatalogued and its scrape names why.

    A page is the unit of failure: should reading one page fail in a way the parser did not
    foresee, the batch is read again page by page and that page alone becomes a failed
    scrape, named in `scrapes` and `ingest_errors`; the other pages are stored as usual.

    Of several pages of one target at one time, the first is the scrape: the others are
    skipped, as a scrape already stored is."""
    report = MetricIngestReport(pages=len(pages))
    pages = _first_of_each_scrape(pages)
    unread: list[Reject] = []  # pages that could not be read, as their failed scrapes
    try:
        prepared = _prepare(
            pages, report, keep_uncatalogued=keep_uncatalogued, drop=drop, issuer=store.issuer
        )
    except Exception:  # noqa: BLE001 (isolated below, page by page)
        report = MetricIngestReport(pages=report.pages)
        prepared, unread = _prepare_each(
            pages, report, keep_uncatalogued=keep_uncatalogued, drop=drop
        )
    report.new_scrapes, report.new_points = store.write_scrapes(
        prepared.scrapes, prepared.samples, targets=prepared.targets, keyed=prepared.keyed
    )
    report.stored_samples = prepared.stored_samples
    memory = steady_memory((keep_uncatalogued, drop))
    memory.learn_series_ids([p.target.target_id for p in pages], store)
    unknown = prepared.unknown
    report.unknown_samples = int(unknown["samples"].sum()) if unknown.height else 0
    if report.new_scrapes:
        store.count_unknown_families(unknown.cast(UNKNOWN_FAMILIES_SCHEMA))
    errors = report.line_errors + unread
    if errors:
        store.write_ingest_errors(rejects_frame(errors, recorded_ts=store.now()))
    return report


def _first_of_each_scrape(pages: Sequence[Page]) -> Sequence[Page]:
    first: dict[tuple[str, datetime], Page] = {}
    for page in pages:
        first.setdefault((page.target.target_id, page.scrape_ts), page)
    return pages if len(first) == len(pages) else list(first.values())


def _prepare_each(
    pages: Sequence[Page], report: MetricIngestReport, *, keep_uncatalogued: bool, drop: DropRules
) -> tuple[_Prepared, list[Reject]]:
    """`_prepare` one page at a time; a page that fails becomes a failed scrape, also returned
    on its own (it goes to `ingest_errors`, which a fetch failure does not)."""
    parts: list[_Prepared] = []
    unread: list[Reject] = []
    for page in pages:
        own = MetricIngestReport()
        try:
            parts.append(
                _prepare([page], own, keep_uncatalogued=keep_uncatalogued, drop=drop, issuer=0)
            )
        except Exception as exc:  # noqa: BLE001 (the page's failure, recorded as its scrape's)
            own = MetricIngestReport()
            failed = Page(
                page.target,
                page.scrape_ts,
                None,
                page.duration_s,
                error=f"the page could not be read: {type(exc).__name__}: {exc}",
            )
            parts.append(
                _prepare([failed], own, keep_uncatalogued=keep_uncatalogued, drop=drop, issuer=0)
            )
            unread += own.failed_scrapes
        report.line_errors += own.line_errors
        report.failed_scrapes += own.failed_scrapes
        report.dropped_samples += own.dropped_samples
        report.steady_pages += own.steady_pages
    prepared = _Prepared(
        scrapes=pl.concat([p.scrapes for p in parts]),
        samples=pl.concat([p.samples for p in parts]),
        unknown=pl.concat([p.unknown for p in parts]),
        targets=pl.concat([p.targets for p in parts]),
        keyed=[],
    )
    return prepared, unread


def _prepare(
    pages: Sequence[Page],
    report: MetricIngestReport,
    *,
    keep_uncatalogued: bool,
    drop: DropRules,
    issuer: int,
) -> _Prepared:
    """Parse and catalogue `pages` into the rows the store takes; line errors and failed
    scrapes are added to `report`. Steady pages (`steady_pages`) are placed from their
    target's memory, by series id where it holds those of the store numbered `issuer`; the
    others go the full way, and teach the memory."""
    memory = steady_memory((keep_uncatalogued, drop))
    steady = memory.recognise(
        [(p.target.target_id, p.target.kind.value, p.body, p.openmetrics) for p in pages]
    )
    full = _read_pages(
        pages,
        sorted(set(range(len(pages))).difference(m.index for m in steady)),
        report,
        keep_uncatalogued=keep_uncatalogued,
        drop=drop,
        memory=memory,
    )
    kinds = dict(full.kinds)
    counts = dict(full.counts)
    stored, unknown = full.stored, full.unknown
    keyed: list[KeyedPoints] = []
    if steady:
        kinds.update((m.index, m.page.told) for m in steady)
        counts.update((m.index, m.page.rows.height) for m in steady)
        report.dropped_samples += sum(m.page.dropped for m in steady)
        report.steady_pages += len(steady)
        unknown = steady_unknown(
            steady,
            [(pages[m.index].target.target_id, pages[m.index].scrape_ts) for m in steady],
            unknown,
        )
        by_rows, keyed = keyed_points(
            steady, issuer=issuer, scrape_ts=[pages[m.index].scrape_ts for m in steady]
        )
        if by_rows:
            paged = _paged(pages)
            stored = pl.concat(
                [
                    stored,
                    steady_rows(by_rows)
                    .select(*ROW_COLUMNS, "value", **paged, ts=paged["scrape_ts"])
                    .select(SAMPLES_SCHEMA.names())
                    .cast(SAMPLES_SCHEMA),
                ]
            )
    scrapes = pl.DataFrame(
        [
            scrape_row(page, full.errors.get(i, ()), kinds.get(i), counts.get(i, 0))
            for i, page in enumerate(pages)
        ],
        schema=SCRAPES_SCHEMA,
        orient="row",
    )
    return _Prepared(scrapes, stored, unknown, _targets_frame(pages, kinds), keyed)


def _paged(pages: Sequence[Page]) -> dict[str, pl.Expr]:
    """Each sample's target and scrape time, by its page number: a gather."""
    target_id = pl.lit(pl.Series([p.target.target_id for p in pages], dtype=pl.String))
    scrape_ts = pl.lit(pl.Series([p.scrape_ts for p in pages], dtype=pl.Datetime("us")))
    return {
        "target_id": target_id.gather(pl.col("page")),
        "scrape_ts": scrape_ts.gather(pl.col("page")),
    }


_NO_UNKNOWN = pl.DataFrame(schema=UNKNOWN_FAMILIES_SCHEMA)


@dataclass(frozen=True)
class _Read:
    """The full path's result for some pages of a batch, by page index."""

    stored: pl.DataFrame
    unknown: pl.DataFrame
    counts: dict[int, int]  # stored samples
    kinds: dict[int, PageKind]
    errors: dict[int, list[LineError]]


def _read_pages(
    pages: Sequence[Page],
    chosen: Sequence[int],
    report: MetricIngestReport,
    *,
    keep_uncatalogued: bool,
    drop: DropRules,
    memory: SteadyPages,
) -> _Read:
    """Parse and catalogue the `chosen` pages, each sample numbered by its index in `pages`;
    the clean ones are remembered in `memory`."""
    if not chosen:
        return _Read(pl.DataFrame(schema=SAMPLES_SCHEMA), _NO_UNKNOWN, {}, {}, {})
    fetched: list[int] = []
    for index in chosen:
        page = pages[index]
        if page.body is None:
            where = f"scrape {page.scrape_ts.isoformat()}Z"
            report.failed_scrapes.append(
                Reject(page.target.target_id, where, page.error or "no page")
            )
        else:
            fetched.append(index)
    batch = parse_expositions(
        [pages[i].body or "" for i in fetched],
        openmetrics=[pages[i].openmetrics for i in fetched],
        cache=_series_cache(),
    )
    parsed: dict[int, ParsedPage] = dict(zip(fetched, batch.pages, strict=True))
    samples = batch.samples.with_row_index("position")
    if fetched != list(range(len(pages))):
        # Page numbers of the batch become indices into `pages` (a batch of every page is
        # numbered so already).
        samples = samples.with_columns(
            page=pl.Series(fetched, dtype=pl.UInt32).gather(samples.get_column("page"))
        )
    parsed_count = samples.height
    samples = drop.kept(samples)
    report.dropped_samples += parsed_count - samples.height
    kinds = _page_kinds(pages, fetched, samples)
    blocks = block_pages({i: parsed[i] for i in fetched if kinds[i].kind is TargetKind.VLLM})
    samples = in_tokens(samples, blocks=blocks)
    report.line_errors += _page_notes(pages, kinds, blocks)
    by_kind: dict[TargetKind | None, list[int]] = {}
    for index in fetched:
        by_kind.setdefault(kinds[index].kind, []).append(index)
    catalogued: list[pl.LazyFrame] = []
    for kind, indices in by_kind.items():
        own = samples if len(by_kind) == 1 else samples.filter(pl.col("page").is_in(indices))
        catalogued.append(catalogued_by_key(own, catalogue=_catalogue_of(PageKind(kind))))
    for index, result in sorted(parsed.items()):
        page = pages[index]
        for line_error in result.errors:
            location = f"scrape {page.scrape_ts.isoformat()}Z line {line_error.line}"
            report.line_errors.append(Reject(page.target.target_id, location, line_error.message))

    wanted = [Disposition.CATALOGUED.value]
    if keep_uncatalogued:
        wanted.append(Disposition.UNKNOWN.value)
    all_samples = (
        pl.concat(catalogued, how="diagonal_relaxed")
        if catalogued
        else pl.LazyFrame(
            schema={"page": pl.UInt32, "position": pl.UInt32, "timestamp_ms": pl.Int64}
            | {"family": pl.String}
            | dict.fromkeys(("metric", "labels", "signal", "source"), pl.String)
            | {"value": pl.Float64, "disposition": pl.String}
        )
    )
    paged = _paged(pages)
    kept = all_samples.filter(pl.col("disposition").is_in(wanted))
    unknown_samples = all_samples.filter(pl.col("disposition") == Disposition.UNKNOWN.value)
    # The clean pages the memory takes: their rows are collected below only for it.
    clean = [
        i
        for i in fetched
        if not parsed[i].errors
        and kinds[i].error is None
        and i not in blocks.block_size
        and parsed[i].timestamp_ms.count(None) == len(parsed[i])
        and memory.learns(pages[i].target.target_id)
    ]
    stored, per_page, unknown, learnt, learnt_unknown, learnt_undropped = pl.collect_all(
        [
            kept.select(
                **paged,
                ts=pl.coalesce(
                    pl.from_epoch(pl.col("timestamp_ms"), time_unit="ms").cast(pl.Datetime("us")),
                    paged["scrape_ts"],
                ),
                metric=pl.col("metric"),
                labels=pl.col("labels"),
                signal=pl.col("signal"),
                source=pl.col("source"),
                value=pl.col("value"),
            ).cast(SAMPLES_SCHEMA),
            kept.group_by("page").len(),
            unknown_samples.with_columns(**paged)
            .group_by("target_id", "family")
            .agg(
                samples=pl.len().cast(pl.Int64),
                first_seen_ts=pl.col("scrape_ts").min(),
                last_seen_ts=pl.col("scrape_ts").max(),
            ),
            kept.filter(pl.col("page").is_in(clean)).select("page", "position", *ROW_COLUMNS),
            unknown_samples.filter(pl.col("page").is_in(clean)).group_by("page", "family").len(),
            samples.lazy().filter(pl.col("page").is_in(clean)).group_by("page").len(),
        ]
    )
    if clean:
        starts = itertools.accumulate(map(len, batch.pages[:-1]), initial=0)
        memory.learn_pages(
            {
                i: CleanPage(
                    target_id=pages[i].target.target_id,
                    kind=pages[i].target.kind.value,
                    body=pages[i].body or "",
                    openmetrics=pages[i].openmetrics,
                    parsed=parsed[i],
                    told=kinds[i],
                    catalogue=_catalogue_of(kinds[i]),
                    start=start,
                )
                for i, start in zip(fetched, starts, strict=True)
                if i in clean
            },
            rows=learnt,
            unknown=learnt_unknown,
            undropped=dict(learnt_undropped.iter_rows()),
        )
    return _Read(
        stored=stored,
        unknown=unknown,
        counts=dict(per_page.iter_rows()),
        kinds=kinds,
        errors={i: parsed[i].errors for i in fetched},
    )


UNCONVERTED_BLOCKS = (
    "the prefix-cache counters count KV blocks (vLLM <= 0.8.5) and the page has no "
    "cache_config_info block_size to convert them to tokens: stored as blocks"
)


def _page_notes(
    pages: Sequence[Page], kinds: Mapping[int, PageKind], blocks: BlockPages
) -> list[Reject]:
    """What a page's kind or units left unsettled, for `ingest_errors`."""
    notes = [(index, kind.error) for index, kind in kinds.items() if kind.error is not None]
    notes += [(index, UNCONVERTED_BLOCKS) for index in blocks.unconverted()]
    return [
        Reject(pages[i].target.target_id, f"scrape {pages[i].scrape_ts.isoformat()}Z", note)
        for i, note in sorted(notes)
    ]


def _targets_frame(pages: Sequence[Page], kinds: Mapping[int, PageKind]) -> pl.DataFrame:
    """The batch's targets, an AUTO target under the kind its latest told page showed."""
    seen: dict[str, tuple[Target, datetime, datetime]] = {}
    for index, page in enumerate(pages):
        target, first, last = seen.get(
            page.target.target_id, (page.target, page.scrape_ts, page.scrape_ts)
        )
        told = kinds[index].kind if index in kinds else None
        if target.kind is TargetKind.AUTO and told is not None and page.scrape_ts >= last:
            target = replace(target, kind=told)
        seen[target.target_id] = (target, min(first, page.scrape_ts), max(last, page.scrape_ts))
    return targets_frame(seen.values())
