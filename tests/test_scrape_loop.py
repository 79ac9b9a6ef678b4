"""The scrape loop against real HTTP servers on 127.0.0.1: each target on its own slots, a dead
or hung target delays no other, and no target's scrapes overlap (passed slots are skipped and
counted)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servewatch.collectors.metrics.drop_rules import DropRules
from servewatch.collectors.metrics.ingest import MetricIngestReport
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape.loop import ScheduledTarget, ScrapeLoop, ScrapeOutcome
from servewatch.collectors.scrape.schedule import schedule_for
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.collectors.store_writer import StoreWriter
from servewatch.scraping import PageBatcher
from servewatch.store import Store
from tests.conftest import SAMPLE_PAGE, free_port

INTERVAL_S = 1.0
TIMEOUT_S = 0.5


class Recorder:
    """Outcomes by target; `enough` is set once every good target has `wanted` scrapes."""

    def __init__(self, good: set[str], wanted: int) -> None:
        self.lock = threading.Lock()
        self.outcomes: dict[str, list[ScrapeOutcome]] = defaultdict(list)
        self.skips: dict[str, int] = defaultdict(int)
        self.good = good
        self.wanted = wanted
        self.enough = threading.Event()

    def scraped(self, outcome: ScrapeOutcome) -> None:
        with self.lock:
            self.outcomes[outcome.result.target.target_id].append(outcome)
            if all(len(self.outcomes[t]) >= self.wanted for t in self.good):
                self.enough.set()

    def skipped(self, target: Target, slots: int) -> None:
        with self.lock:
            self.skips[target.target_id] += slots


def serve(release: threading.Event, *, hang: bool) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if hang:
                release.wait()  # never answers within the scrape timeout
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(SAMPLE_PAGE)))
            self.end_headers()
            self.wfile.write(SAMPLE_PAGE)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[tuple[list[ThreadingHTTPServer], ThreadingHTTPServer]]:
    release = threading.Event()
    good = [serve(release, hang=False) for _ in range(4)]
    hung = serve(release, hang=True)
    try:
        yield good, hung
    finally:
        release.set()
        for server in [*good, hung]:
            server.shutdown()
            server.server_close()


def vllm(
    port: int, name: str, *, interval_s: float | None = None, timeout_s: float | None = None
) -> Target:
    url = f"http://127.0.0.1:{port}/metrics"
    return Target(
        target_id=url,
        kind=TargetKind.VLLM,
        url=url,
        replica=name,
        interval_s=interval_s,
        timeout_s=timeout_s,
    )


@pytest.mark.slow
def test_targets_keep_their_slots_while_dead_and_hung_ones_are_skipped_not_stacked(
    servers: tuple[list[ThreadingHTTPServer], ThreadingHTTPServer],
) -> None:
    good_servers, hung_server = servers
    good = [vllm(s.server_address[1], f"vllm-{i}") for i, s in enumerate(good_servers)]
    dead = vllm(free_port(), "dead")
    # Its timeout is its whole interval: each scrape runs into the next slot, which is skipped.
    hung = vllm(hung_server.server_address[1], "hung", interval_s=0.6, timeout_s=0.6)
    targets = [*good, dead, hung]
    entries = [
        ScheduledTarget(t, schedule_for(t, interval_s=INTERVAL_S, timeout_s=TIMEOUT_S))
        for t in targets
    ]
    recorder = Recorder({t.target_id for t in good}, wanted=4)
    loop = ScrapeLoop(recorder)
    loop.start()
    try:
        loop.set_targets(entries)
        loop.set_targets(entries)  # unchanged: nothing restarts, nothing scraped twice
        assert loop.target_count == len(targets)
        assert recorder.enough.wait(timeout=30), "good targets were not scraped on schedule"
    finally:
        loop.stop()

    schedules = {e.target.target_id: e.schedule for e in entries}
    for t in targets:
        outcomes = recorder.outcomes[t.target_id]
        assert outcomes, t.replica
        schedule = schedules[t.target_id]
        for previous, following in itertools.pairwise(outcomes):
            # Never overlapping: each scrape starts after the previous one ended.
            ended = previous.slot_s + previous.lag_s + previous.result.duration_s
            assert following.slot_s + following.lag_s >= ended
        for outcome in outcomes:
            # On the target's own grid, at its own offset.
            assert outcome.slot_s == pytest.approx(schedule.slot_at_or_before(outcome.slot_s))
            started = outcome.result.started_ts.timestamp()
            assert started == pytest.approx(outcome.slot_s + outcome.lag_s, abs=1e-3)

    for t in good:
        outcomes = recorder.outcomes[t.target_id]
        assert all(o.result.ok for o in outcomes)
        # Dead and hung neighbours delay nothing: every slot served, promptly.
        slots = [o.slot_s for o in outcomes]
        assert [b - a for a, b in itertools.pairwise(slots)] == pytest.approx(
            [INTERVAL_S] * (len(slots) - 1)
        )
        assert max(o.lag_s for o in outcomes) < 0.5
        assert recorder.skips[t.target_id] == 0
    assert all("ConnectError" in (o.result.error or "") for o in recorder.outcomes[dead.target_id])
    hung_outcomes = recorder.outcomes[hung.target_id]
    assert all(o.result.error == "timed out after 0.6 s" for o in hung_outcomes)
    # uvloop's timers count whole milliseconds: a timeout may end up to one early.
    assert all(o.result.duration_s >= 0.6 - 0.002 for o in hung_outcomes)
    # Every hung scrape ran into its next slot, which was skipped and counted.
    assert recorder.skips[hung.target_id] >= len(hung_outcomes) - 1 >= 1


def test_the_loop_refuses_work_before_it_starts() -> None:
    loop = ScrapeLoop(Recorder(set(), wanted=1))
    with pytest.raises(RuntimeError, match="not started"):
        loop.set_targets([])
    loop.stop()  # stopping a loop never started is harmless


def test_stopping_cancels_scrapes_in_flight(
    servers: tuple[list[ThreadingHTTPServer], ThreadingHTTPServer],
) -> None:
    _, hung_server = servers
    hung = vllm(hung_server.server_address[1], "hung", interval_s=0.2, timeout_s=0.2)
    recorder = Recorder(set(), wanted=1)
    loop = ScrapeLoop(recorder, now=time.time)
    loop.start()
    loop.set_targets([ScheduledTarget(hung, schedule_for(hung, interval_s=1, timeout_s=1))])
    started = time.monotonic()
    loop.stop()
    assert time.monotonic() - started < 1.0
    assert loop.target_count == 0


def test_pages_are_written_in_one_batch_and_closing_writes_what_is_gathered() -> None:
    reports: list[MetricIngestReport] = []
    with Store.open(":memory:") as store, StoreWriter(store) as writer:
        batcher = PageBatcher(
            writer,
            keep_uncatalogued=lambda: False,
            drop=DropRules,
            on_report=reports.append,
            max_delay_s=60,
        )
        at = datetime(2026, 11, 29, 12, 0, 0)
        for i in range(3):
            target = vllm(9000 + i, f"vllm-{i}")
            batcher.add(Page(target=target, scrape_ts=at, body=SAMPLE_PAGE.decode()))
        batcher.close()  # long before the 60 s gathering delay ends
        writer.flush()
        assert store.count("scrapes") == 3
    assert [r.pages for r in reports] == [3]
