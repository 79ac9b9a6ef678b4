"""SLO evaluation: 20 SLOs over 30 days of minute rollups, one evaluation instant.

Ours: one pass of `slo.burn_rate.window_sums_at` (sums of the 8 alert windows and the
period of every SLO), then `slo.alerting.alert_conditions` (burn rates, the low-traffic guard,
every window pair's condition) and `slo.budget.budget_from_sums` (budget consumed and
remaining, current burn, time to exhaustion): what the every-minute job and
`servewatch slo status` need. The target is under 200 ms.
Peers, on the same minutes: the same window sums (good and total of every window of every
SLO, nothing else) as one DuckDB query with FILTER aggregates over a native table, and as a
plain Polars group_by. Best of several runs for each; sums are checked equal before timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

import duckdb
import polars as pl

from bench.report import Comparison
from servewatch.slo.alerting import alert_conditions
from servewatch.slo.budget import budget_from_sums
from servewatch.slo.burn_rate import window_sums_at
from servewatch.slo.spec import AvailabilitySli, SloSpec
from servewatch.slo.windows import default_burn_windows

AT = datetime(2026, 12, 1)
RUNS = 7
TARGET_MS = 200.0


def minute_rollups(*, n_slos: int, days: int, seed: int = 11) -> pl.DataFrame:
    """One row per SLO and minute: 200-2000 requests, and in about 2 % of minutes 0.2 % of
    them failing, like a healthy fleet. Pseudo-random from hashes, so generation is fast."""
    minutes = days * 1440
    start = AT - timedelta(days=days)
    row = pl.col("row")
    total = (200 + row.hash(seed) % 1800).cast(pl.Int64)
    bad = pl.when(row.hash(seed + 1) % 50 == 0).then(total // 500).otherwise(0)
    return (
        pl.DataFrame({"row": pl.int_range(n_slos * minutes, eager=True, dtype=pl.Int64)})
        .with_columns(
            minute_ts=pl.lit(start, dtype=pl.Datetime("us")) + pl.duration(minutes=row % minutes),
            slo=pl.format("slo-{}", (row // minutes).cast(pl.String).str.zfill(2)),
            total=total,
        )
        .with_columns(good=pl.col("total") - bad)
        .select("minute_ts", "slo", "good", "total")
    )


def specs_for(n_slos: int) -> list[SloSpec]:
    return [
        SloSpec(f"slo-{i:02d}", AvailabilitySli(), 0.999, 30 * 86400, default_burn_windows())
        for i in range(n_slos)
    ]


def ours(frame: pl.DataFrame, specs: list[SloSpec]) -> tuple[pl.DataFrame, pl.DataFrame]:
    sums = window_sums_at(frame.lazy(), specs=specs, at=AT).collect().lazy()
    conditions, budgets = pl.collect_all(
        [sums.pipe(alert_conditions, specs=specs), sums.pipe(budget_from_sums, specs=specs)]
    )
    return conditions, budgets


def window_lengths(specs: list[SloSpec]) -> list[int]:
    return sorted({w for s in specs for w in s.window_lengths_s()})


def duckdb_sums(con: duckdb.DuckDBPyConnection, lengths: list[int]) -> pl.DataFrame:
    columns = ", ".join(
        f"sum({what}) FILTER (WHERE minute_ts >= ?::TIMESTAMP - INTERVAL {n} SECOND) AS {what}_{n}"
        for n in lengths
        for what in ("good", "total")
    )
    sql = (
        f"SELECT slo, {columns} FROM minutes "
        f"WHERE minute_ts >= ?::TIMESTAMP - INTERVAL {lengths[-1]} SECOND "
        "AND minute_ts < ?::TIMESTAMP GROUP BY slo ORDER BY slo"
    )
    params = [AT] * (2 * len(lengths)) + [AT, AT]
    result: pl.DataFrame = con.sql(sql, params=params).pl()
    return result


def polars_sums(frame: pl.DataFrame, lengths: list[int]) -> pl.DataFrame:
    ts = pl.col("minute_ts")
    return (
        frame.filter((ts >= AT - timedelta(seconds=lengths[-1])) & (ts < AT))
        .group_by("slo")
        .agg(
            pl.col(what).filter(ts >= AT - timedelta(seconds=n)).sum().alias(f"{what}_{n}")
            for n in lengths
            for what in ("good", "total")
        )
        .sort("slo")
    )


def best_ms(work: Callable[[], object]) -> float:
    work()  # warm caches and thread pools before timing
    timings = []
    for _ in range(RUNS):
        started = time.perf_counter()
        work()
        timings.append((time.perf_counter() - started) * 1000)
    return min(timings)


def check_same_sums(frame: pl.DataFrame, specs: list[SloSpec], peer: pl.DataFrame) -> None:
    mine = {
        (r["slo"], r["window_s"]): (r["good"], r["total"])
        for r in window_sums_at(frame.lazy(), specs=specs, at=AT).collect().iter_rows(named=True)
    }
    theirs = {
        (r["slo"], n): (int(r[f"good_{n}"]), int(r[f"total_{n}"]))
        for r in peer.iter_rows(named=True)
        for n in window_lengths(specs)
    }
    if mine != theirs:
        wrong = sorted(k for k in mine if mine[k] != theirs.get(k))[:3]
        raise RuntimeError(f"window sums differ from the peer's at {wrong}")


def measure(*, n_slos: int = 20, days: int = 30) -> list[Comparison]:
    frame = minute_rollups(n_slos=n_slos, days=days)
    specs = specs_for(n_slos)
    lengths = window_lengths(specs)
    con = duckdb.connect()
    con.register("incoming", frame.to_arrow())
    con.execute("CREATE TABLE minutes AS SELECT * FROM incoming")
    con.unregister("incoming")
    check_same_sums(frame, specs, duckdb_sums(con, lengths))
    check_same_sums(frame, specs, polars_sums(frame, lengths))

    ours_ms = best_ms(lambda: ours(frame, specs))
    duck_ms = best_ms(lambda: duckdb_sums(con, lengths))
    polars_ms = best_ms(lambda: polars_sums(frame, lengths))
    con.close()
    what = f"evaluate {n_slos} SLOs over {days} days of minute rollups ({frame.height:,} rows)"
    ours_label = f"servewatch sums + alert conditions + budgets (target < {TARGET_MS:.0f} ms)"
    return [
        Comparison(what, "ms", ours_label, ours_ms, "DuckDB FILTER sums only", duck_ms, False),
        Comparison(what, "ms", ours_label, ours_ms, "Polars group_by sums only", polars_ms, False),
    ]


def run(*, quick: bool = False) -> list[Comparison]:
    return measure(n_slos=20, days=7 if quick else 30)
