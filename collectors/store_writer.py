"""The store's single writer: one thread owns every write, others hand it work.

DuckDB allows one writing process and a connection must not be used by two threads at once, so
the OTLP receiver, the scraper and the jobs submit writes here instead of touching the store.
A failed write is counted and reported through `on_error`, never lost silently, and does not
stop the writer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl

from collectors.trace_ingest import Reject, rejects_frame
from pipeline.store import Store

WriteTask = Callable[[Store], None]


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
    ) -> None:
        self._store = store
        self._on_error = on_error
        self._now = now
        self._queue: queue.Queue[WriteTask | None] = queue.Queue()
        self.counters = WriterCounters()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit_task(self, task: WriteTask) -> None:
        self._queue.put(task)

    def submit(self, rows: pl.DataFrame, rejects: list[Reject]) -> None:
        """Request rows and rejects from a trace batch (the OTLP receiver's sink)."""

        def write(store: Store) -> None:
            self.counters.new_requests += store.write_requests(rows)
            if rejects:
                self.counters.rejected_spans += len(rejects)
                store.write_ingest_errors(rejects_frame(rejects, recorded_ts=self._now()))

        self.submit_task(write)

    def flush(self) -> None:
        """Wait until everything submitted so far is written."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            try:
                if task is None:
                    return
                self.counters.tasks += 1
                task(self._store)
            except Exception as exc:  # noqa: BLE001 (a bad batch must not stop the writer)
                self.counters.failed_tasks += 1
                if self._on_error is not None:
                    self._on_error(exc)
            finally:
                self._queue.task_done()
