"""Traces at scale through compacted partitions: 100M requests a day at 1,000 replicas.

(a) Compacting one hour: 4.17M vLLM `llm_request` spans as OTLP/JSON lines (8 files, 500
spans per line, one replica's resource per line; plain text, written by this benchmark before
timing) through `compact_traces` into one hourly Parquet partition. Peer: `orjson.loads` of
every line of the same files, nothing else (the floor of any Python decoder of OTLP/JSON).
(b) Rolling up a day: 24 hourly partitions of 4.17M requests each (generated with the
rollup_day generator over 1,000 replicas, written straight as partition files) rolled up by
`Store.roll_up_partitions` (`request_minutes` and `slo_minutes`, two SLOs), on day 1 into an
empty store and on day 30 into a store holding 29 days of history. Peers: DuckDB's raw scan of
the same Parquet computing the same outputs (rollup_day's second peer, `read_parquet` with
hive_partitioning), and its quantile floor.
(c) Evaluating 20 SLOs over 30 days (`servewatch slo status`'s path: `slo_service.status_at`)
at the end of day 30 with 30 days of minutes stored and with 60; day 1 for reference. Peer:
the window sums alone in one DuckDB query over the same table.

How history is made (30 days x 100M rows of raw Parquet is ~180 GB, more than the disk):
history partitions are hard links of day 1's files under other dates, recorded in
`rollup_partitions` with day 1's fingerprints (a hard link has the same size and mtime), and
their minutes are day 1's minutes copied with shifted times; the incremental path must not
read them, and the run checks that it reads exactly day 30's 24 partitions (generated like
day 1's, with day 30's times). The SLO minutes of (c)
are generated per SLO, minute, pool and tenant (12 rows per SLO-minute), not per replica:
`slo status` reads the period's minutes into Polars, and per-replica rows at 1,000 replicas
(~5.8M per SLO-day) would not fit its memory; that is stated in the output and left open.

(d) A scrape round of 1,000 replicas' pages: 8 rounds (two minutes at 15 s) of vLLM pages,
generated, not served (12 emulated replicas recorded in fixture mode, store_footprint's cached
fleet, each round's 12 pages given out in turn to the 1,000 targets), each round ingested in
one `ingest_pages` batch as `servewatch scrape` ingests a round. Peer: prometheus_client's
parser over the same pages (parse only).

Every measurement runs in a fresh child process: its VmHWM (peak resident set) is the work's
peak (target under 4 GB). Big data lives under /tmp (SERVEWATCH_BENCH_TMP) and is deleted at
the end.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl

from bench.report import Comparison
from bench.rollup_day import FLOOR_SQL, SAME_OUTPUTS_SQL, SLOS, START, hour_of_requests
from bench.store_footprint import SCRAPE_INTERVAL_S as PAGE_INTERVAL_S
from bench.store_footprint import fixture as store_fixture
from servewatch.collectors.fixture.folder import iter_fixture_pages, open_fixture
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.pipeline.partitions import PARTITION_FILE, partition_of
from servewatch.slo.spec import AvailabilitySli, SloSpec
from servewatch.slo.windows import default_burn_windows

WORK = Path(os.environ.get("SERVEWATCH_BENCH_TMP", "/tmp/servewatch-bench-partitions"))
# The rollup_day generator's first hour.
DAY_1 = START
PER_DAY = 100_000_000
REPLICAS = 1000
SPANS_PER_LINE = 500
INPUT_FILES = 8
HISTORY_DAYS = 29
TARGET_RATIO = 2.0
TARGET_PEAK_BYTES = 4 * 1024**3
EVAL_SLOS = 20
POOLS = ("chat", "code", "batch")
PAGE_ROUNDS = 8  # two minutes of scraping at 15 s
TENANTS = ("acme", "globex", "initech", "umbrella")


def machine_load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


# --- (a) one hour of OTLP/JSON -------------------------------------------------------------


def _attr(key: str, kind: str, value: object) -> str:
    return f'{{"key":"{key}","value":{{"{kind}":{value}}}}}'


def write_otlp_hour(folder: Path, *, spans: int, replicas: int, seed: int = 3) -> int:
    """`spans` request spans ending within one hour (DAY_1 10:00), as the Collector's file
    exporter writes them, in `INPUT_FILES` files; returns the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    start_ns = int((DAY_1 + timedelta(hours=10)).replace(tzinfo=UTC).timestamp()) * 10**9
    lines = (spans + SPANS_PER_LINE - 1) // SPANS_PER_LINE
    per_file = (lines + INPUT_FILES - 1) // INPUT_FILES
    written = 0
    index = 0
    for f in range(INPUT_FILES):
        with (folder / f"traces-{f}.json").open("w", encoding="ascii") as out:
            for line in range(f * per_file, min((f + 1) * per_file, lines)):
                replica = line % replicas
                body = []
                for _ in range(min(SPANS_PER_LINE, spans - index)):
                    queue, prefill = rng.expovariate(25), rng.uniform(0.02, 0.3)
                    tokens = rng.randrange(2, 800)
                    decode = (tokens - 1) * rng.uniform(0.01, 0.05)
                    e2e = queue + prefill + decode
                    end = start_ns + int(rng.random() * 3.6e12)
                    begin = end - int(e2e * 1e9)
                    attributes = ",".join(
                        (
                            _attr("gen_ai.request.id", "stringValue", f'"cmpl-{index}"'),
                            _attr("gen_ai.usage.prompt_tokens", "intValue", f'"{tokens * 3}"'),
                            _attr("gen_ai.usage.completion_tokens", "intValue", f'"{tokens}"'),
                            _attr("gen_ai.latency.time_in_queue", "doubleValue", queue),
                            _attr(
                                "gen_ai.latency.time_to_first_token",
                                "doubleValue",
                                queue + prefill,
                            ),
                            _attr("gen_ai.latency.e2e", "doubleValue", e2e),
                            _attr("gen_ai.latency.time_in_model_prefill", "doubleValue", prefill),
                            _attr("gen_ai.latency.time_in_model_decode", "doubleValue", decode),
                            _attr(
                                "gen_ai.latency.time_in_model_inference",
                                "doubleValue",
                                prefill + decode,
                            ),
                        )
                    )
                    body.append(
                        f'{{"traceId":"{index + (seed << 40):032x}","spanId":"{index + 1:016x}",'
                        f'"name":"llm_request","kind":2,"startTimeUnixNano":"{begin}",'
                        f'"endTimeUnixNano":"{end}","attributes":[{attributes}],'
                        '"status":{}}'
                    )
                    index += 1
                resource = _attr("k8s.pod.name", "stringValue", f'"vllm-{replica:04d}"')
                text = (
                    f'{{"resourceSpans":[{{"resource":{{"attributes":[{resource}]}},'
                    f'"scopeSpans":[{{"scope":{{"name":"vllm"}},"spans":[{",".join(body)}]}}]}}]}}\n'
                )
                out.write(text)
                written += len(text)
    return written


# --- (b) a day of partitions and its history -----------------------------------------------


def write_day(parts: Path, day: datetime, *, per_s: float, replicas: int) -> int:
    """24 partition files of generated requests for `day`; returns the rows written."""
    rows = 0
    for hour in range(24):
        frame = hour_of_requests(hour, per_s=per_s, seed=5, replicas=replicas)
        shift = day - DAY_1
        frame = frame.with_columns(
            pl.col("end_ts") + shift, pl.col("arrival_ts") + shift, pl.col("ingested_ts") + shift
        ).sort("end_ts", "replica")
        target = parts / partition_of(day + timedelta(hours=hour)) / PARTITION_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        frame.write_parquet(target, compression="zstd")
        rows += frame.height
    return rows


def link_day(parts: Path, source_day: datetime, day: datetime) -> None:
    for hour in range(24):
        source = parts / partition_of(source_day + timedelta(hours=hour)) / PARTITION_FILE
        target = parts / partition_of(day + timedelta(hours=hour)) / PARTITION_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            os.link(source, target)


def add_history(store_path: Path, *, days: int) -> None:
    """Days 2..days+1 as already rolled up: day 1's minutes and fingerprints, shifted."""
    con = duckdb.connect(str(store_path))
    try:
        for k in range(1, days):
            shift = f"INTERVAL {k} DAY"
            con.execute(
                f"INSERT INTO request_minutes SELECT * REPLACE (minute_ts + {shift} AS minute_ts) "
                "FROM request_minutes WHERE minute_ts < ?",
                [DAY_1 + timedelta(days=1)],
            )
            con.execute(
                f"INSERT INTO slo_minutes SELECT * REPLACE (minute_ts + {shift} AS minute_ts) "
                "FROM slo_minutes WHERE minute_ts < ?",
                [DAY_1 + timedelta(days=1)],
            )
            for hour in range(24):
                old = partition_of(DAY_1 + timedelta(hours=hour))
                new = partition_of(DAY_1 + timedelta(days=k, hours=hour))
                con.execute(
                    "INSERT INTO rollup_partitions SELECT rollup, ?, fingerprint, rolled_up_ts "
                    "FROM rollup_partitions WHERE partition = ?",
                    [new, old],
                )
    finally:
        con.close()


# --- (c) SLO minutes for evaluation ----------------------------------------------------------


def slo_store(path: Path, *, days: int, at: datetime) -> None:
    """`days` of slo_minutes ending at `at` for EVAL_SLOS SLOs, per pool and tenant."""
    from servewatch.store import Store  # noqa: PLC0415
    from servewatch.store.rollups import criteria_fingerprint  # noqa: PLC0415

    with Store.open(path):
        pass
    minutes = days * 1440
    start = at - timedelta(days=days)
    con = duckdb.connect(str(path))
    try:
        con.execute(
            f"""
            INSERT INTO slo_minutes
            SELECT ?::TIMESTAMP + to_minutes(m) AS minute_ts,
                   printf('slo-%02d', s) AS slo, NULL AS replica,
                   t - (CASE WHEN hash(m, s, p, q) % 50 = 0 THEN t // 500 ELSE 0 END) AS good,
                   t AS total, {_pick("p", POOLS)} AS pool, 'llama' AS model,
                   {_pick("q", TENANTS)} AS tenant, NULL, NULL, NULL
            FROM (SELECT m, s, p, q, 200 + hash(m, s, p, q) % 1800 AS t
                  FROM range({minutes}) r(m), range({EVAL_SLOS}) s(s),
                       range({len(POOLS)}) p(p), range({len(TENANTS)}) q(q))
            """,
            [start],
        )
        criteria = [c for s in eval_specs() if (c := s.event_criterion()) is not None]
        fingerprint = criteria_fingerprint(criteria)
        con.execute(
            "INSERT INTO rollup_watermarks VALUES ('slo_minutes', ?, ?, ?)",
            [at, fingerprint, at],
        )
    finally:
        con.close()


def _pick(column: str, names: tuple[str, ...]) -> str:
    cases = " ".join(f"WHEN {i} THEN '{n}'" for i, n in enumerate(names))
    return f"CASE {column} {cases} END"


def eval_specs() -> list[SloSpec]:
    return [
        SloSpec(f"slo-{i:02d}", AvailabilitySli(), 0.999, 30 * 86400, default_burn_windows())
        for i in range(EVAL_SLOS)
    ]


# --- children --------------------------------------------------------------------------------

# --- (d) a scrape round of 1,000 replicas' pages ----------------------------------------


def fleet_targets(replicas: int) -> list[Target]:
    """`replicas` vLLM targets, eight to a host and a third of the hosts to a zone."""
    return [
        Target(
            target_id=f"vllm/vllm-{k}",
            kind=TargetKind.VLLM,
            url=f"http://10.{k // 250}.{k % 250 // 8}.{k % 8}:8000/metrics",
            replica=f"vllm-{k}",
            host=f"host-{k // 8}",
            zone=f"zone-{k // 8 % 3}",
            pool=POOLS[k % len(POOLS)],
        )
        for k in range(replicas)
    ]


def write_pages(path: Path, *, rounds: int) -> int:
    """`rounds` scrape rounds of the store_footprint fleet's vLLM pages (12 emulated
    replicas, recorded in fixture mode, cached), as JSON: one list of page bodies a round.
    Target k of the benchmark's fleet is given replica k mod 12's page of the round."""
    fixture = open_fixture(store_fixture(rounds * PAGE_INTERVAL_S / 3600 + 0.05))
    by_round: dict[datetime, list[str]] = {}
    for page in iter_fixture_pages(fixture):
        if page.target.kind is TargetKind.VLLM and page.body is not None:
            by_round.setdefault(page.scrape_ts, []).append(page.body)
    chosen = [by_round[ts] for ts in sorted(by_round)][-rounds:]
    if len(chosen) < rounds:
        raise RuntimeError(f"the fixture has {len(chosen)} rounds of pages, not {rounds}")
    path.write_text(json.dumps(chosen), encoding="utf-8")
    return sum(len(body) for body in chosen[0])


CHILD = """
import json, resource, sys, time
from bench.partitions import child
what, args, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
result = child(what, args, clock=time.perf_counter, cpu=cpu)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child would report the
# parent's peak (the generator's frames) when that was higher than its own.
with open("/proc/self/status") as status:
    hwm = [line.split()[1] for line in status if line.startswith("VmHWM:")]
result["peak_bytes"] = int(hwm[0]) * 1024
with open(out, "w") as stream:
    json.dump(result, stream)
"""


def child(what: str, args: dict[str, str], *, clock: object, cpu: object) -> dict[str, float]:
    """One measured piece of work, in a fresh process (see CHILD)."""
    import orjson  # noqa: PLC0415
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    from servewatch.collectors.metrics.ingest import ingest_pages  # noqa: PLC0415
    from servewatch.collectors.metrics.page import Page  # noqa: PLC0415
    from servewatch.collectors.traces.compact import compact_traces  # noqa: PLC0415
    from servewatch.slo_service import status_at  # noqa: PLC0415
    from servewatch.store import Store  # noqa: PLC0415

    assert callable(clock)
    assert callable(cpu)
    started, cpu_started = clock(), cpu()
    rows = 0
    if what == "compact":
        report = compact_traces(Path(args["input"]), Path(args["out"]), now=DAY_1)
        rows = report.new_rows
    elif what == "decode":
        for path in sorted(Path(args["input"]).glob("*.json")):
            with path.open("rb") as stream:
                for line in stream:
                    rows += len(orjson.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"])
    elif what == "rollup":
        with Store.open(args["store"]) as store:
            rolled = store.roll_up_partitions(Path(args["parts"]), criteria=SLOS)
        rows = rolled.requests["request_minutes"]
        expected = int(args["expect_partitions"])
        if rolled.partitions_read != expected:
            raise RuntimeError(f"read {rolled.partitions_read} partitions, not {expected}")
    elif what in {"scan", "floor"}:
        relation = f"read_parquet('{args['glob']}', hive_partitioning = true)"
        con = duckdb.connect()
        statements = SAME_OUTPUTS_SQL if what == "scan" else (FLOOR_SQL,)
        for sql in statements:
            rows += len(con.execute(sql.replace("FROM requests", f"FROM {relation}")).fetchall())
        con.close()
    elif what == "evaluate":
        at = datetime.fromisoformat(args["at"])
        with Store.open(args["store"], read_only=True) as store:
            rows = len(status_at(store, specs=eval_specs(), at=at))
    elif what == "sums":
        at = datetime.fromisoformat(args["at"])
        con = duckdb.connect(args["store"], read_only=True)
        rows = len(
            con.execute(
                "SELECT slo, sum(good) FILTER (WHERE minute_ts >= ?::TIMESTAMP - INTERVAL 1 HOUR),"
                " sum(total) FILTER (WHERE minute_ts >= ?::TIMESTAMP - INTERVAL 1 HOUR),"
                " sum(good), sum(total) FROM slo_minutes WHERE minute_ts >= ?::TIMESTAMP - "
                "INTERVAL 30 DAY AND minute_ts < ? GROUP BY slo",
                [at, at, at, at],
            ).fetchall()
        )
        con.close()
    elif what == "pages":
        rounds = json.loads(Path(args["pages"]).read_text(encoding="utf-8"))
        targets = fleet_targets(int(args["replicas"]))
        round_s: list[float] = []
        with Store.open(args["store"]) as store:
            for r, bodies in enumerate(rounds):
                at = DAY_1 + timedelta(seconds=PAGE_INTERVAL_S * r)
                pages = [
                    Page(t, at, bodies[k % len(bodies)], openmetrics=False)
                    for k, t in enumerate(targets)
                ]
                began = clock()
                rows += ingest_pages(pages, store=store).stored_samples
                round_s.append(clock() - began)
        return {
            "seconds": clock() - started,
            "cpu_seconds": cpu() - cpu_started,
            "rows": rows,
            "round_max_s": max(round_s),
            "round_median_s": sorted(round_s)[len(round_s) // 2],
        }
    elif what == "pages_parse":
        rounds = json.loads(Path(args["pages"]).read_text(encoding="utf-8"))
        for bodies in rounds:
            for k in range(int(args["replicas"])):
                for family in text_string_to_metric_families(bodies[k % len(bodies)]):
                    rows += len(family.samples)
    else:
        raise ValueError(f"unknown measurement {what!r}")
    return {"seconds": clock() - started, "cpu_seconds": cpu() - cpu_started, "rows": rows}


def measure(what: str, **args: str) -> dict[str, float]:
    out = WORK / f"{what}.result.json"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, what, json.dumps(args), str(out)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(out.read_text(encoding="utf-8"))
    out.unlink()
    print(f"# {what} {args}: {result} ({machine_load()})", file=sys.stderr, flush=True)
    return result


def _gb(result: dict[str, float]) -> str:
    return f"peak {result['peak_bytes'] / 1024**3:.2f} GB"


def run(*, quick: bool = False) -> list[Comparison]:
    per_day = PER_DAY // 20 if quick else PER_DAY
    replicas = 100 if quick else REPLICAS
    history = 6 if quick else HISTORY_DAYS
    per_hour = per_day // 24
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    load_before = machine_load()
    try:
        return _run(per_hour=per_hour, replicas=replicas, history=history, load=load_before)
    finally:
        if not os.environ.get("SERVEWATCH_BENCH_KEEP"):
            shutil.rmtree(WORK, ignore_errors=True)


def _run(*, per_hour: int, replicas: int, history: int, load: str) -> list[Comparison]:
    results: list[Comparison] = []
    # (a) one hour compacted.
    hour_in = WORK / "otlp" / "year=2026/month=11/day=01/hour=10"
    text_bytes = write_otlp_hour(hour_in, spans=per_hour, replicas=replicas)
    compacted = measure("compact", input=str(WORK / "otlp"), out=str(WORK / "compacted"))
    decoded = measure("decode", input=str(hour_in))
    if compacted["rows"] != per_hour:
        raise RuntimeError(f"compacted {compacted['rows']} rows of {per_hour} spans")
    shutil.rmtree(WORK / "otlp")
    spans_s = per_hour / compacted["seconds"]
    results.append(
        Comparison(
            f"compact one hour: {per_hour:,} spans ({text_bytes / 1024**3:.2f} GB of OTLP/JSON, "
            f"{replicas} replicas) into one partition, {spans_s:,.0f} spans/s; "
            f"{_gb(compacted)} (target < 4 GB); {load}",
            "s",
            "servewatch compact (decode, map, stage, merge, zstd Parquet)",
            compacted["seconds"],
            "orjson.loads of every line, nothing else (decode floor)",
            decoded["seconds"],
            higher_is_better=False,
        )
    )
    # (b) a day of partitions, on day 1 and on day 30.
    parts = WORK / "parts"
    per_s = per_hour / 3600
    rows = write_day(parts, DAY_1, per_s=per_s, replicas=replicas)
    day_glob = str(parts / f"date={DAY_1:%Y-%m-%d}" / "*" / PARTITION_FILE)
    scan = measure("scan", glob=day_glob)
    floor = measure("floor", glob=day_glob)
    store_1 = WORK / "day1.duckdb"
    first = measure("rollup", store=str(store_1), parts=str(parts), expect_partitions="24")
    store_30 = WORK / "day30.duckdb"
    shutil.copyfile(store_1, store_30)
    add_history(store_30, days=history + 1)
    for k in range(1, history + 1):
        link_day(parts, DAY_1, DAY_1 + timedelta(days=k))
    # Day 30 is generated, not linked: its rows must end in its own hours.
    write_day(parts, DAY_1 + timedelta(days=history + 1), per_s=per_s, replicas=replicas)
    later = measure("rollup", store=str(store_30), parts=str(parts), expect_partitions="24")
    what = (
        f"roll up one day of partitions ({rows:,} requests, {replicas} replicas, 24 partitions, "
        f"{len(SLOS)} SLOs)"
    )
    results += [
        Comparison(
            f"{what}, day {history + 1} with {history} days of history (hard-linked partitions, "
            f"copied minutes) against day 1 with none (target within {TARGET_RATIO:g}x); "
            f"{_gb(later)} and {_gb(first)}",
            "s",
            f"servewatch roll_up_partitions, day {history + 1}",
            later["seconds"],
            "servewatch roll_up_partitions, day 1",
            first["seconds"],
            higher_is_better=False,
        ),
        Comparison(
            f"{what}, day 1; {load}",
            "s",
            "servewatch roll_up_partitions (request_minutes + slo_minutes, written)",
            first["seconds"],
            "DuckDB read_parquet(hive_partitioning) of the same outputs, fetched",
            scan["seconds"],
            higher_is_better=False,
        ),
        Comparison(
            f"{what}, day 1",
            "s",
            "servewatch roll_up_partitions",
            first["seconds"],
            "DuckDB read_parquet quantile floor (p50/p95/p99 TTFT, TPOT per replica-minute)",
            floor["seconds"],
            higher_is_better=False,
        ),
    ]
    shutil.rmtree(parts)
    # (c) 20 SLOs over 30 days.
    at_30 = DAY_1 + timedelta(days=30)
    stores = {}
    for days in (1, 30, 60):
        path = WORK / f"slo_{days}d.duckdb"
        slo_store(path, days=days, at=DAY_1 + timedelta(days=days if days < 60 else 30))
        stores[days] = path
    # The 60-day store ends at day 30 as well: 30 more days before the period.
    eval_1 = measure("evaluate", store=str(stores[1]), at=(DAY_1 + timedelta(days=1)).isoformat())
    eval_30 = measure("evaluate", store=str(stores[30]), at=at_30.isoformat())
    eval_60 = measure("evaluate", store=str(stores[60]), at=at_30.isoformat())
    sums_30 = measure("sums", store=str(stores[30]), at=at_30.isoformat())
    note = (
        f"{EVAL_SLOS} SLOs x {len(POOLS) * len(TENANTS)} pool-tenant rows per minute "
        "(not per replica: see the module text)"
    )
    results += [
        Comparison(
            f"evaluate {note} at day 30: 60 days stored against 30 (history beyond the period; "
            f"target within {TARGET_RATIO:g}x); {_gb(eval_60)} and {_gb(eval_30)}",
            "ms",
            "servewatch slo status path, 60 days stored",
            eval_60["seconds"] * 1000,
            "servewatch slo status path, 30 days stored",
            eval_30["seconds"] * 1000,
            higher_is_better=False,
        ),
        Comparison(
            f"evaluate {note}: day 30 (30-day period full) against day 1 (one day stored)",
            "ms",
            "servewatch slo status path, day 30",
            eval_30["seconds"] * 1000,
            "servewatch slo status path, day 1",
            eval_1["seconds"] * 1000,
            higher_is_better=False,
        ),
        Comparison(
            f"evaluate {note} at day 30",
            "ms",
            "servewatch slo status path (sums, burn rates, budgets, alert state)",
            eval_30["seconds"] * 1000,
            "DuckDB FILTER window sums only, same table",
            sums_30["seconds"] * 1000,
            higher_is_better=False,
        ),
    ]
    # (d) scrape rounds of the fleet's pages, each ingested as `servewatch scrape` ingests a
    # round (one batch of every target's page).
    rounds = PAGE_ROUNDS
    pages = WORK / "pages.json"
    round_bytes = write_pages(pages, rounds=rounds)
    ingested = measure(
        "pages", pages=str(pages), replicas=str(replicas), store=str(WORK / "pages.duckdb")
    )
    parsed = measure("pages_parse", pages=str(pages), replicas=str(replicas))
    if ingested["rows"] == 0:
        raise RuntimeError("no sample of the pages was stored")
    per_round = ingested["rows"] / rounds
    cpu_us = ingested["cpu_seconds"] / ingested["rows"] * 1e6
    day_cpu_h = cpu_us * per_round * (86_400 / PAGE_INTERVAL_S) / 1e6 / 3600
    results.append(
        Comparison(
            f"ingest {rounds} scrape rounds of {replicas} replicas' vLLM pages (generated, not "
            f"served: 12 emulated replicas' pages, {round_bytes / 12 / 1024:.0f} KB each, "
            f"given out in turn; {per_round:,.0f} samples a round) as `servewatch scrape` "
            f"ingests a round: median round {ingested['round_median_s']:.1f} s, slowest "
            f"{ingested['round_max_s']:.1f} s, against the {PAGE_INTERVAL_S:g} s interval; "
            f"{cpu_us:.1f} us of CPU a sample, {day_cpu_h:.1f} h of CPU a day; "
            f"{_gb(ingested)}; {load}",
            "s",
            "servewatch ingest_pages (parse, catalogue, store)",
            ingested["seconds"],
            "prometheus_client's parser over the same pages (parse only)",
            parsed["seconds"],
            higher_is_better=False,
        )
    )
    return results
