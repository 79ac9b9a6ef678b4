"""The incremental rollup: one new minute of requests rolled up on top of 1 day of history,
against the same on top of 30 days. Cost must grow with the new data, not with history.

Both stores hold requests at the same rate (`HISTORY_PER_S`, lower than a real fleet's so that
30 days build in minutes; what matters is that one store holds 30 times the other's rows)
with every minute already rolled up (`request_minutes` and `slo_minutes`, two SLOs). Each
round writes one new minute of requests at 170 req/s (10,200 rows, through
`Store.write_requests`, not timed) and times `roll_up_requests` (both tables, as the SLO
service runs it); the two stores take turns round by round and the medians of `ROUNDS`
rounds are compared. Stores are built once, cached, and copied before each run. Target:
within 2x of each other.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl

from bench.report import Comparison
from bench.rollup_day import CACHE, SLOS, START, hour_of_requests, insert_requests
from servewatch.store import Store
from servewatch.store.rollup_job import roll_up_requests

HISTORY_PER_S = 2.0
NEW_PER_S = 170.0
ROUNDS = 15
TARGET_RATIO = 2.0


class SteppingClock:
    """The store's clock, set by the benchmark: history is stamped in the past of each run."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        self.at += timedelta(microseconds=1)
        return self.at


def history_store(*, days: int) -> Path:
    """A store with `days` of requests at `HISTORY_PER_S`, all rolled up (cached)."""
    path = CACHE / f"rollup_history_{days}d_{HISTORY_PER_S:g}rps.duckdb"
    if path.exists():
        return path
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with Store.open(partial):
        pass
    con = duckdb.connect(str(partial))
    try:
        for hour in range(days * 24):
            insert_requests(con, hour_of_requests(hour, per_s=HISTORY_PER_S, seed=17))
    finally:
        con.close()
    end = START + timedelta(days=days)
    with Store.open(partial, clock=SteppingClock(end + timedelta(minutes=1))) as store:
        roll_up_requests(store, criteria=SLOS)
    partial.rename(path)
    return path


def new_minute(minute: datetime, *, index: int) -> pl.DataFrame:
    """One minute of requests at `NEW_PER_S`, finishing in `minute`, not yet ingested."""
    hour = hour_of_requests(0, per_s=NEW_PER_S, seed=1000 + index)
    rows = hour.filter(pl.col("end_ts") < START + timedelta(minutes=1))
    shift = minute - START
    return rows.with_columns(
        trace_id=pl.format("new-{}-", pl.lit(index)) + pl.col("trace_id"),
        arrival_ts=pl.col("arrival_ts") + shift,
        end_ts=pl.col("end_ts") + shift,
        ingested_ts=pl.lit(None, dtype=pl.Datetime("us")),
    )


def update_ms(store: Store, clock: SteppingClock, *, days: int, index: int) -> float:
    """Wall time of rolling up the `index`-th new minute after `days` of history."""
    minute = START + timedelta(days=days, minutes=index)
    clock.at = minute + timedelta(minutes=2)
    store.write_requests(new_minute(minute, index=index))
    started = time.perf_counter()
    rolled = roll_up_requests(store, criteria=SLOS)
    elapsed = (time.perf_counter() - started) * 1000
    if rolled.minutes != 1 or rolled.full:
        raise RuntimeError(f"expected one incremental minute after {days} days, got {rolled}")
    return elapsed


def median_updates_ms(days: Sequence[int]) -> dict[int, float]:
    """Median wall time of one new minute per history length, over `ROUNDS` rounds. The stores
    are open side by side and take turns, so a change in the machine's load hits both alike
    (measured one after the other, a busy minute on a shared machine passes for history)."""
    timings: dict[int, list[float]] = {d: [] for d in days}
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        opened: dict[int, tuple[Store, SteppingClock]] = {}
        for d in days:
            copy = folder / f"store_{d}d.duckdb"
            shutil.copyfile(history_store(days=d), copy)
            clock = SteppingClock(START + timedelta(days=d, minutes=2))
            opened[d] = (stack.enter_context(Store.open(copy, clock=clock)), clock)
        for index in range(ROUNDS):
            for d, (store, clock) in opened.items():
                timings[d].append(update_ms(store, clock, days=d, index=index))
    return {d: statistics.median(t) for d, t in timings.items()}


def run(*, quick: bool = False) -> list[Comparison]:
    long_days = 7 if quick else 30
    medians = median_updates_ms((1, long_days))
    short_ms, long_ms = medians[1], medians[long_days]
    what = (
        f"incremental rollup of one new minute ({int(NEW_PER_S * 60):,} requests), median of "
        f"{ROUNDS}; history at {HISTORY_PER_S:g} req/s (target: within {TARGET_RATIO:g}x)"
    )
    return [
        Comparison(
            what,
            "ms",
            f"servewatch, {long_days} days of history",
            long_ms,
            "servewatch, 1 day of history",
            short_ms,
            higher_is_better=False,
        )
    ]
