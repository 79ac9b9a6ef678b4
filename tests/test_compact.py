"""Compaction of a Collector's OTLP/JSON tree into hourly Parquet partitions, and the minute
rollups read from them: idempotent, resumable, each span once, late spans merged into their
hour, bad lines costing only themselves, and rollups equal to the store's own."""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext
from typer.testing import CliRunner

from servewatch.capacity.requirement import parse_requirement
from servewatch.cli import app
from servewatch.collectors.traces.compact import compact_traces
from servewatch.collectors.traces.ingest import ingest_trace_files
from servewatch.emulator.otlp_jsonl import spans_to_otlp_json
from servewatch.emulator.request_span import RequestTiming, request_span
from servewatch.pipeline.partitions import MANIFEST_FILE, PARTITION_FILE
from servewatch.pipeline.request_minutes import EventCriterion
from servewatch.recommend_service import measure
from servewatch.slo.spec import AvailabilitySli, SloSpec
from servewatch.slo.windows import default_burn_windows
from servewatch.slo_service import evaluation_instant, status_at
from servewatch.store import Store
from servewatch.store.rollup_job import roll_up_requests

NOW = datetime(2026, 11, 19, 0, 0, 0)
# 2026-11-18 10:00:00 UTC: the first input hour.
HOUR_10 = datetime(2026, 11, 18, 10, tzinfo=UTC).timestamp()
SCOPE = InstrumentationScope("vllm.llm_engine")
CRITERIA = (
    EventCriterion("ttft-300ms", ttft_limit_s=0.3),
    EventCriterion("goodput", ttft_limit_s=0.5, tpot_limit_s=0.05),
)


def span(n: int, *, at_s: float, replica: str = "vllm-0", error: bool = False) -> ReadableSpan:
    """The request span numbered `n` (its ids follow from `n`), arriving at `at_s`."""
    timing = RequestTiming(
        request_id=f"cmpl-{n}",
        arrival_s=at_s,
        queue_s=0.01 * (n % 7),
        prefill_s=0.1 + 0.03 * (n % 5),
        decode_s=0.4 + 0.1 * (n % 3),
        prompt_tokens=100 + n,
        completion_tokens=11 + n % 4,
        error_type="abort" if error else None,
    )
    context = SpanContext(trace_id=0x1000 + n, span_id=0x2000 + n, is_remote=False)
    resource = Resource({"k8s.pod.name": replica, "service.name": "vllm"})
    return request_span(timing, context=context, resource=resource, scope=SCOPE)


def write_lines(path: Path, batches: Sequence[Sequence[ReadableSpan]], *, extra: str = "") -> Path:
    """One OTLP/JSON line per batch, as the Collector's file exporter writes; gzip for .gz."""
    text = "".join(spans_to_otlp_json(batch) + "\n" for batch in batches) + extra
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text, encoding="utf-8")
    return path


def collector_folder(root: Path, hour: int) -> Path:
    return root / f"year=2026/month=11/day=18/hour={hour:02d}"


def hour_spans(hour: int, count: int, *, first: int) -> list[ReadableSpan]:
    """`count` requests arriving across `hour` (10 or later) over three replicas."""
    base = HOUR_10 + (hour - 10) * 3600
    return [
        span(first + i, at_s=base + 30 + i * 3500 / count, replica=f"vllm-{i % 3}", error=i == 5)
        for i in range(count)
    ]


def make_tree(root: Path) -> Path:
    """Two Collector hours: hour 10 in two files (one gzip), hour 11 in one."""
    spans_10 = hour_spans(10, 40, first=0)
    write_lines(collector_folder(root, 10) / "traces-0.json", [spans_10[:20]])
    write_lines(collector_folder(root, 10) / "traces-1.json.gz", [spans_10[20:30], spans_10[30:]])
    write_lines(collector_folder(root, 11) / "traces-0.json", [hour_spans(11, 30, first=100)])
    return root


def partition_rows(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "date=*" / "hour=*" / PARTITION_FILE, hive_partitioning=False)


def partition_bytes(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob(PARTITION_FILE))}


def test_compacting_twice_changes_nothing(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "in")
    out = tmp_path / "out"
    first = compact_traces(tree, out, now=NOW)
    assert first.files_read == 3
    assert first.new_rows == 70
    assert [p.partition for p in first.partitions] == [
        "date=2026-11-18/hour=10",
        "date=2026-11-18/hour=11",
    ]
    before = partition_bytes(out)
    mtimes = [p.stat().st_mtime_ns for p in out.rglob(PARTITION_FILE)]
    second = compact_traces(tree, out, now=NOW + timedelta(hours=1))
    assert (second.files_found, second.files_read, second.new_rows) == (3, 0, 0)
    assert partition_bytes(out) == before
    assert [p.stat().st_mtime_ns for p in out.rglob(PARTITION_FILE)] == mtimes
    # The same input compacted afresh gives the same bytes: the order is total.
    again = tmp_path / "again"
    compact_traces(tree, again, now=NOW)
    assert partition_bytes(again) == before


def test_partitions_hold_the_requests_columns_sorted_by_time_and_replica(
    tmp_path: Path,
) -> None:
    tree = make_tree(tmp_path / "in")
    out = tmp_path / "out"
    compact_traces(tree, out, now=NOW)
    with Store.open(":memory:") as store:
        columns = store.table_schema("requests")
    rows = partition_rows(out)
    assert rows.schema == columns
    assert rows["ingested_ts"].unique().to_list() == [NOW]
    hour_10 = pl.read_parquet(out / "date=2026-11-18/hour=10" / PARTITION_FILE)
    assert hour_10.height == 40
    assert hour_10["end_ts"].is_sorted()
    assert hour_10["end_ts"].dt.hour().unique().to_list() == [10]
    meta = duckdb.sql(
        "SELECT DISTINCT compression FROM parquet_metadata(?)",
        params=[str(out / "date=2026-11-18/hour=10" / PARTITION_FILE)],
    ).fetchall()
    assert meta == [("ZSTD",)]


def test_a_span_seen_in_two_input_hours_is_stored_once(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "in")
    out = tmp_path / "out"
    compact_traces(tree, out, now=NOW)
    # The Collector retried a batch of hour 10 and wrote it again an hour later, beside new
    # spans; and one file repeats a span within itself.
    again = hour_spans(10, 40, first=0)[:5]
    late = write_lines(
        collector_folder(tree, 12) / "traces-0.json",
        [again, [span(500, at_s=HOUR_10 + 2 * 3600 + 60)] * 2],
    )
    report = compact_traces(tree, out, now=NOW + timedelta(hours=1))
    assert report.files_read == 1
    assert report.request_spans == 7
    rows = partition_rows(out)
    assert rows.height == 71
    assert rows.select("trace_id", "span_id").is_unique().all()
    written = {p.partition: p for p in report.partitions}
    assert written["date=2026-11-18/hour=10"].new_rows == 0
    assert not written["date=2026-11-18/hour=10"].rewritten
    assert written["date=2026-11-18/hour=12"].new_rows == 1
    assert late.exists()


def test_a_late_span_is_merged_into_the_hour_it_ended_in(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "in")
    out = tmp_path / "out"
    compact_traces(tree, out, now=NOW)
    hour_11 = out / "date=2026-11-18/hour=11" / PARTITION_FILE
    untouched = hour_11.read_bytes()
    # Ended at 10:59: exported late, written in the Collector's hour 13.
    late = span(900, at_s=HOUR_10 + 3540)
    write_lines(collector_folder(tree, 13) / "traces-0.json", [[late]])
    report = compact_traces(tree, out, now=NOW + timedelta(hours=1))
    assert [(p.partition, p.new_rows, p.rows) for p in report.partitions] == [
        ("date=2026-11-18/hour=10", 1, 41)
    ]
    hour_10 = pl.read_parquet(out / "date=2026-11-18/hour=10" / PARTITION_FILE)
    assert f"{0x2000 + 900:016x}" in hour_10["span_id"].to_list()
    assert hour_10["end_ts"].is_sorted()
    # The stored rows keep their ingest time; the late one has this run's.
    assert hour_10.filter(pl.col("request_id") == "cmpl-900")["ingested_ts"].to_list() == [
        NOW + timedelta(hours=1)
    ]
    assert hour_11.read_bytes() == untouched


def test_an_interrupted_compaction_is_finished_by_the_next_run(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "in")
    whole = tmp_path / "whole"
    compact_traces(tree, whole, now=NOW)
    # Interrupted after some partitions were renamed into place but before the manifest named
    # their files: the run saw only hour 10's files, and its manifest is lost.
    out = tmp_path / "out"
    aside = tmp_path / "aside"
    collector_folder(tree, 11).rename(aside)
    compact_traces(tree, out, now=NOW)
    aside.rename(collector_folder(tree, 11))
    (out / MANIFEST_FILE).unlink()
    (out / ".staging-1").mkdir()  # a killed run's staged rows
    report = compact_traces(tree, out, now=NOW)
    assert report.files_read == 3
    assert not (out / ".staging-1").exists()
    assert partition_bytes(out) == partition_bytes(whole)
    manifest = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    assert len(manifest["inputs"]) == 3


def test_a_file_the_collector_appended_to_is_read_again(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "in")
    out = tmp_path / "out"
    compact_traces(tree, out, now=NOW)
    current = collector_folder(tree, 11) / "traces-0.json"
    with current.open("a", encoding="utf-8") as stream:
        stream.write(spans_to_otlp_json([span(700, at_s=HOUR_10 + 3600 + 3590)]) + "\n")
    report = compact_traces(tree, out, now=NOW)
    assert report.files_read == 1
    assert report.new_rows == 1
    assert partition_rows(out).height == 71


def test_a_bad_line_costs_only_that_line(tmp_path: Path) -> None:
    tree = tmp_path / "in"
    spans = hour_spans(10, 20, first=0)
    bad = write_lines(
        collector_folder(tree, 10) / "traces-0.json",
        [spans[:10]],
        extra='{"resourceSpans": [\n' + spans_to_otlp_json(spans[10:]) + "\n",
    )
    broken = json.loads(spans_to_otlp_json([span(300, at_s=HOUR_10 + 60)]))
    attributes = broken["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]
    attributes[:] = [a for a in attributes if a["key"] != "gen_ai.latency.e2e"]
    with bad.open("a", encoding="utf-8") as stream:
        stream.write(json.dumps(broken) + "\n")
    out = tmp_path / "out"
    report = compact_traces(tree, out, now=NOW)
    assert report.new_rows == 20
    assert [(r.source, r.location.split(" span")[0]) for r in report.rejects] == [
        (str(bad.resolve()), "line 2"),
        (str(bad.resolve()), "line 4"),
    ]
    assert "gen_ai.latency.e2e" in report.rejects[1].message


def _minutes(store: Store) -> tuple[pl.DataFrame, pl.DataFrame]:
    request_minutes = store.read_request_minutes().collect().sort("minute_ts", "replica")
    slo_minutes = (
        store.read_slo_minutes()
        .collect()
        .sort("slo", "minute_ts", "replica", "pool", "model", "tenant", "adapter")
    )
    return request_minutes, slo_minutes


def test_rollup_from_partitions_equals_the_rollup_of_the_ingested_requests(
    tmp_path: Path,
) -> None:
    tree = make_tree(tmp_path / "in")
    out = tmp_path / "out"
    compact_traces(tree, out, now=NOW)
    with Store.open(tmp_path / "ingested.duckdb", clock=lambda: NOW) as store:
        files = sorted(p for p in tree.rglob("*") if p.is_file())
        ingest_trace_files(files, store=store, now=NOW)
        roll_up_requests(store, criteria=CRITERIA)
        expected = _minutes(store)
    with Store.open(tmp_path / "partitions.duckdb", clock=lambda: NOW) as store:
        report = store.roll_up_partitions(out, criteria=CRITERIA)
        assert report.partitions_read == 2
        got = _minutes(store)
        assert store.rollup_is_current("request_minutes", fingerprint="request_minutes/1")
    assert expected[0].height > 60
    assert got[0].equals(expected[0])
    assert got[1].equals(expected[1])


def test_the_incremental_rollup_reads_only_changed_partitions(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "in")
    out = tmp_path / "out"
    compact_traces(tree, out, now=NOW)
    with Store.open(tmp_path / "s.duckdb", clock=lambda: NOW) as store:
        first = store.roll_up_partitions(out, criteria=CRITERIA)
        assert first.read["request_minutes"] == (
            "date=2026-11-18/hour=10",
            "date=2026-11-18/hour=11",
        )
        assert store.roll_up_partitions(out, criteria=CRITERIA).partitions_read == 0
        # A late span rewrites hour 10; a new hour arrives.
        write_lines(collector_folder(tree, 12) / "late.json", [[span(900, at_s=HOUR_10 + 3500)]])
        write_lines(collector_folder(tree, 12) / "new.json", [hour_spans(12, 10, first=200)])
        compact_traces(tree, out, now=NOW)
        after = store.roll_up_partitions(out, criteria=CRITERIA)
        assert after.read == {
            "request_minutes": ("date=2026-11-18/hour=10", "date=2026-11-18/hour=12"),
            "slo_minutes": ("date=2026-11-18/hour=10", "date=2026-11-18/hour=12"),
        }
        # Other SLOs: slo_minutes is recomputed everywhere, request_minutes nowhere.
        changed = store.roll_up_partitions(out, criteria=CRITERIA[:1])
        assert changed.read["request_minutes"] == ()
        assert len(changed.read["slo_minutes"]) == 3
        # A partition removed takes its minutes with it.
        shutil.rmtree(out / "date=2026-11-18/hour=12")
        gone = store.roll_up_partitions(out, criteria=CRITERIA[:1])
        assert gone.removed == ("date=2026-11-18/hour=12",)
        hours = store.read_request_minutes().collect()["minute_ts"].dt.hour().unique()
        assert sorted(hours.to_list()) == [10, 11]


def test_a_status_of_partition_minutes_is_evaluated_at_the_end_of_their_data(
    tmp_path: Path,
) -> None:
    tree = make_tree(tmp_path / "in")
    out = tmp_path / "out"
    compact_traces(tree, out, now=NOW)
    spec = SloSpec("available", AvailabilitySli(), 0.999, 30 * 86400, default_burn_windows())
    with Store.open(tmp_path / "s.duckdb", clock=lambda: NOW) as store:
        store.roll_up_partitions(out, criteria=[c for c in [spec.event_criterion()] if c])
        last_end = partition_rows(out)["end_ts"].max()
        assert isinstance(last_end, datetime)
        evaluated = evaluation_instant(store, specs=[spec], at=None, now=NOW)
        assert evaluated.at == last_end.replace(second=0, microsecond=0) + timedelta(minutes=1)
        (status,) = status_at(store, specs=[spec], at=evaluated.at)
        assert (status.good, status.total) == (68, 70)


def test_compact_and_rollup_commands(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "in")
    out = tmp_path / "out"
    runner = CliRunner()
    result = runner.invoke(app, ["compact", str(tree), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["files_read"], document["new_rows"], document["rejected"]) == (3, 70, 0)
    assert [p["rows"] for p in document["partitions"]] == [40, 30]
    db = tmp_path / "fleet.duckdb"
    result = runner.invoke(app, ["--db", str(db), "rollup", "--partitions", str(out), "--json"])
    assert result.exit_code == 0, result.output
    rolled = json.loads(result.stdout)
    assert (rolled["partitions_read"], rolled["requests"]["request_minutes"]) == (2, 70)
    missing = runner.invoke(app, ["compact", str(tmp_path / "nowhere"), "--out", str(out)])
    assert missing.exit_code == 2
    assert "not a folder" in missing.stderr


def test_the_capacity_measurement_reads_the_partitions_requests_as_the_stores(
    tmp_path: Path,
) -> None:
    tree = make_tree(tmp_path / "in")
    out = tmp_path / "out"
    compact_traces(tree, out, now=NOW)
    requirement = parse_requirement(
        {
            "failure_unit": "host",
            "demand": {"req_per_min": "observed"},
            "replica": {"capacity_req_per_min": 40},
            "placement": {"replicas_per_host": 2},
        },
        where="r.toml",
    )
    with (
        Store.open(tmp_path / "ingested.duckdb", clock=lambda: NOW) as ingested,
        Store.open(tmp_path / "partitions.duckdb", clock=lambda: NOW) as rolled,
    ):
        files = sorted(p for p in tree.rglob("*") if p.is_file())
        ingest_trace_files(files, store=ingested, now=NOW)
        roll_up_requests(ingested, criteria=CRITERIA)
        rolled.roll_up_partitions(out, criteria=CRITERIA)
        # A window across the hour boundary opens both partitions; one inside opens one.
        start = datetime(2026, 11, 18, 10, 40)
        for end in (datetime(2026, 11, 18, 11, 20), datetime(2026, 11, 18, 10, 50)):
            key = ["end_ts", "trace_id", "span_id"]
            stored = ingested.read_requests(from_ts=start, to_ts=end).collect().sort(key)
            read = rolled.read_partition_requests(out, from_ts=start, to_ts=end).collect()
            assert stored.height > 0
            assert (
                read.sort(key)
                .drop("ingested_ts", "source")
                .equals(stored.drop("ingested_ts", "source"))
            )
        assert (
            rolled.read_partition_requests(
                out, from_ts=datetime(2026, 11, 18, 14), to_ts=datetime(2026, 11, 18, 15)
            )
            .collect()
            .is_empty()
        )
        expected = measure(ingested, requirement=requirement, from_ts=None, to_ts=None)
        got = measure(rolled, requirement=requirement, from_ts=None, to_ts=None, partitions=out)
    assert expected.demand is not None
    assert got.demand == expected.demand
    assert got.pools == expected.pools
