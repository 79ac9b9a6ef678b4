"""A day's minute rollup: `request_minutes` and `slo_minutes` from 14.7M requests, against
DuckDB's own per-minute `quantile_cont` over the same rows (the floor).

Input: 24 h at 170 req/s over 45 replicas (3 pools, 3 models, 4 tenants): lognormal TTFT,
TPOT and token counts, 0.5 % failures, written straight into a store's `requests` table by
one bulk insert per hour (the span parser is benchmarked separately). The store is built once
and cached.
Ours: `roll_up_requests` (`request_minutes` and `slo_minutes`, two SLOs) from scratch, as the
SLO service runs it, in a fresh child process so its peak memory (ru_maxrss) is the rollup's.
Peer (the floor): one DuckDB query, p50/p95/p99 of TTFT and TPOT of successful requests per
replica and minute (`quantile_cont`), also in a fresh child process. Second peer: everything
both tables hold, in raw DuckDB SQL, fetched and dropped (what the engine alone spends). All
three alternate in fresh child processes; medians of wall and CPU time are reported.
Targets: at most 2x the floor, peak memory under 2 GB.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl

from bench.report import Comparison
from servewatch.pipeline.request_minutes import EventCriterion
from servewatch.pipeline.tables import REQUESTS_SCHEMA
from servewatch.store import Store

CACHE = Path(os.environ.get("SERVEWATCH_BENCH_CACHE", Path.home() / ".cache" / "servewatch-bench"))
START = datetime(2026, 11, 18)
REPLICAS = 45
POOLS = (("chat", "llama-3.1-8b"), ("code", "qwen2.5-coder-32b"), ("batch", "llama-3.1-70b"))
TENANTS = ("acme", "globex", "initech", "umbrella")
CUMULATIVE_TENANTS = (0.5, 0.75, 0.9, 1.0)
FAILED_RATIO = 0.005
TARGET_RATIO = 2.0
PER_S = 170.0
RUNS = 5
SLOS = (
    EventCriterion("ttft-500ms", ttft_limit_s=0.5),
    EventCriterion("chat-goodput", ttft_limit_s=1.0, tpot_limit_s=0.05),
)
TARGET_PEAK_BYTES = 2 * 1024**3


def _uniform(row: pl.Expr, seed: int) -> pl.Expr:
    """A pseudo-random draw in (0, 1) per row, from a hash: fast and reproducible."""
    return (row.hash(seed) % 1_000_000_007 + 1).cast(pl.Float64) / 1_000_000_009


def _lognormal(row: pl.Expr, seed: int, *, median: float, sigma: float) -> pl.Expr:
    # Box-Muller from two hashed uniforms.
    normal = (-2.0 * _uniform(row, seed).log()).sqrt() * (
        2.0 * math.pi * _uniform(row, seed + 1)
    ).cos()
    return median * (sigma * normal).exp()


def hour_of_requests(
    hour: int, *, per_s: float, seed: int, replicas: int = REPLICAS
) -> pl.DataFrame:
    """One hour of request rows over `replicas`, ordered by completion as they would arrive."""
    n = int(per_s * 3600)
    row = pl.col("row")
    replica = (row.hash(seed) % replicas).cast(pl.Int64)
    pool = replica % len(POOLS)
    slow_pool = pl.when(pool == 2).then(2.0).otherwise(1.0)  # the 70B pool decodes slower
    tenant_draw = _uniform(row, seed + 2)
    tenant = pl.lit(TENANTS[-1])
    for name, bound in reversed(list(zip(TENANTS, CUMULATIVE_TENANTS, strict=True))):
        tenant = pl.when(tenant_draw < bound).then(pl.lit(name)).otherwise(tenant)
    hour_start = START + timedelta(hours=hour)
    frame = (
        pl.DataFrame({"row": pl.int_range(hour * n, (hour + 1) * n, eager=True)})
        .with_columns(
            end_ts=pl.lit(hour_start)
            + pl.duration(microseconds=(_uniform(row, seed + 3) * 3.6e9).cast(pl.Int64)),
            replica_n=replica,
            pool_n=pool,
            tenant=tenant,
            ok=_uniform(row, seed + 4) >= FAILED_RATIO,
            prompt_tokens=_lognormal(row, seed + 5, median=800, sigma=0.9)
            .clip(1, 32_000)
            .round()
            .cast(pl.Int64),
            completion_tokens=_lognormal(row, seed + 7, median=180, sigma=1.0)
            .clip(1, 2048)
            .round()
            .cast(pl.Int64),
            queue_s=-0.02 * _uniform(row, seed + 9).log(),
            tpot_s=0.018 * slow_pool * _lognormal(row, seed + 10, median=1.0, sigma=0.35),
            prefill_noise=_lognormal(row, seed + 12, median=1.0, sigma=0.3),
        )
        .with_columns(
            prefill_s=pl.col("prompt_tokens") * 1.5e-4 * slow_pool * pl.col("prefill_noise"),
            decode_s=pl.col("tpot_s") * (pl.col("completion_tokens") - 1),
        )
        .with_columns(ttft_s=pl.col("queue_s") + pl.col("prefill_s") + 0.01)
        .with_columns(e2e_s=pl.col("ttft_s") + pl.col("decode_s"))
        .sort("end_ts")
        # Ids in arrival order keep the primary-key index inserts cheap.
        .with_columns(row=pl.int_range(hour * n, (hour + 1) * n))
    )
    pools = [p for p, _ in POOLS]
    models = [m for _, m in POOLS]
    return frame.select(
        trace_id=pl.col("row").cast(pl.String).str.zfill(10),
        span_id=pl.lit("0"),
        request_id=pl.lit(None, dtype=pl.String),
        replica=pl.format("vllm-{}", pl.col("replica_n").cast(pl.String).str.zfill(2)),
        host=pl.format("gpu-{}", (pl.col("replica_n") // 3).cast(pl.String).str.zfill(2)),
        zone=pl.format("zone-{}", (pl.col("replica_n") % 3).cast(pl.String)),
        model=pl.col("pool_n").replace_strict(list(range(len(POOLS))), models),
        pool=pl.col("pool_n").replace_strict(list(range(len(POOLS))), pools),
        tenant=pl.col("tenant"),
        arrival_ts=pl.col("end_ts")
        - pl.duration(microseconds=(pl.col("e2e_s") * 1e6).cast(pl.Int64)),
        end_ts=pl.col("end_ts"),
        ok=pl.col("ok"),
        error_type=pl.when(pl.col("ok")).then(None).otherwise(pl.lit("abort")),
        prompt_tokens=pl.col("prompt_tokens"),
        completion_tokens=pl.when(pl.col("ok")).then(pl.col("completion_tokens")),
        ttft_s=pl.col("ttft_s"),
        e2e_s=pl.col("e2e_s"),
        queue_s=pl.col("queue_s"),
        prefill_s=pl.col("prefill_s"),
        decode_s=pl.col("decode_s"),
        inference_s=pl.col("prefill_s") + pl.col("decode_s"),
        max_tokens=pl.lit(2048, dtype=pl.Int64),
        emulated=pl.lit(value=True),
        source=pl.lit("bench"),
        # Ingested a few seconds after completion, as a Collector batch would deliver them.
        ingested_ts=pl.col("end_ts") + pl.duration(seconds=5),
        conversation_id=pl.lit(None, dtype=pl.String),
        adapter=pl.lit(None, dtype=pl.String),
    ).cast(REQUESTS_SCHEMA)


def insert_requests(con: duckdb.DuckDBPyConnection, frame: pl.DataFrame) -> None:
    """The bulk path: one INSERT of a whole frame (the rows are new by construction)."""
    con.register("incoming_requests", frame.to_arrow())
    try:
        con.execute(
            f"INSERT INTO requests ({', '.join(REQUESTS_SCHEMA.names())}) "
            f"SELECT {', '.join(REQUESTS_SCHEMA.names())} FROM incoming_requests"
        )
    finally:
        con.unregister("incoming_requests")


def day_store(*, hours: int, per_s: float, seed: int = 5) -> Path:
    """A store holding `hours` of requests at `per_s` (cached; built once)."""
    path = CACHE / f"rollup_day_{hours}h_{per_s:g}rps_{seed}.duckdb"
    if path.exists():
        # A store cached by older code is brought to the current schema here, so that no
        # measured child pays a migration (copying 14.7M rows) in its time or its peak.
        with Store.open(path):
            pass
        return path
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with Store.open(partial):
        pass  # the schema, through the migrations
    con = duckdb.connect(str(partial))
    try:
        for hour in range(hours):
            insert_requests(con, hour_of_requests(hour, per_s=per_s, seed=seed))
    finally:
        con.close()
    partial.rename(path)
    return path


# The floor: what any per-minute latency rollup must at least do, in DuckDB's own words.
FLOOR_SQL = """
SELECT replica, date_trunc('minute', end_ts) AS minute_ts,
       quantile_cont(ttft_s, [0.5, 0.95, 0.99]) AS ttft,
       quantile_cont(CASE WHEN completion_tokens > 1
                     THEN coalesce(decode_s, e2e_s - ttft_s) / (completion_tokens - 1) END,
                     [0.5, 0.95, 0.99]) AS tpot
FROM requests WHERE ok GROUP BY ALL
"""

# The product's outputs in DuckDB's own words, fetched and dropped (no Polars, no writes): what
# the engine alone spends on everything the two tables hold. Nine quantiles, counts and token
# sums per replica-minute; total and good events of both SLOs per minute, replica, pool, model
# and tenant.
SAME_OUTPUTS_SQL = (
    """
SELECT replica, date_trunc('minute', end_ts) AS minute_ts, count(*),
       count(*) FILTER (WHERE NOT ok), sum(prompt_tokens) FILTER (WHERE ok),
       sum(completion_tokens) FILTER (WHERE ok),
       quantile_cont(ttft_s, [0.5, 0.95, 0.99]) FILTER (WHERE ok),
       quantile_cont(CASE WHEN completion_tokens > 1
                     THEN coalesce(decode_s, e2e_s - ttft_s) / (completion_tokens - 1) END,
                     [0.5, 0.95, 0.99]) FILTER (WHERE ok),
       quantile_cont(e2e_s, [0.5, 0.95, 0.99]) FILTER (WHERE ok)
FROM requests GROUP BY ALL
""",
    """
SELECT date_trunc('minute', end_ts) AS minute_ts, replica, pool, model, tenant, count(*),
       count(*) FILTER (WHERE ok AND ttft_s <= 0.5),
       count(*) FILTER (WHERE ok AND ttft_s <= 1.0 AND coalesce(CASE WHEN completion_tokens > 1
           THEN coalesce(decode_s, e2e_s - ttft_s) / (completion_tokens - 1) END, 0) <= 0.05)
FROM requests GROUP BY ALL
""",
)

# Each measurement runs in a fresh interpreter: its ru_maxrss is then the work's own peak. CPU
# seconds (user + system, all threads) are taken next to wall time: on a shared machine they
# move much less with the other workers' load.
CHILD = """
import json, resource, sys, time
import duckdb
path, what, out = sys.argv[1], sys.argv[2], sys.argv[3]
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
if what in ("floor", "same"):
    from bench.rollup_day import FLOOR_SQL, SAME_OUTPUTS_SQL
    con = duckdb.connect(path, read_only=True)
    started, cpu_started = time.perf_counter(), cpu()
    statements = [FLOOR_SQL] if what == "floor" else SAME_OUTPUTS_SQL
    rows = sum(len(con.execute(sql).fetchall()) for sql in statements)
    seconds, cpu_seconds = time.perf_counter() - started, cpu() - cpu_started
    con.close()
else:
    from bench.rollup_day import SLOS
    from servewatch.store.rollup_job import roll_up_requests
    from servewatch.store import Store
    con = duckdb.connect(path)
    con.execute("DELETE FROM rollup_watermarks")  # the next run recomputes everything
    con.close()
    with Store.open(path) as store:
        started, cpu_started = time.perf_counter(), cpu()
        minutes = roll_up_requests(store, criteria=SLOS)
        seconds, cpu_seconds = time.perf_counter() - started, cpu() - cpu_started
    rows = minutes.requests
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with open(out, "w") as result:
    json.dump({"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_bytes": peak, "rows": rows},
              result)
"""


def measure_in_child(path: Path, what: str) -> dict[str, float]:
    # The result goes through a file: DuckDB may draw a progress bar on stdout.
    out = path.with_suffix(f".{what}.json")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), what, str(out)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} run on {path} failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(out.read_text(encoding="utf-8"))
    out.unlink()
    return result


def check_same_quantiles(path: Path) -> None:
    """The stored rollup's TTFT and TPOT percentiles are the floor's, minute by minute."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        floor: pl.DataFrame = con.sql(FLOOR_SQL).pl()
        ours: pl.DataFrame = con.sql("SELECT * FROM request_minutes").pl()
    finally:
        con.close()
    expected = floor.select(
        "replica",
        "minute_ts",
        *(
            pl.col(stem).list.get(i).alias(f"{stem}_p{p}_s")
            for stem in ("ttft", "tpot")
            for i, p in enumerate((50, 95, 99))
        ),
    )
    joined = expected.join(ours, on=["replica", "minute_ts"], how="left", suffix="_ours")
    if joined.height != ours.height:
        raise RuntimeError(f"{ours.height} rolled-up minutes, the floor has {joined.height}")
    for column in expected.columns[2:]:
        mine, floors = joined[f"{column}_ours"], joined[column]
        worst = (mine - floors).abs().fill_null(0.0).max()
        if (mine.is_null() != floors.is_null()).any() or float(str(worst)) > 1e-9:
            raise RuntimeError(f"{column} differs from the floor's by up to {worst!r}")


def run(*, quick: bool = False) -> list[Comparison]:
    hours = 2 if quick else 24
    path = day_store(hours=hours, per_s=PER_S)
    runs: dict[str, list[dict[str, float]]] = {"floor": [], "ours": [], "same": []}
    for _ in range(RUNS):  # alternating, so all see the same machine
        for what, results in runs.items():
            results.append(measure_in_child(path, what))
    check_same_quantiles(path)

    def median(what: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[what])

    peak = max(r["peak_bytes"] for r in runs["ours"])
    what = (
        f"full minute rollup of {hours} h at {PER_S:g} req/s ({int(runs['ours'][0]['rows']):,} "
        f"requests, {REPLICAS} replicas, {len(SLOS)} SLOs), median of {RUNS}; peak "
        f"{peak / 1024**3:.2f} GB (target < {TARGET_PEAK_BYTES / 1024**3:.0f} GB)"
    )
    ours_label = "servewatch request_minutes + slo_minutes"
    floor_label = "DuckDB quantile_cont p50/p95/p99 of TTFT and TPOT per replica-minute"
    return [
        Comparison(
            f"{what}; wall time",
            "ms",
            f"{ours_label} (target <= {TARGET_RATIO:g}x the floor)",
            median("ours", "seconds") * 1000,
            floor_label,
            median("floor", "seconds") * 1000,
            higher_is_better=False,
        ),
        Comparison(
            f"{what}; CPU time (user + system)",
            "ms",
            ours_label,
            median("ours", "cpu_seconds") * 1000,
            floor_label,
            median("floor", "cpu_seconds") * 1000,
            higher_is_better=False,
        ),
        Comparison(
            f"{what}; wall time against the same outputs in raw DuckDB SQL",
            "ms",
            ours_label,
            median("ours", "seconds") * 1000,
            "DuckDB SQL of both tables' contents, fetched and dropped (no writes)",
            median("same", "seconds") * 1000,
            higher_is_better=False,
        ),
    ]
