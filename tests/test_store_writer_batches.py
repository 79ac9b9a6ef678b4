"""The store writer merges trace batches queued together into one insert, in order, and tells
each submitter when its batch is committed."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import polars as pl
import pytest

from servewatch.collectors.store_writer import NotCommittedError, StoreWriter
from servewatch.collectors.traces.ingest import Reject
from servewatch.pipeline.tables import REQUESTS_SCHEMA
from servewatch.store import Store


def request_rows(span_ids: list[str]) -> pl.DataFrame:
    n = len(span_ids)
    ts = pl.Series([datetime(2026, 11, 29, 12)] * n, dtype=pl.Datetime("us"))
    data = {
        "trace_id": ["0" * 32] * n,
        "span_id": span_ids,
        "arrival_ts": ts,
        "end_ts": ts,
        "ok": [True] * n,
        "emulated": [False] * n,
    }
    return (
        pl.DataFrame(data)
        .with_columns(
            pl.lit(None, dtype=REQUESTS_SCHEMA[name]).alias(name)
            for name in REQUESTS_SCHEMA.names()
            if name not in data
        )
        .select(REQUESTS_SCHEMA.names())
    )


def test_queued_trace_batches_are_merged_deduplicated_and_kept_in_order() -> None:
    gate = threading.Event()
    order: list[str] = []
    with Store.open(":memory:") as store, StoreWriter(store) as writer:
        # Hold the writer so that everything below is queued before it runs.
        writer.submit_task(lambda s: gate.wait())
        writer.submit(request_rows(["a" * 16, "b" * 16]), [])
        writer.submit(request_rows(["b" * 16, "c" * 16]), [Reject("otlp-http", "r1", "bad")])
        writer.submit_task(lambda s: order.append(f"task saw {s.count('requests')}"))
        writer.submit(request_rows(["d" * 16]), [])
        writer.submit(request_rows([]), [])
        gate.set()
        writer.flush()
        assert order == ["task saw 3"]
        assert store.count("requests") == 4
        assert writer.counters.new_requests == 4
        assert writer.counters.rejected_spans == 1
        assert store.count("ingest_errors") == 1
        # The gate, two merged batches, the task, then the last two merged.
        assert writer.counters.tasks == 4
        assert writer.counters.failed_tasks == 0


def test_close_ends_the_linger_and_still_stops_the_writer() -> None:
    with Store.open(":memory:") as store:
        writer = StoreWriter(store, linger_s=30.0)
        writer.submit(request_rows(["e" * 16]), [])
        # The writer waits up to 30 s for more batches; close() queues its stop behind the
        # batch, and the merge must hand it back rather than wait on (or swallow it and hang).
        closer = threading.Thread(target=writer.close, daemon=True)
        closer.start()
        closer.join(timeout=10)
        assert not closer.is_alive()
        assert store.count("requests") == 1
        assert writer.counters.new_requests == 1


def test_batches_arriving_within_the_linger_share_an_insert_and_flush_ends_the_wait() -> None:
    with Store.open(":memory:") as store, StoreWriter(store, linger_s=30.0) as writer:
        writer.submit(request_rows(["a" * 16]), [])
        writer.submit(request_rows(["b" * 16, "c" * 16]), [])
        started = time.monotonic()
        writer.flush()
        # flush() ends the 30 s wait at once rather than after it.
        assert time.monotonic() - started < 10
        # One merged write, whether the second batch came during the wait or before it.
        assert writer.counters.tasks == 1
        assert store.count("requests") == 3


def test_a_batch_commit_resolves_after_the_insert_and_merged_batches_share_it() -> None:
    gate = threading.Event()
    with Store.open(":memory:") as store, StoreWriter(store) as writer:
        writer.submit_task(lambda s: gate.wait())
        first = writer.submit(request_rows(["a" * 16]), [])
        second = writer.submit(request_rows(["b" * 16]), [])
        with pytest.raises(NotCommittedError, match=r"did not commit the batch within 0\.01 s"):
            first.wait(0.01)
        gate.set()
        first.wait(10)
        assert store.count("requests") == 2  # both were in the insert that resolved the first
        second.wait(10)
        assert writer.counters.tasks == 2


def test_a_failed_write_fails_every_commit_of_its_merge_and_the_writer_goes_on() -> None:
    gate = threading.Event()
    with Store.open(":memory:") as store, StoreWriter(store) as writer:
        writer.submit_task(lambda s: gate.wait())
        good = writer.submit(request_rows(["a" * 16]), [])
        bad = writer.submit(request_rows(["b" * 16]).drop("source"), [])
        gate.set()
        for commit in (good, bad):
            with pytest.raises(NotCommittedError, match="the store write failed: "):
                commit.wait(10)
        writer.submit(request_rows(["c" * 16]), []).wait(10)
        assert store.read_requests().collect()["span_id"].to_list() == ["c" * 16]


def test_a_closing_writer_refuses_new_batches_and_commits_the_queued_ones() -> None:
    with Store.open(":memory:") as store:
        writer = StoreWriter(store, linger_s=30.0)
        queued = writer.submit(request_rows(["a" * 16]), [])
        writer.close()
        queued.wait(0)
        with pytest.raises(NotCommittedError, match="the store writer is stopping"):
            writer.submit(request_rows(["b" * 16]), []).wait(10)
        assert store.count("requests") == 1


def test_a_lone_batch_commits_after_one_gap_not_the_whole_linger() -> None:
    # An exporter waits for each answer before it sends again: were its batch held for the
    # whole linger (30 s here), every export would take that long.
    with Store.open(":memory:") as store, StoreWriter(store, linger_s=30.0) as writer:
        writer.submit(request_rows(["a" * 16]), []).wait(5)
        assert store.count("requests") == 1
