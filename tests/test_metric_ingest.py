"""Metric ingest: a malformed line is named in the scrape and every other sample is stored;
storing the same scrapes twice changes nothing; uncatalogued families are counted."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from servewatch.collectors.metrics.exposition import parse_exposition
from servewatch.collectors.metrics.ingest import Page, ingest_pages
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.store import Store
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


def test_catalogue_results_kept_across_batches_still_shadow_aliases_page_by_page(
    store: Store,
) -> None:
    # Batches of one thread share what the catalogue made of each key; whether an alias is
    # shadowed still depends on the page it is on.
    labels = '{engine="0",model_name="m"}'
    alias = f"vllm:gpu_prefix_cache_hits_total{labels} 7\n"
    current = f"vllm:prefix_cache_hits_total{labels} 9\n"
    other = Target("vllm-1", TargetKind.VLLM, "http://127.0.0.1:3/metrics", replica="vllm-1")

    def stored(ts: datetime) -> list[tuple[str, str, float]]:
        points = store.read_points().collect().filter(pl.col("ts") == ts)
        series = store.read_series().collect()
        joined = points.join(series, on="series_id").sort("target_id", "value")
        return joined.select("target_id", "metric", "value").rows()

    times = [datetime(2026, 11, 18, 11, 0, s) for s in (0, 15, 30)]
    ingest_pages([Page(REPLICA, times[0], alias)], store=store)
    ingest_pages([Page(REPLICA, times[1], alias + current)], store=store)
    ingest_pages([Page(REPLICA, times[2], alias), Page(other, times[2], current)], store=store)
    assert stored(times[0]) == [("vllm-0", "vllm:prefix_cache_hits_total", 7.0)]
    assert stored(times[1]) == [("vllm-0", "vllm:prefix_cache_hits_total", 9.0)]
    assert stored(times[2]) == [
        ("vllm-0", "vllm:prefix_cache_hits_total", 7.0),
        ("vllm-1", "vllm:prefix_cache_hits_total", 9.0),
    ]


def test_a_rescaled_family_is_rescaled_in_every_batch(store: Store) -> None:
    # The first batch learns the key; the next one takes it from what was learnt.
    page = 'DCGM_FI_DEV_SM_CLOCK{gpu="0"} 1500\n'  # MHz; stored in Hz
    times = [datetime(2026, 11, 18, 11, 0, s) for s in (0, 15)]
    first = ingest_pages([Page(HOST, times[0], page)], store=store)
    second = ingest_pages([Page(HOST, times[1], page)], store=store)
    assert (first.stored_samples, second.stored_samples) == (1, 1)
    assert store.read_points().collect()["value"].to_list() == [1.5e9, 1.5e9]


def test_blanked_and_clamped_values_are_the_same_in_a_later_batch(store: Store) -> None:
    # The second batch takes each key's scale, sentinel and clamp from what the first learnt.
    page = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 150\n'  # percent, clamped to a ratio of 1
        'DCGM_FI_DEV_GPU_UTIL{gpu="1"} 40\n'
        'DCGM_FI_DEV_SM_CLOCK{gpu="0"} 9223372036854775792\n'  # the INT64 blank sentinel
    )
    times = [datetime(2026, 11, 18, 11, 0, s) for s in (0, 15)]
    for ts in times:
        ingest_pages([Page(HOST, ts, page)], store=store)
    points = store.read_points().collect().join(store.read_series().collect(), on="series_id")
    by_time = {
        ts: sorted(
            points.filter(pl.col("ts") == ts).select("metric", "labels", "value").iter_rows(),
            key=str,
        )
        for ts in times
    }
    assert by_time[times[0]] == by_time[times[1]]
    assert sorted(v for _, _, v in by_time[times[0]] if v is not None) == [0.4, 1.0]
    assert [v for _, _, v in by_time[times[0]] if v is None] == [None]
