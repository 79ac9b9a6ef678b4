"""The store's DuckDB threads follow the CPUs the process may run on, not the machine's."""

from __future__ import annotations

import os

import pytest

from pipeline.store import Store


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_a_process_pinned_to_one_cpu_gets_one_duckdb_thread() -> None:
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        with Store.open(":memory:") as store:
            assert store._scalar("SELECT current_setting('threads')") == 1
    finally:
        os.sched_setaffinity(0, cpus)
    with Store.open(":memory:") as store:
        assert store._scalar("SELECT current_setting('threads')") >= min(len(cpus), 2)
