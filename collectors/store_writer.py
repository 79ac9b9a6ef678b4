"""The store's single writer: one thread owns every write, others hand it work.

DuckDB allows one writing process and a connection must not be used by two threads at once, so
the OTLP receiver, the scraper and the jobs submit writes here instead of touching the store.
A failed write is counted and reported through `on_error`, never lost silently, and does not
stop the writer. Trace batches are written together: a DuckDB insert into the deduplicated
`requests` table costs about ten milliseconds before its first row (a few microseconds per row
after), so the writer takes the trace batches queued behind the first and keeps collecting while
they keep coming: until none arrives for `MERGE_GAP_S` (0.05 s), for at most `linger_s` (0.2 s)
or 100,000 rows. A busy receiver so writes a few large inserts a second instead of one small
insert per export, while a lone exporter, which waits for each answer before it sends again,
waits one gap for its commit, not the whole linger; `flush()` and `close()` end the wait at once.

`submit` returns a `TraceCommit` that is resolved once the batch's insert has committed (or
failed): the OTLP receiver answers an export only then, so an acknowledged span is in the store
file even if the process is killed the next moment. After `close()` begins, submits are
refused at once (the commit is resolved as failed) rather than queued behind the stop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import polars as pl

from servewatch.collectors.traces.ingest import Reject, rejects_frame
from servewatch.store import Store

WriteTask = Callable[[Store], object]  # what a task returns is ignored
T = TypeVar("T")
# Trace batches merged into one insert at most; about 100 exports of 1,000 spans. Below about
# this many rows an insert costs more per row (docs/benchmarks.md, otlp_receive); at a DuckDB
# row group (122,880) or more it is written ahead of its commit and the file grows by 70 %.
MAX_MERGED_ROWS = 100_000
LINGER_S = 0.2
MERGE_GAP_S = 0.05


class NotCommittedError(Exception):
    """A submitted trace batch is not in the store: its write failed, the writer was closing,
    or it was not written in the time waited."""


class TraceCommit:
    """What became of one submitted trace batch; `wait` until its write has committed."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: str | None = None

    @classmethod
    def refused(cls, reason: str) -> TraceCommit:
        commit = cls()
        commit.resolve(reason)
        return commit

    @classmethod
    def committed(cls) -> TraceCommit:
        """An already committed batch (for sinks that keep nothing)."""
        commit = cls()
        commit.resolve(None)
        return commit

    def resolve(self, error: str | None) -> None:
        """Called once by the writer: `error` None when the batch committed."""
        self._error = error
        self._done.set()

    def wait(self, timeout_s: float) -> None:
        """Return once the batch is committed; raise NotCommittedError if its write failed or
        is still pending after `timeout_s` seconds."""
        if not self._done.wait(timeout_s):
            raise NotCommittedError(f"the store did not commit the batch within {timeout_s:g} s")
        if self._error is not None:
            raise NotCommittedError(self._error)


@dataclass(frozen=True)
class _TraceBatch:
    rows: pl.DataFrame
    rejects: list[Reject]
    commit: TraceCommit


class _Flush:
    """Queued by `flush()`: ends a merge's wait, writes nothing."""


_Item = WriteTask | _TraceBatch | _Flush | None


@dataclass
class WriterCounters:
    tasks: int = 0
    failed_tasks: int = 0
    new_requests: int = 0
    rejected_spans: int = 0


class StoreWriter:
    """Runs submitted writes in order on one thread. Use as a context manager."""

    def __init__(
        self,
        store: Store,
        *,
        on_error: Callable[[Exception], None] | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        linger_s: float = LINGER_S,
    ) -> None:
        self._store = store
        self._linger_s = linger_s
        self._on_error = on_error
        self._now = now
        self._queue: queue.Queue[_Item] = queue.Queue()
        self._held: list[_Item] = []  # taken from the queue while merging, runs next
        # Guards `_closing` with the puts, so that nothing is queued behind the stop.
        self._closing_lock = threading.Lock()
        self._closing = False
        self.counters = WriterCounters()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit_task(self, task: WriteTask) -> None:
        self._queue.put(task)

    def call(self, task: Callable[[Store], T], *, timeout_s: float) -> T:
        """Run `task` on the writer's thread, in turn with the writes, and return what it
        returns (or raise what it raised): how other threads read the store. TimeoutError
        when it has not finished within `timeout_s`; refused once the writer is closing."""
        done: Future[T] = Future()

        def run(store: Store) -> None:
            if not done.set_running_or_notify_cancel():
                return
            try:
                done.set_result(task(store))
            except Exception as exc:  # noqa: BLE001 (handed to the caller, who raises it)
                done.set_exception(exc)

        with self._closing_lock:
            if self._closing:
                raise NotCommittedError("the store writer is stopping")
            self._queue.put(run)
        try:
            return done.result(timeout=timeout_s)
        except FuturesTimeout as exc:
            done.cancel()
            raise TimeoutError(f"the store did not answer within {timeout_s:g} s") from exc

    def submit(self, rows: pl.DataFrame, rejects: list[Reject]) -> TraceCommit:
        """Request rows and rejects from a trace batch (the OTLP receiver's sink); the commit
        is resolved once they are written, or at once if the writer is closing."""
        with self._closing_lock:
            if self._closing:
                return TraceCommit.refused("the store writer is stopping")
            commit = TraceCommit()
            self._queue.put(_TraceBatch(rows, rejects, commit))
        return commit

    def _write_traces(self, store: Store, batches: list[_TraceBatch]) -> None:
        frames = [b.rows for b in batches if b.rows.height]
        if frames:
            rows = frames[0] if len(frames) == 1 else pl.concat(frames, rechunk=False)
            self.counters.new_requests += store.write_requests(rows)
        rejects = [r for b in batches for r in b.rejects]
        if rejects:
            self.counters.rejected_spans += len(rejects)
            store.write_ingest_errors(rejects_frame(rejects, recorded_ts=self._now()))

    def _merge(self, first: _TraceBatch) -> list[_TraceBatch]:
        """`first` and the trace batches queued behind it or arriving within `linger_s`, each
        within `MERGE_GAP_S` of the one before; the next other item ends the merge and is
        held."""
        batches, rows = [first], first.rows.height
        deadline = time.monotonic() + self._linger_s
        while rows < MAX_MERGED_ROWS:
            wait = min(deadline - time.monotonic(), MERGE_GAP_S)
            try:
                item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if not isinstance(item, _TraceBatch):
                self._held.append(item)
                break
            batches.append(item)
            rows += item.rows.height
        return batches

    def flush(self) -> None:
        """Wait until everything submitted so far is written."""
        self._queue.put(_Flush())
        self._queue.join()

    def close(self) -> None:
        """Write everything submitted so far, then stop; later submits are refused."""
        with self._closing_lock:
            self._closing = True
            self._queue.put(None)
        self._thread.join()

    def _next(self) -> _Item:
        if self._held:
            return self._held.pop()
        return self._queue.get()

    def _run(self) -> None:
        while True:
            item = self._next()
            taken = 1
            batches: list[_TraceBatch] = []
            try:
                if item is None:
                    return
                if isinstance(item, _Flush):
                    continue
                self.counters.tasks += 1
                if isinstance(item, _TraceBatch):
                    batches = self._merge(item)
                    taken = len(batches)
                    self._write_traces(self._store, batches)
                    for batch in batches:
                        batch.commit.resolve(None)
                else:
                    item(self._store)
            except Exception as exc:  # noqa: BLE001 (a bad batch must not stop the writer)
                self.counters.failed_tasks += 1
                for batch in batches:
                    batch.commit.resolve(f"the store write failed: {exc}")
                if self._on_error is not None:
                    self._on_error(exc)
            finally:
                for _ in range(taken):
                    self._queue.task_done()
