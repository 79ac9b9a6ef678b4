"""The single store writer: tasks run in order, a failing task is counted and reported."""

from __future__ import annotations

from servewatch.collectors.store_writer import StoreWriter
from servewatch.store import Store, StoreError


def test_a_failing_write_is_counted_and_later_writes_still_run() -> None:
    errors: list[Exception] = []
    seen: list[int] = []

    def failing(store: Store) -> None:
        raise StoreError("disk full")

    with Store.open(":memory:") as store, StoreWriter(store, on_error=errors.append) as writer:
        writer.submit_task(lambda s: seen.append(1))
        writer.submit_task(failing)
        writer.submit_task(lambda s: seen.append(s.schema_version))
        writer.flush()
        assert seen == [1, store.schema_version]
        assert writer.counters.failed_tasks == 1
        assert writer.counters.tasks == 3
        assert [str(e) for e in errors] == ["disk full"]
