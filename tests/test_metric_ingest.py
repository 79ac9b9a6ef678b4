"""Metric ingest: a malformed line is named in the scrape and every other sample is stored;
storing the same scrapes twice changes nothing; uncatalogued families are counted."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from collectors.exposition import parse_exposition
from collectors.metric_ingest import Page, ingest_pages
from collectors.targets import Target, TargetKind
from pipeline.store import Store
from tests.conftest import FIXTURES

VLLM = (FIXTURES / "samples" / "vllm_metrics_production-stack-issue-617.txt").read_text()
DCGM = (FIXTURES / "samples" / "dcgm_aicr-h100-vllm.txt").read_text()
T0 = datetime(2026, 11, 18, 11, 0, 0)
REPLICA = Target("vllm-0", TargetKind.VLLM, "http://127.0.0.1:1/metrics", replica="vllm-0")
HOST = Target("dcgm-a", TargetKind.DCGM, "http://127.0.0.1:2/metrics", host="gpu-node-1")


def damaged(text: str, *, at_line: int) -> str:
    lines = text.splitlines()
    lines.insert(at_line - 1, 'vllm:num_requests_running{engine="0" 3')  # no closing brace
    return "\n".join(lines) + "\n"


def test_a_malformed_line_is_named_and_the_rest_of_the_page_is_stored(store: Store) -> None:
    clean = ingest_pages([Page(REPLICA, T0, VLLM)], store=store).stored_samples
    body = damaged(VLLM, at_line=7)
    report = ingest_pages([Page(REPLICA, datetime(2026, 11, 18, 11, 1), body)], store=store)
    assert report.stored_samples == clean  # nothing else lost
    (error,) = report.line_errors
    assert error.location.endswith("line 7")
    assert "closing '}'" in error.message
    scrape = store.read_scrapes().collect().filter(pl.col("ts") == datetime(2026, 11, 18, 11, 1))
    assert scrape["ok"].to_list() == [False]
    assert scrape["samples"].to_list() == [clean]
    assert "line 7:" in scrape["error"].item()
    recorded = store.read_ingest_errors().collect()
    assert recorded["location"].str.ends_with("line 7").any()


def test_storing_the_same_scrapes_twice_changes_nothing(store: Store) -> None:
    pages = [
        Page(REPLICA, T0, VLLM),
        Page(HOST, T0, DCGM),
        Page(REPLICA, datetime(2026, 11, 18, 11, 0, 15), None, error="timed out after 10 s"),
    ]
    first = ingest_pages(pages, store=store)
    snapshot = {t: store.count(t) for t in ("targets", "scrapes", "series", "points")}
    second = ingest_pages(pages, store=store)
    assert (second.new_scrapes, second.new_points) == (0, 0)
    assert {t: store.count(t) for t in snapshot} == snapshot
    assert first.new_scrapes == 3
    failed = store.read_scrapes().collect().filter(~pl.col("ok"))
    assert failed["error"].to_list() == ["timed out after 10 s"]


def test_only_catalogued_families_are_stored_and_the_rest_counted(store: Store) -> None:
    report = ingest_pages([Page(REPLICA, T0, VLLM)], store=store)
    parsed = parse_exposition(VLLM)
    assert report.stored_samples + report.unknown_samples <= len(parsed)
    assert report.unknown_samples > 0
    unknown = store.read_unknown_families().collect()
    assert unknown["samples"].sum() == report.unknown_samples
    kept = ingest_pages(
        [Page(REPLICA, datetime(2026, 11, 18, 11, 5), VLLM)], store=store, keep_uncatalogued=True
    )
    assert kept.stored_samples == report.stored_samples + report.unknown_samples
    assert set(store.read_series().collect()["source"].drop_nulls()) <= {"vllm_engine", "dcgm"}
