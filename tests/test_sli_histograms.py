"""`servewatch sli` from scraped series: histogram quantiles, counter increases and gauges per
replica, pool, model and fleet, held against PromQL's scalar functions over the raw points."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.pipeline.promql import histogram_quantile, increase
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.sli_report import Grouping, SliSource, build_sli_report, points_window
from servewatch.store import Store

T0 = datetime(2026, 11, 18, 10, 0, 0)
SCRAPES = 13  # every 10 s for two minutes
BOUNDS = ("0.05", "0.1", "0.5", "1.0", "+Inf")
REPLICAS = {  # replica: (host, pool, model, load factor)
    "r0": ("h0", "chat", "m-a", 1),
    "r1": ("h1", "chat", "m-a", 2),
    "r2": ("h2", "code", "m-b", 3),
}
HISTOGRAMS = {
    "time_to_first_token_seconds": (3, 2, 1, 1, 0),
    "inter_token_latency_seconds": (9, 4, 1, 0, 0),
    "request_time_per_output_token_seconds": (5, 3, 1, 0, 0),
    "e2e_request_latency_seconds": (0, 0, 2, 3, 1),
}


def vllm_page(replica: str, k: int) -> str:
    """Scrape k of a replica: counters grow by a load-dependent amount each scrape; r1's
    engine restarts after scrape 7, so its counters reset."""
    _, _, model, load = REPLICAS[replica]
    n = k - 8 if replica == "r1" and k >= 8 else k
    labels = f'engine="0",model_name="{model}"'
    lines = []
    for family, per_bucket in HISTOGRAMS.items():
        lines.append(f"# TYPE vllm:{family} histogram")
        cumulative = 0
        for bound, count in zip(BOUNDS, per_bucket, strict=True):
            cumulative += count * load * n + (k % 2) * (bound == "+Inf")
            lines.append(f'vllm:{family}_bucket{{{labels},le="{bound}"}} {cumulative}')
        lines.append(f"vllm:{family}_count{{{labels}}} {cumulative}")
        lines.append(f"vllm:{family}_sum{{{labels}}} {cumulative * 0.3}")
    counters = {
        "prompt_tokens": 900 * load,
        "generation_tokens": 300 * load,
        "num_preemptions": load - 1,
        "prefix_cache_queries": 800 * load,
        "prefix_cache_hits": 100 * load * load,
    }
    for name, per_scrape in counters.items():
        lines.append(f"# TYPE vllm:{name} counter")
        lines.append(f"vllm:{name}_total{{{labels}}} {per_scrape * n}")
    lines.append("# TYPE vllm:request_success counter")
    for reason, share in (("stop", 4), ("length", 1)):
        lines.append(
            f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {share * load * n}'
        )
    for name, value in (
        ("kv_cache_usage_perc", 0.1 * load + 0.01 * k),
        ("num_requests_running", load + k % 3),
        ("num_requests_waiting", k % 2),
    ):
        lines.append(f"# TYPE vllm:{name} gauge")
        lines.append(f"vllm:{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def dcgm_page(host: str, k: int) -> str:
    load = 1 + int(host[1:])
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge", "# TYPE DCGM_FI_DEV_POWER_USAGE gauge"]
    for gpu in (0, 1):
        labels = f'gpu="{gpu}",UUID="GPU-{host}-{gpu}",Hostname="{host}"'
        lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {20 * load + 5 * gpu + k}")
        lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {100.0 * load + 10 * gpu + k}")
    return "\n".join(lines) + "\n"


def fill(store: Store) -> None:
    pages = []
    for k in range(SCRAPES):
        at = T0 + timedelta(seconds=10 * k)
        for replica, (host, pool, model, _) in REPLICAS.items():
            target = Target(
                replica,
                TargetKind.VLLM,
                f"http://{replica}/metrics",
                replica,
                host,
                "z",
                model,
                pool,
                2,  # each replica owns both GPUs of its host's exporter page
            )
            pages.append(Page(target, at, vllm_page(replica, k)))
        for host in ("h0", "h1"):  # r2's host runs no DCGM exporter
            target = Target(
                f"dcgm-{host}", TargetKind.DCGM, f"http://{host}:9400/metrics", host=host, zone="z"
            )
            pages.append(Page(target, at, dcgm_page(host, k)))
    report = ingest_pages(pages, store=store)
    assert report.new_scrapes == SCRAPES * 5
    assert not report.line_errors


@pytest.fixture
def scraped(tmp_path: Path) -> Path:
    db = tmp_path / "scraped.duckdb"
    with Store.open(db) as store:
        fill(store)
    return db


def epoch(moment: datetime) -> float:
    return moment.replace(tzinfo=UTC).timestamp()


class Oracle:
    """PromQL by hand: the scalar functions of pipeline.promql over the stored raw points."""

    def __init__(self, store: Store) -> None:
        series = store.read_series().collect()
        points = store.read_points().collect()
        self.samples: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for sid, ts, value in points.iter_rows():
            self.samples[sid].append((epoch(ts), value))
        self.series = list(series.iter_rows(named=True))
        # Consecutive gauge windows count a sample on their shared edge once, in the earlier.
        self.left_open = False

    def members(self, replicas: set[str]) -> list[dict[str, Any]]:
        return [s for s in self.series if s["target_id"] in replicas]

    def increase(self, sid: int, start: datetime, end: datetime) -> float | None:
        return increase(self.samples[sid], range_start_s=epoch(start), range_end_s=epoch(end))

    def quantile(
        self, family: str, q: float, replicas: set[str], start: datetime, end: datetime
    ) -> float:
        by_le: dict[float, float] = defaultdict(float)
        for s in self.members(replicas):
            if s["metric"] == f"vllm:{family}_bucket":
                le = float(json.loads(s["labels"])["le"])
                by_le[le] += self.increase(s["series_id"], start, end) or 0.0
        return histogram_quantile(q, by_le.items())

    def counter(self, metric: str, replicas: set[str], start: datetime, end: datetime) -> float:
        found = [
            self.increase(s["series_id"], start, end)
            for s in self.members(replicas)
            if s["metric"] == metric
        ]
        return sum(v for v in found if v is not None)

    def gauge(
        self, signal: str, targets: set[str], start: datetime, end: datetime
    ) -> list[list[float]]:
        return [
            [
                v
                for t, v in self.samples[s["series_id"]]
                if epoch(start) <= t <= epoch(end) and not (self.left_open and t == epoch(start))
            ]
            for s in self.series
            if s["target_id"] in targets and s["signal"] == signal
        ]


GROUPS = {
    Grouping.REPLICA: {"r0": {"r0"}, "r1": {"r1"}, "r2": {"r2"}},
    Grouping.POOL: {"chat": {"r0", "r1"}, "code": {"r2"}},
    Grouping.MODEL: {"m-a": {"r0", "r1"}, "m-b": {"r2"}},
}
LIMITS = GoodputLimits()


def check_block(
    block: dict[str, Any], oracle: Oracle, replicas: set[str], start: datetime, end: datetime
) -> None:
    window_s = (end - start).total_seconds()
    for stem, family in (
        ("ttft", "time_to_first_token_seconds"),
        ("itl", "inter_token_latency_seconds"),
        ("tpot", "request_time_per_output_token_seconds"),
        ("e2e", "e2e_request_latency_seconds"),
    ):
        for p in (50, 90, 95, 99):
            assert block[f"{stem}_s"][f"p{p}"] == pytest.approx(
                oracle.quantile(family, p / 100, replicas, start, end)
            )
    queries = oracle.counter("vllm:prefix_cache_queries_total", replicas, start, end)
    hits = oracle.counter("vllm:prefix_cache_hits_total", replicas, start, end)
    assert block["prefix_cache_hit_ratio"] == pytest.approx(hits / queries)
    assert block["preemptions"] == pytest.approx(
        oracle.counter("vllm:num_preemptions_total", replicas, start, end)
    )
    generated = oracle.counter("vllm:generation_tokens_total", replicas, start, end)
    assert block["generation_tokens_per_s"] == pytest.approx(generated / window_s)
    finished = {
        reason: sum(
            oracle.increase(s["series_id"], start, end) or 0.0
            for s in oracle.members(replicas)
            if s["metric"] == "vllm:request_success_total"
            and json.loads(s["labels"])["finished_reason"] == reason
        )
        for reason in ("stop", "length")
    }
    assert block["finish_reasons"] == pytest.approx(finished)
    kv = oracle.gauge("kv_cache_usage_ratio", replicas, start, end)
    assert block["kv_cache_usage_ratio"]["mean"] == pytest.approx(
        sum(sum(v) / len(v) for v in kv) / len(kv)
    )
    assert block["kv_cache_usage_ratio"]["max"] == pytest.approx(max(max(v) for v in kv))
    running = oracle.gauge("requests_running", replicas, start, end)
    assert block["requests_running"]["mean"] == pytest.approx(sum(sum(v) / len(v) for v in running))
    hosts = {f"dcgm-{REPLICAS[r][0]}" for r in replicas}
    power = oracle.gauge("gpu_power_w", hosts, start, end)
    if power:
        assert block["gpu_power_w"]["mean"] == pytest.approx(sum(sum(v) / len(v) for v in power))
        util = oracle.gauge("gpu_util_ratio", hosts, start, end)
        assert block["gpu_util_ratio"]["max"] == pytest.approx(max(max(v) for v in util))
    else:
        assert block["gpu_power_w"]["mean"] is None


@pytest.mark.parametrize("by", list(GROUPS))
def test_histogram_slis_per_group_match_promql_by_hand(scraped: Path, by: Grouping) -> None:
    start, end = T0 + timedelta(seconds=5), T0 + timedelta(seconds=115)
    with Store.open(scraped) as store:
        report = build_sli_report(
            store.read_window(from_ts=start, to_ts=end),
            limits=LIMITS,
            by=by,
            source=SliSource.HISTOGRAMS,
        )
        oracle = Oracle(store)
    section = report["histograms"]
    assert "overall" not in report  # traces were not asked for
    assert section["window"]["window_s"] == 110
    groups = {row[by.value]: row for row in section["groups"]}
    assert set(groups) == set(GROUPS[by])
    for name, replicas in GROUPS[by].items():
        check_block(groups[name], oracle, replicas, start, end)
    check_block(section["overall"], oracle, set(REPLICAS), start, end)


def test_window_edges_finer_than_a_millisecond_are_evaluated_at_whole_ones_inside(
    scraped: Path,
) -> None:
    """PromQL evaluates at whole milliseconds. An edge with microseconds is taken inward to
    one (never past what the window read), and every group's and the fleet's rows stay keyed
    (they once came back empty, or asked for points the window had not read)."""
    start, end = T0 + timedelta(seconds=5), T0 + timedelta(seconds=115)
    fine = timedelta(milliseconds=123, microseconds=600)
    ms = timedelta(milliseconds=1)
    with Store.open(scraped) as store:
        sections = [
            build_sli_report(
                store.read_window(from_ts=start + shift_from, to_ts=end + shift_to),
                limits=LIMITS,
                by=Grouping.REPLICA,
                source=SliSource.HISTOGRAMS,
            )["histograms"]
            for shift_from, shift_to in ((124 * ms, 123 * ms), (fine, fine))
        ]
    assert sections[0]["groups"]
    assert sections[0]["overall"]["ttft_s"]["p95"] is not None
    # Equal up to the order in which Polars happens to add floats.
    whole, finer = (dict(flat(section)) for section in sections)
    assert whole.keys() == finer.keys()
    for path, value in whole.items():
        assert finer[path] == (pytest.approx(value) if isinstance(value, float) else value), path


def test_consecutive_windows_each_evaluated_at_their_end(scraped: Path) -> None:
    with Store.open(scraped) as store:
        step = timedelta(minutes=1)
        window = store.read_window(
            from_ts=T0, to_ts=T0 + timedelta(seconds=120), **points_window(step)
        )
        report = build_sli_report(
            window,
            limits=LIMITS,
            by=Grouping.FLEET,
            step=step,
            source=SliSource.BOTH,
        )
        oracle = Oracle(store)
    assert report["overall"]["requests"] == 0  # no traces: the trace keys still answer
    windows = report["histograms"]["series"]
    assert [w["from"] for w in windows] == ["2026-11-18T10:00:00Z", "2026-11-18T10:01:00Z"]
    for window, start in zip(windows, (T0, T0 + timedelta(minutes=1)), strict=True):
        assert window["groups"] == []
        oracle.left_open = start > T0
        check_block(window["overall"], oracle, set(REPLICAS), start, start + timedelta(minutes=1))


def test_sli_json_shape_and_table(scraped: Path) -> None:
    runner = CliRunner()
    base = ["--db", str(scraped), "sli", "--source", "histograms", "--by", "pool"]
    result = runner.invoke(app, [*base, "--json", "--window", "1m"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == {"source", "by", "window", "histograms"}
    section = doc["histograms"]
    assert set(section) == {"window", "overall", "groups", "series", "unmatched_gpus"}
    assert section["unmatched_gpus"] == []
    block = section["groups"][0]
    assert set(block) == {
        "pool",
        "ttft_s",
        "itl_s",
        "tpot_s",
        "e2e_s",
        "kv_cache_usage_ratio",
        "requests_running",
        "requests_waiting",
        "gpu_util_ratio",
        "gpu_power_w",
        "gpu_fb_used_bytes",
        "gpu_temperature_c",
        "prefix_cache_hit_ratio",
        "prefix_cache_hit_ratio_from",
        "prefix_cache_hit_ratio_reported",
        "prompt_tokens",
        "generation_tokens",
        "preemptions",
        "prefix_cache_hits_tokens",
        "prefix_cache_queries_tokens",
        "spec_decode_draft_tokens",
        "spec_decode_accepted_tokens",
        "spec_decode_acceptance_ratio",
        "prompt_tokens_per_s",
        "generation_tokens_per_s",
        "finish_reasons",
    }
    assert set(block["ttft_s"]) == {"p50", "p90", "p95", "p99", "observations"}
    assert set(block["gpu_power_w"]) == {"mean", "max"}
    table = runner.invoke(app, base)
    assert table.exit_code == 0, table.output
    assert "chat" in table.stdout
    assert "ITL" in table.stdout
    both = runner.invoke(app, ["--db", str(scraped), "sli", "--json"])
    assert {"overall", "histograms"} <= set(json.loads(both.stdout))


def test_traces_only_leaves_histograms_out(scraped: Path) -> None:
    with Store.open(scraped) as store:
        report = build_sli_report(store.read_window(), limits=LIMITS, source=SliSource.TRACES)
    assert "histograms" not in report


def test_by_adapter_the_histograms_show_the_fleet_only(scraped: Path) -> None:
    """Scraped series name no LoRA adapter: the section's rows are the fleet's alone."""
    runner = CliRunner()
    base = ["--db", str(scraped), "sli", "--source", "histograms", "--json"]
    by_adapter = runner.invoke(app, [*base, "--by", "adapter"])
    fleet = runner.invoke(app, [*base, "--by", "fleet"])
    assert by_adapter.exit_code == fleet.exit_code == 0, by_adapter.output
    adapter_doc, fleet_doc = json.loads(by_adapter.stdout), json.loads(fleet.stdout)
    assert adapter_doc["by"] == "adapter"
    assert adapter_doc["histograms"]["groups"] == []
    # The same figures (sums in parallel may differ in the last bits from run to run).
    got, want = dict(flat(adapter_doc["histograms"])), dict(flat(fleet_doc["histograms"]))
    assert got.keys() == want.keys()
    for path, value in want.items():
        expected = pytest.approx(value, rel=1e-9) if isinstance(value, float) else value
        assert got[path] == expected, path


def flat(doc: object, path: str = "") -> list[tuple[str, object]]:
    if isinstance(doc, dict):
        return [item for key, value in doc.items() for item in flat(value, f"{path}.{key}")]
    if isinstance(doc, list):
        return [item for i, value in enumerate(doc) for item in flat(value, f"{path}[{i}]")]
    return [(path, doc)]
