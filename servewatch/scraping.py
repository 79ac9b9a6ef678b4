"""Scraping as configured: which targets, on what schedule, and how pages reach the store.

`servewatch scrape --once` fetches one round (every target at once); `servewatch scrape` and
`servewatch run` scrape each target on its own schedule (collectors/scrape/loop.py) and hand
pages to the store writer in batches through `PageBatcher`. Each of them scrapes only its
shard's targets (`scrape.shard`, collectors/scrape/shards.py), chosen afresh from the whole
list whenever the targets are resolved again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from servewatch.collectors.metrics.drop_rules import DropRules
from servewatch.collectors.metrics.ingest import MetricIngestReport, ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape import event_loop
from servewatch.collectors.scrape.loop import (
    ScheduledTarget,
    ScrapeLoop,
    ScrapeOutcome,
    default_client,
)
from servewatch.collectors.scrape.schedule import schedule_for
from servewatch.collectors.scrape.scraper import ScrapeResult, scrape_target
from servewatch.collectors.scrape.shards import ShardSelection, select_shard
from servewatch.collectors.scrape.targets import FileSdSource, Target, merge_targets
from servewatch.collectors.store_writer import StoreWriter
from servewatch.config import Config, ScrapeSettings
from servewatch.store import Clock, Store, utc_now

log = logging.getLogger("servewatch.targets")
LISTED_FAILING = 10  # failing targets named in a health answer; the rest are counted


class TargetResolver:
    """Inline targets plus every file_sd file's. The file_sd sources persist between calls, so
    a file that stops parsing keeps its last good target list in use."""

    def __init__(self) -> None:
        self._sources: dict[str, FileSdSource] = {}

    def resolve(self, config: Config) -> tuple[list[Target], list[str]]:
        """Targets and problems; problems are returned, not raised, because one unreadable
        file must not stop the scraping of the others."""
        sources = [self._sources.setdefault(str(p), FileSdSource(p)) for p in config.file_sd]
        problems = []
        for source in sources:
            source.refresh()
            if source.error:
                problems.append(source.error)
        return merge_targets([list(config.targets), *(s.targets for s in sources)]), problems


@dataclass
class _Streak:
    target: Target
    failures: int = 0
    error: str | None = None


@dataclass(frozen=True)
class HealthAnswer:
    """What `/healthz` says: `ok` is false when no target answered. The first line is the
    verdict; a second says which shard this is and what it kept, once targets are followed
    through `follow`."""

    ok: bool
    text: str


class TargetHealth:
    """Which targets are failing: a target is failing once its last `failing_after` scrapes
    all failed. Each streak is warned about once when it starts and noted when it ends, and so
    is the moment every target is failing. Safe across threads (the scrape loop records; the
    health endpoint, the self-metrics and the targets job read)."""

    def __init__(self, *, failing_after: int) -> None:
        self.failing_after = failing_after
        self._lock = threading.Lock()
        self._streaks: dict[str, _Streak] = {}
        self._none_answered = False
        self._selection: ShardSelection | None = None

    def keep(self, targets: Sequence[Target]) -> None:
        """Follow these targets; forget the streaks of any others."""
        with self._lock:
            self._streaks = {
                t.target_id: self._streaks.get(t.target_id) or _Streak(t) for t in targets
            }

    def follow(self, selection: ShardSelection) -> None:
        """Follow the targets a shard kept (only those are scraped, so only those can fail),
        and say in `answer` which shard this is and how many of the listed targets it kept."""
        self.keep(selection.kept)
        with self._lock:
            self._selection = selection

    def record(self, result: ScrapeResult) -> None:
        with self._lock:
            streak = self._streaks.get(result.target.target_id)
            if streak is None:  # a scrape that ended after its target left the configuration
                return
            if result.ok:
                if streak.failures >= self.failing_after:
                    log.info(
                        "target %s answers again after %d failed scrapes",
                        _name(streak.target),
                        streak.failures,
                    )
                streak.failures, streak.error = 0, None
                self._none_answered = False
                return
            streak.failures += 1
            streak.error = result.error
            if streak.failures == self.failing_after:
                log.warning(
                    "target %s failed %d scrapes in a row: %s",
                    _name(streak.target),
                    streak.failures,
                    streak.error,
                )
            if not self._none_answered and len(self._failing()) == len(self._streaks):
                self._none_answered = True
                log.warning(
                    "no target answered: all %d targets failed their last %d scrapes",
                    len(self._streaks),
                    self.failing_after,
                )

    def failing_count(self) -> int:
        with self._lock:
            return len(self._failing())

    def shard_selection(self) -> ShardSelection | None:
        """The shard's selection last followed (None before the first)."""
        with self._lock:
            return self._selection

    def answer(self) -> HealthAnswer:
        """ok while no target is failing; degraded (still ok) while some are; not ok when
        every target is failing."""
        with self._lock:
            failing = self._failing()
            total = len(self._streaks)
            selection = self._selection
        shard = "" if selection is None else f"\n{selection.summary()}"
        if not failing:
            return HealthAnswer(ok=True, text=f"ok{shard}")
        listed = "; ".join(
            f"{_name(s.target, url=False)} ({s.error})" for s in failing[:LISTED_FAILING]
        )
        if len(failing) > LISTED_FAILING:
            listed += f"; {len(failing) - LISTED_FAILING} more"
        summary = f"{len(failing)} of {total} targets failing: {listed}"
        if len(failing) == total:
            return HealthAnswer(ok=False, text=f"no target answered: {summary}{shard}")
        return HealthAnswer(ok=True, text=f"degraded: {summary}{shard}")

    def _failing(self) -> list[_Streak]:
        return [s for s in self._streaks.values() if s.failures >= self.failing_after]


def _name(target: Target, *, url: bool = True) -> str:
    if target.replica is None:
        return target.url
    return f"{target.replica} ({target.url})" if url else target.replica


def resolve_targets(config: Config) -> tuple[list[Target], list[str]]:
    """The configured targets, read once (see `TargetResolver`)."""
    return TargetResolver().resolve(config)


def shard_targets(targets: Sequence[Target], settings: ScrapeSettings) -> ShardSelection:
    """The targets this collector's shard scrapes out of all those listed (every target when
    the configuration names no shard)."""
    return select_shard(targets, settings.shard)


def scheduled_targets(targets: Sequence[Target], settings: ScrapeSettings) -> list[ScheduledTarget]:
    """Each target with its schedule: its own interval and timeout where it sets them."""
    return [
        ScheduledTarget(
            target=t,
            schedule=schedule_for(t, interval_s=settings.interval_s, timeout_s=settings.timeout_s),
        )
        for t in targets
    ]


class PageBatcher:
    """Scraped pages into the store through the single writer, in batches: pages are gathered
    for up to `max_delay_s`, then written in one store transaction. Scrapes spread over the
    interval arrive one by one; written one at a time, each would pay a transaction's fixed
    cost (tens of ms), and a few hundred targets would keep the writer busy. `close` writes
    what is gathered."""

    def __init__(
        self,
        writer: StoreWriter,
        *,
        keep_uncatalogued: Callable[[], bool],
        drop: Callable[[], DropRules],
        on_report: Callable[[MetricIngestReport], None],
        max_delay_s: float = 1.0,
    ) -> None:
        self._writer = writer
        self._keep_uncatalogued = keep_uncatalogued
        self._drop = drop
        self._on_report = on_report
        self._max_delay_s = max_delay_s
        self._lock = threading.Lock()
        self._pages: list[Page] = []
        self._pending = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._gather, name="page-batcher", daemon=True)
        self._thread.start()

    def add(self, page: Page) -> None:
        with self._lock:
            self._pages.append(page)
        self._pending.set()

    def close(self) -> None:
        self._closed.set()
        self._pending.set()
        self._thread.join()

    def _gather(self) -> None:
        while not self._closed.is_set():
            self._pending.wait()
            self._closed.wait(self._max_delay_s)  # gathering a batch; ends early on close
            self._pending.clear()
            self._writer.submit_task(self._write)

    def _write(self, store: Store) -> None:
        with self._lock:
            pages, self._pages = self._pages, []
        if pages:
            report = ingest_pages(
                pages,
                store=store,
                keep_uncatalogued=self._keep_uncatalogued(),
                drop=self._drop(),
            )
            self._on_report(report)


def page_of(result: ScrapeResult) -> Page:
    return Page(
        target=result.target,
        scrape_ts=result.started_ts,
        body=result.body,
        duration_s=result.duration_s,
        openmetrics=result.openmetrics if result.body is not None else None,
        error=result.error,
    )


async def fetch_results(
    targets: Sequence[Target], settings: ScrapeSettings, *, now: Clock = utc_now
) -> list[ScrapeResult]:
    """Every target once, concurrently, each with its own client and timeout; `now` stamps
    each scrape's start."""

    async def fetch(entry: ScheduledTarget) -> ScrapeResult:
        async with default_client() as client:
            return await scrape_target(
                entry.target, client=client, timeout_s=entry.schedule.timeout_s, now=now
            )

    return list(await asyncio.gather(*(fetch(e) for e in scheduled_targets(targets, settings))))


def scrape_round(
    targets: Sequence[Target], *, store: Store, settings: ScrapeSettings, now: Clock = utc_now
) -> MetricIngestReport:
    """One scrape of each of `targets` (already this shard's) into the store."""
    results = event_loop.run(fetch_results(targets, settings, now=now))
    return ingest_pages(
        [page_of(r) for r in results],
        store=store,
        keep_uncatalogued=settings.keep_uncatalogued,
        drop=settings.drop,
    )


class _PagesToBatcher:
    def __init__(self, pages: PageBatcher) -> None:
        self.pages = pages

    def scraped(self, outcome: ScrapeOutcome) -> None:
        self.pages.add(page_of(outcome.result))

    def skipped(self, target: Target, slots: int) -> None:
        """Nothing to store: the slot's scrape never started."""


def scrape_until(
    config: Config,
    *,
    store: Store,
    stop: threading.Event,
    on_report: Callable[[MetricIngestReport], None],
    on_problem: Callable[[str], None],
    on_targets: Callable[[ShardSelection], None] = lambda _: None,
    targets_every_s: float = 30.0,
) -> None:
    """Scrape this shard's configured targets, each on its own schedule, until `stop` is set,
    re-reading the targets (file_sd) every `targets_every_s` and telling `on_targets` what the
    shard kept of them; each written batch goes to `on_report`."""
    resolver = TargetResolver()
    with StoreWriter(store) as writer:
        pages = PageBatcher(
            writer,
            keep_uncatalogued=lambda: config.scrape.keep_uncatalogued,
            drop=lambda: config.scrape.drop,
            on_report=on_report,
        )
        loop = ScrapeLoop(_PagesToBatcher(pages))
        loop.start()
        try:
            while not stop.is_set():
                targets, problems = resolver.resolve(config)
                for problem in problems:
                    on_problem(problem)
                selection = shard_targets(targets, config.scrape)
                on_targets(selection)
                loop.set_targets(scheduled_targets(selection.kept, config.scrape))
                stop.wait(targets_every_s)
        finally:
            loop.stop()
            pages.close()


def collector_status(health: TargetHealth) -> dict[str, Any]:
    """What `status` shows of a running collector besides its store: its shard and /healthz."""
    answer = health.answer()
    selection = health.shard_selection()
    return {
        "pid": os.getpid(),
        "shard": None if selection is None else selection.to_json(),
        "healthz": answer.text,
        "healthz_ok": answer.ok,
    }
