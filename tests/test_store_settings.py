"""The store's DuckDB settings: threads follow the CPUs the process may run on, not the
machine's; the write-ahead log is checkpointed at 64 MB, not 16."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servewatch.store import Store


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_a_process_pinned_to_one_cpu_gets_one_duckdb_thread() -> None:
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        with Store.open(":memory:") as store:
            assert store.setting("threads") == "1"
    finally:
        os.sched_setaffinity(0, cpus)
    with Store.open(":memory:") as store:
        assert int(store.setting("threads")) >= min(len(cpus), 2)


def test_the_write_ahead_log_is_checkpointed_at_64_mb(tmp_path: Path) -> None:
    for where in (":memory:", tmp_path / "store.duckdb"):
        with Store.open(where) as store:
            assert store.setting("checkpoint_threshold") == "61.0 MiB"  # 64 MB in MiB
