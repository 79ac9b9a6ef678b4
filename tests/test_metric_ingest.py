"""Metric ingest: a malformed line is named in the scrape and every other sample is stored;
storing the same scrapes twice changes nothing; uncatalogued families are counted."""

from __future__ import annotations

import re
from datetime import datetime

import polars as pl
import pytest

from servewatch.collectors.metrics.drop_rules import DropRuleError, DropRules
from servewatch.collectors.metrics.exposition import parse_exposition
from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.metrics.page import Page
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


def test_every_sample_is_stored_and_uncatalogued_families_are_counted(store: Store) -> None:
    page = VLLM + "# TYPE exporter_scrapes counter\nexporter_scrapes_total 3\nvllm:future 1\n"
    report = ingest_pages([Page(REPLICA, T0, page)], store=store)
    parsed = parse_exposition(page)
    created = sum(1 for name in parsed.metric if name.endswith("_created"))
    assert report.stored_samples == len(parsed) - created
    assert report.unknown_samples > 0
    unknown = store.read_unknown_families().collect()
    assert unknown["samples"].sum() == report.unknown_samples
    series = store.read_series().collect()
    uncatalogued = series.filter(pl.col("signal").is_null())
    assert uncatalogued.height > 0
    stems = {re.sub("_(bucket|sum|count|total)$", "", m) for m in uncatalogued["metric"]}
    assert stems == set(unknown["family"])
    assert set(series["source"].drop_nulls()) <= {"vllm_engine", "dcgm"}
    counted = ingest_pages(
        [Page(REPLICA, datetime(2026, 11, 18, 11, 5), page)], store=store, keep_uncatalogued=False
    )
    assert counted.stored_samples == report.stored_samples - report.unknown_samples


def test_drop_rules_drop_whole_families_by_name_or_pattern(store: Store) -> None:
    page = (
        "# TYPE lat histogram\n"
        'lat_bucket{le="1"} 1\nlat_bucket{le="+Inf"} 2\nlat_sum 3\nlat_count 2\n'
        "python_gc_collections_total 7\nvllm:num_requests_running 4\n"
    )
    rules = DropRules.parse(["lat", "python_gc_.*"], where="scrape.drop")
    report = ingest_pages([Page(REPLICA, T0, page)], store=store, drop=rules)
    assert report.dropped_samples == 5
    assert sorted(store.read_series().collect()["metric"]) == ["vllm:num_requests_running"]
    # anchored at both ends, as Prometheus relabelling is: `lat` does not drop `latency`
    names = pl.DataFrame({"metric": ["latency_seconds", "lat_count", "lat"]})
    kept = DropRules.parse(["lat"], where="w").kept(names)["metric"].to_list()
    assert kept == ["latency_seconds"]


@pytest.mark.parametrize(
    ("patterns", "message"),
    [
        (["("], "scrape.drop[0]: '(' is not a regular expression"),
        (["ok", ""], "scrape.drop[1]: must be a non-empty pattern"),
    ],
)
def test_a_bad_drop_pattern_is_named(patterns: list[str], message: str) -> None:
    with pytest.raises(DropRuleError, match=re.escape(message)):
        DropRules.parse(patterns, where="scrape.drop")


AUTO_REPLICA = Target("auto-0", TargetKind.AUTO, "http://127.0.0.1:4/metrics", replica="auto-0")


@pytest.mark.parametrize(
    ("body", "kind", "error"),
    [
        (VLLM, "vllm", None),
        (DCGM, "dcgm", None),
        ('sglang:num_running_reqs{model_name="m"} 3\nprocess_open_fds 9\n', "sglang", None),
        ("trtllm_kv_cache_hit_rate 0.5\n", "trtllm", None),
        ("trtllm:request_success_total 5\n", "trtllm", None),
        ("tgi_queue_size 2\n", "tgi", None),
        ("llamacpp:requests_processing 1\n", "llamacpp", None),
        (
            "node_cpu_seconds_total 5\nprocess_open_fds 9\n",
            None,
            "cannot tell what serves the page: families node_cpu_seconds, process_open_fds",
        ),
        (
            "vllm:num_requests_running 1\nDCGM_FI_DEV_GPU_TEMP 40\n",
            None,
            (
                "the page mixes families of 2 kinds (vllm: vllm:num_requests_running; dcgm: "
                "DCGM_FI_DEV_GPU_TEMP)"
            ),
        ),
    ],
)
def test_the_kind_of_a_page_is_told_from_its_families(
    store: Store, body: str, kind: str | None, error: str | None
) -> None:
    report = ingest_pages([Page(AUTO_REPLICA, T0, body)], store=store)
    scrape = store.read_scrapes().collect().row(0, named=True)
    assert scrape["kind"] == kind
    assert scrape["ok"] is (error is None)
    if error is None:
        assert scrape["error"] is None
        assert store.read_targets().collect()["kind"].to_list() == [kind]
    else:
        assert error in scrape["error"]
        assert [r.message for r in report.line_errors] == [scrape["error"]]
        # nothing is lost: the samples are kept, uncatalogued
        assert report.stored_samples == len(parse_exposition(body))
        assert store.read_series().collect()["signal"].null_count() == report.stored_samples


def test_a_dcgm_page_without_a_kind_is_catalogued_as_dcgm(store: Store) -> None:
    host = Target("dcgm-b", TargetKind.AUTO, "http://127.0.0.1:5/metrics", host="gpu-node-1")
    told = ingest_pages([Page(host, T0, DCGM)], store=store)
    given = ingest_pages([Page(HOST, T0, DCGM)], store=store)
    assert told.stored_samples == given.stored_samples
    assert told.unknown_samples == given.unknown_samples
    series = store.read_series().collect()
    by_target = {
        target: set(series.filter(pl.col("target_id") == target)["signal"])
        for target in ("dcgm-a", "dcgm-b")
    }
    assert by_target["dcgm-a"] == by_target["dcgm-b"]
    assert None not in by_target["dcgm-b"]


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


V085 = (
    "# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries, in terms of number of "
    "queried blocks.\n"
    "# TYPE vllm:gpu_prefix_cache_queries_total counter\n"
    'vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 40\n'
    "# HELP vllm:gpu_prefix_cache_hits_total GPU prefix cache hits, in terms of number of cached "
    "blocks.\n"
    "# TYPE vllm:gpu_prefix_cache_hits_total counter\n"
    'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 10\n'
)
CACHE_CONFIG = (
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="9000"} 1\n'
)


def _prefix_values(store: Store) -> dict[str, float]:
    joined = store.read_points().collect().join(store.read_series().collect(), on="series_id")
    prefix = joined.filter(pl.col("metric").str.contains("prefix_cache"))
    return dict(zip(prefix["metric"], prefix["value"], strict=True))


@pytest.mark.parametrize(
    ("page", "values", "noted"),
    [
        # vLLM <= 0.8.5 counted blocks: times the page's block size, in tokens
        (
            V085 + CACHE_CONFIG,
            {"vllm:prefix_cache_queries_total": 640.0, "vllm:prefix_cache_hits_total": 160.0},
            False,
        ),
        # no block size to convert with: kept as counted, and said so
        (
            V085,
            {"vllm:prefix_cache_queries_total": 40.0, "vllm:prefix_cache_hits_total": 10.0},
            True,
        ),
        # 0.9.0 counts tokens under the same names, and its help says so
        (
            V085.replace("blocks", "tokens") + CACHE_CONFIG,
            {"vllm:prefix_cache_queries_total": 40.0, "vllm:prefix_cache_hits_total": 10.0},
            False,
        ),
    ],
)
def test_block_counted_prefix_counters_are_converted_to_tokens(
    store: Store, page: str, values: dict[str, float], noted: bool
) -> None:
    report = ingest_pages([Page(REPLICA, T0, page)], store=store)
    assert _prefix_values(store) == values
    assert any("count KV blocks" in r.message for r in report.line_errors) is noted
    assert store.read_scrapes().collect()["ok"].to_list() == [True]
