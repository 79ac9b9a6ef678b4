"""The scrape loop: every target scraped on its own schedule, concurrently, on one event loop.

Each target has one task that sleeps to its next slot (collectors/scrape/schedule.py), scrapes
with the target's timeout and hands the outcome to an observer. The next slot is chosen after
the scrape has finished, so a target's scrapes cannot overlap; a slot that passed meanwhile is
skipped and reported, never stacked. A slow or dead target holds only its own task, never the
others'. The loop runs on its own thread; the target list can be replaced from any thread, and
only the targets whose schedule changed are restarted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from servewatch.collectors.scrape.event_loop import new_event_loop
from servewatch.collectors.scrape.page_client import PageClient, environment_proxy
from servewatch.collectors.scrape.schedule import (
    TargetSchedule,
    catch_up,
    lag_s,
    next_after_scrape,
)
from servewatch.collectors.scrape.scraper import ScrapeClient, ScrapeResult, scrape_target
from servewatch.collectors.scrape.targets import Target

log = logging.getLogger("servewatch.scrape")
MIN_SLEEP_S = 0.001

EpochClock = Callable[[], float]


@dataclass(frozen=True)
class ScheduledTarget:
    target: Target
    schedule: TargetSchedule


@dataclass(frozen=True)
class ScrapeOutcome:
    """One scrape and where it sat in its schedule: `lag_s` is its start minus its slot."""

    result: ScrapeResult
    slot_s: float
    lag_s: float


class ScrapeObserver(Protocol):
    """Receives outcomes on the loop's thread; it must return quickly (hand work elsewhere)."""

    def scraped(self, outcome: ScrapeOutcome) -> None: ...

    def skipped(self, target: Target, slots: int) -> None: ...


def _naive_utc(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, tz=UTC).replace(tzinfo=None)


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def default_client() -> PageClient:
    """A client for one target, which keeps its connection alive from scrape to scrape.
    Timeouts are set per scrape, from the target's schedule. (One each: a shared httpx pool
    scanned all its connections on every request, ~14 ms of CPU a scrape over hundreds of
    targets; a pool a target keeps each scrape's work its own.)"""
    return PageClient(tls=_tls, proxy_for=environment_proxy())


class ScrapeLoop:
    """Per-target scraping on a background thread. `start`, then `set_targets` as often as the
    target list changes, then `stop`. `client` makes each target's HTTP client."""

    def __init__(
        self,
        observer: ScrapeObserver,
        *,
        now: EpochClock = time.time,
        client: Callable[[], ScrapeClient] = default_client,
    ) -> None:
        self._observer = observer
        self._now = now
        self._make_client = client
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: dict[str, tuple[ScheduledTarget, asyncio.Task[None]]] = {}

    # -- from any thread ------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the scrape loop is already started")
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._main, args=(ready,), name="scrape-loop", daemon=True
        )
        self._thread.start()
        ready.wait()

    def set_targets(self, targets: Sequence[ScheduledTarget]) -> None:
        """Scrape exactly these from now on; unchanged targets keep their running schedule."""
        self._call(functools.partial(self._apply, list(targets))).result()

    def stop(self) -> None:
        """Cancel every scrape (including those in flight) and end the thread."""
        if self._loop is None or self._thread is None:
            return
        self._call(self._shutdown).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = None
        self._thread = None

    @property
    def target_count(self) -> int:
        return len(self._tasks)

    # -- on the loop's thread -------------------------------------------------------------

    def _call(self, coroutine: Callable[[], Coroutine[Any, Any, None]]) -> Future[None]:
        if self._loop is None:
            raise RuntimeError("the scrape loop is not started: call start() first")
        return asyncio.run_coroutine_threadsafe(coroutine(), self._loop)

    def _main(self, ready: threading.Event) -> None:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        loop.call_soon(ready.set)
        loop.run_forever()

    async def _apply(self, targets: list[ScheduledTarget]) -> None:
        wanted = {entry.target.target_id: entry for entry in targets}
        for target_id, (entry, task) in list(self._tasks.items()):
            if wanted.get(target_id) != entry:
                task.cancel()
                del self._tasks[target_id]
        for target_id, entry in wanted.items():
            if target_id not in self._tasks:
                task = asyncio.create_task(self._run(entry), name=f"scrape {target_id}")
                self._tasks[target_id] = (entry, task)

    async def _shutdown(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    async def _sleep_until(self, at_s: float) -> None:
        # The event loop sleeps on the monotonic clock while slots are on the wall clock; sleep
        # again if it woke before the slot by the wall clock.
        # uvloop's timers count whole milliseconds and may wake one early; the rest, under a
        # millisecond, is slept as one (a shorter sleep returns at once and would spin).
        while (delay := at_s - self._now()) > 0:
            await asyncio.sleep(max(delay, MIN_SLEEP_S))

    def _scraped(self, outcome: ScrapeOutcome) -> None:
        try:
            self._observer.scraped(outcome)
        except Exception:
            # An observer fault must not stop this target's scraping.
            log.exception("scrape observer failed")

    def _skipped(self, target: Target, slots: int) -> None:
        if not slots:
            return
        try:
            self._observer.skipped(target, slots)
        except Exception:
            log.exception("scrape observer failed")

    async def _run(self, entry: ScheduledTarget) -> None:
        async with self._make_client() as client:
            await self._scrape_on_schedule(entry, client)

    async def _scrape_on_schedule(self, entry: ScheduledTarget, client: ScrapeClient) -> None:
        target, schedule = entry.target, entry.schedule
        slot = schedule.slot_at_or_after(self._now())
        while True:
            await self._sleep_until(slot)
            caught = catch_up(schedule, slot_s=slot, woke_s=self._now())
            self._skipped(target, caught.skipped)
            slot = caught.slot_s
            started_s = self._now()
            result = await scrape_target(
                target,
                client=client,
                timeout_s=schedule.timeout_s,
                now=functools.partial(_naive_utc, started_s),
            )
            lag = lag_s(slot_s=slot, started_s=started_s)
            self._scraped(ScrapeOutcome(result=result, slot_s=slot, lag_s=lag))
            following = next_after_scrape(schedule, slot_s=slot, finished_s=self._now())
            self._skipped(target, following.skipped)
            slot = following.slot_s
