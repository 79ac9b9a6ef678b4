"""`kill -9` during rollups, then restart: no minute lost or counted twice.

A child process keeps ingesting late and fresh requests and rolling up; the parent kills it
with SIGKILL at an arbitrary moment. Reopened, the store must roll up to exactly what a full
recomputation from the raw requests gives, whatever the moment of the kill was.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from servewatch.pipeline.request_minutes import EventCriterion, slo_minutes
from servewatch.store import Store
from servewatch.store.rollup_job import roll_up_requests

CHILD = """
import random, sys
from datetime import datetime, timedelta
import polars as pl
from servewatch.pipeline.request_minutes import EventCriterion
from servewatch.store.rollup_job import roll_up_requests
from servewatch.store import Store
from servewatch.pipeline.tables import REQUESTS_SCHEMA

t0 = datetime(2026, 11, 18, 10, 0, 0)
criteria = [EventCriterion("ttft", ttft_limit_s=0.5), EventCriterion("availability")]
rng = random.Random(int(sys.argv[2]))
with Store.open(sys.argv[1]) as store:
    for batch in range(10_000):
        rows = []
        for i in range(200):
            n = batch * 200 + i
            end = t0 + timedelta(seconds=rng.randrange(0, 3 * 3600))  # late data included
            rows.append({name: None for name in REQUESTS_SCHEMA.names()} | {
                "trace_id": f"{n:032x}", "span_id": f"{n:016x}", "replica": "r0",
                "arrival_ts": end - timedelta(seconds=1), "end_ts": end,
                "ok": rng.random() > 0.02, "completion_tokens": 10,
                "ttft_s": rng.choice([0.1, 0.7]), "e2e_s": 1.0, "decode_s": 0.5, "emulated": True,
            })
        store.write_requests(pl.DataFrame(rows, schema=REQUESTS_SCHEMA))
        roll_up_requests(store, criteria=criteria)
        print(batch, flush=True)
"""
CRITERIA = [EventCriterion("ttft", ttft_limit_s=0.5), EventCriterion("availability")]


@pytest.mark.slow
@pytest.mark.parametrize("kill_after_batches", [3, 8])
def test_kill_9_during_rollups_loses_and_doubles_nothing(
    tmp_path: Path, kill_after_batches: int
) -> None:
    db = tmp_path / "crash.duckdb"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db), str(kill_after_batches)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    deadline = time.monotonic() + 120
    for line in child.stdout:
        if int(line) >= kill_after_batches or time.monotonic() > deadline:
            break
    # The child went straight on to its next write and rollup: kill it in the middle of them.
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    with Store.open(db) as store:
        roll_up_requests(store, criteria=CRITERIA)
        stored = store.read_slo_minutes().collect()
        expected = slo_minutes(store.read_requests(), criteria=CRITERIA).collect()
    key = ["slo", "minute_ts", "replica", "pool", "model", "tenant"]
    assert stored.sort(key).equals(expected.sort(key))
    assert stored["total"].sum() == 2 * expected.filter(pl.col("slo") == "ttft")["total"].sum()
