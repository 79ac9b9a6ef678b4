"""SGLang, TensorRT-LLM, TGI and llama.cpp pages: every sample kept, the canonical signals
readable through `servewatch sli`, told apart from their families alone.

The pages in fixtures/samples/*_upstream-definitions.txt are built from each engine's own metric
definitions (fixtures/samples/README.md). Two scrapes a minute apart make the windowed SLIs: the
second page is the first with every counter and histogram doubled, so the window's increase is
the first page's value and the window's quantiles are the first page's own.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.metrics.exposition import parse_exposition
from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.emulator.fixture_writer import record_fleet
from servewatch.emulator.fleet_config import fleet_config_from_mapping
from servewatch.pipeline.promql import histogram_quantile
from servewatch.store import Store
from tests.conftest import FIXTURES

T0 = datetime(2026, 11, 18, 10, 0, 0)
T0_S = 1_795_000_000.0
_TYPE = re.compile(r"# TYPE (\S+) (\S+)")


def sample(name: str) -> str:
    return (FIXTURES / "samples" / f"{name}_upstream-definitions.txt").read_text()


def doubled(page: str) -> str:
    """The page with every counter, histogram and summary sample's value doubled."""
    kinds: dict[str, str] = {}
    out = []
    for line in page.splitlines():
        text = line
        if match := _TYPE.match(line):
            kinds[match.group(1)] = match.group(2)
        elif line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            family = re.sub("_(bucket|sum|count|total|created)$", "", name)
            kind = kinds.get(name) or kinds.get(family) or kinds.get(family + "_total")
            if kind in {"counter", "histogram", "summary"} and not name.endswith("_created"):
                head, value = line.rsplit(" ", 1)
                text = f"{head} {float(value) * 2!r}"
        out.append(text)
    return "\n".join(out) + "\n"


def ingest(db: Path, name: str, *, kind: TargetKind = TargetKind.AUTO) -> tuple[int, int]:
    page = sample(name)
    target = Target(f"{name}-0", kind, "http://127.0.0.1:9/metrics", replica=f"{name}-0")
    with Store.open(db) as store:
        first = ingest_pages([Page(target, T0, page)], store=store)
        second = ingest_pages([Page(target, T0 + timedelta(minutes=1), doubled(page))], store=store)
    assert not first.line_errors
    assert not second.line_errors
    return first.stored_samples, second.stored_samples


def histograms(db: Path) -> dict[str, Any]:
    result = CliRunner().invoke(
        app,
        [
            "--db",
            str(db),
            "sli",
            "--source",
            "histograms",
            "--json",
            "--from",
            "2026-11-18T10:00:00Z",
            "--to",
            "2026-11-18T10:01:00Z",
        ],
    )
    assert result.exit_code == 0, result.output
    block: dict[str, Any] = json.loads(result.stdout)["histograms"]["overall"]
    return block


def page_quantile(page: str, family: str, q: float) -> float:
    """histogram_quantile over one page's cumulative buckets of `family` (summed over series)."""
    buckets: dict[float, float] = {}
    for line in page.splitlines():
        if line.startswith(family + "_bucket"):
            bound = re.search(r'le="([^"]+)"', line)
            assert bound is not None
            le = float(bound.group(1))
            buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    value = histogram_quantile(q, sorted(buckets.items()))
    assert value is not None
    return value


# (sample, kind, TTFT histogram family or None, whether it has running and waiting gauges):
# TensorRT-LLM's first collector, as Dynamo re-exported it, had five latency families only.
ENGINES = [
    ("sglang", "sglang", "sglang:time_to_first_token_seconds", True),
    ("trtllm", "trtllm", "trtllm_time_to_first_token_seconds", True),
    ("trtllm_dynamo", "trtllm", "trtllm:time_to_first_token_seconds", False),
    ("tgi", "tgi", None, True),
    ("llamacpp", "llamacpp", None, True),
]


def test_the_table_covers_every_built_page() -> None:
    built = sorted(p.name for p in (FIXTURES / "samples").glob("*_upstream-definitions.txt"))
    assert built == sorted(f"{name}_upstream-definitions.txt" for name, *_ in ENGINES)


@pytest.mark.parametrize(("name", "kind", "ttft_family", "scheduler_state"), ENGINES)
def test_an_engine_page_keeps_every_sample_and_reads_as_its_kind(
    tmp_path: Path, name: str, kind: str, ttft_family: str | None, scheduler_state: bool
) -> None:
    db = tmp_path / "s.duckdb"
    stored, again = ingest(db, name)
    parsed = parse_exposition(sample(name))
    created = sum(1 for metric in parsed.metric if metric.endswith("_created"))
    assert stored == again == len(parsed) - created
    with Store.open(db, read_only=True) as store:
        assert set(store.read_scrapes().collect()["kind"]) == {kind}
        series = store.read_series().collect()
    assert set(series["source"].drop_nulls()) <= {f"{kind}_engine", f"{kind}_server"}
    block = histograms(db)
    assert (block["requests_running"]["mean"] is not None) is scheduler_state
    assert (block["requests_waiting"]["mean"] is not None) is scheduler_state
    if ttft_family is None:
        # The engine measures no TTFT: nothing is made up for it.
        assert block["ttft_s"]["p95"] is None
    else:
        expected = page_quantile(sample(name), ttft_family, 0.95)
        assert block["ttft_s"]["p95"] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("name", "kv_cache_usage", "hit_ratio_from"),
    [
        ("sglang", True, "counters"),
        ("trtllm", True, "counters"),
        ("tgi", False, None),
        ("llamacpp", False, None),
    ],
)
def test_kv_usage_and_cache_hit_rate_where_the_engine_has_them(
    tmp_path: Path, name: str, kv_cache_usage: bool, hit_ratio_from: str | None
) -> None:
    db = tmp_path / "s.duckdb"
    ingest(db, name)
    block = histograms(db)
    assert (block["kv_cache_usage_ratio"]["mean"] is not None) is kv_cache_usage
    assert block["prefix_cache_hit_ratio_from"] == hit_ratio_from
    if hit_ratio_from is not None:
        ratio = block["prefix_cache_hit_ratio"]
        assert 0.0 <= ratio <= 1.0
        # hits over the lookups of the window: prompt tokens, for engines that count none
        assert ratio == pytest.approx(block["prefix_cache_hits_tokens"] / block["prompt_tokens"])
        assert block["prefix_cache_hit_ratio_reported"]["mean"] is not None


def test_sglang_running_and_waiting_are_the_pages_own(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest(db, "sglang")
    page = sample("sglang")

    def gauge(family: str) -> float:
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in page.splitlines()
            if line.startswith(family + "{")
        ]
        return sum(values)

    block = histograms(db)
    assert block["requests_running"]["mean"] == pytest.approx(gauge("sglang:num_running_reqs"))
    assert block["requests_waiting"]["mean"] == pytest.approx(gauge("sglang:num_queue_reqs"))


def test_an_unprefixed_trtllm_page_is_read_when_its_target_says_so(tmp_path: Path) -> None:
    page = sample("trtllm_dynamo").replace("trtllm:", "")
    db = tmp_path / "s.duckdb"
    target = Target("t", TargetKind.TRTLLM, "http://127.0.0.1:9/metrics", replica="t")
    with Store.open(db) as store:
        ingest_pages([Page(target, T0, page)], store=store)
        series = store.read_series().collect()
    assert "ttft_s" in set(series["signal"].drop_nulls())
    assert all(
        m.startswith("trtllm_") for m in series.filter(series["signal"].is_not_null())["metric"]
    )


def exporter_page(families: int) -> str:
    """An exporter's page of `families` families no catalogue knows, of every type."""
    lines = []
    for i in range(families):
        kind = ("counter", "gauge", "histogram")[i % 3]
        name = f"acme_widget_{i}"
        lines.append(f"# TYPE {name} {kind}")
        if kind == "counter":
            lines.append(f'{name}_total{{shard="a"}} {i}')
        elif kind == "gauge":
            lines.append(f'{name}{{shard="a"}} {i / 2}')
        else:
            lines += [
                f'{name}_bucket{{le="1"}} 1',
                f'{name}_bucket{{le="+Inf"}} 2',
                f"{name}_sum 3.5",
                f"{name}_count 2",
            ]
    return "\n".join(lines) + "\n"


def test_an_exporter_page_of_40_uncatalogued_families_keeps_all_40(tmp_path: Path) -> None:
    page = "vllm:num_requests_running 1\n" + exporter_page(40)
    target = Target("x", TargetKind.VLLM, "http://127.0.0.1:9/metrics", replica="x")
    with Store.open(tmp_path / "s.duckdb") as store:
        report = ingest_pages([Page(target, T0, page)], store=store)
        series = store.read_series().collect()
        unknown = store.read_unknown_families().collect()
        points = store.read_points().collect()
    families = {re.sub("_(bucket|sum|count|total)$", "", m) for m in series["metric"]}
    assert {f"acme_widget_{i}" for i in range(40)} <= families
    assert unknown.height == 40
    assert report.stored_samples == len(parse_exposition(page)) == points.height


MIXED_FLEET = {
    "topology": {"zones": ["zone-a", "zone-b", "zone-c"], "replicas_per_host": 2},
    "pools": [
        {"name": "chat", "engine": "vllm", "replicas": 1},
        {"name": "chat-sglang", "engine": "sglang", "replicas": 1},
        {"name": "batch", "engine": "tgi", "replicas": 1},
        {"name": "trt", "engine": "trtllm", "replicas": 1},
        {"name": "trt-old", "engine": "trtllm_dynamo", "replicas": 1},
        {"name": "edge", "engine": "llamacpp", "replicas": 1},
    ],
    "workload": {"arrival": {"rate_rps": 6.0}},
}
# pool: (has a TTFT histogram, has running/waiting gauges, has KV usage)
POOLS = {
    "chat": (True, True, True),
    "chat-sglang": (True, True, True),
    "batch": (False, True, False),
    "trt": (True, True, True),
    "trt-old": (True, False, False),
    "edge": (False, True, False),
}


@pytest.mark.slow
def test_a_fleet_mixing_engines_shows_each_engines_pool(tmp_path: Path) -> None:
    config = fleet_config_from_mapping(MIXED_FLEET, source="fleet.toml")
    folder = tmp_path / "fixture"
    record_fleet(config, folder, start_s=T0_S, end_s=T0_S + 600.0, scrape_interval_s=30.0)
    db = str(tmp_path / "s.duckdb")
    runner = CliRunner()
    replayed = runner.invoke(app, ["--db", db, "replay", str(folder), "--json"])
    assert replayed.exit_code == 0, replayed.output
    with Store.open(db, read_only=True) as store:
        kinds = set(store.read_scrapes().collect()["kind"].drop_nulls())
    assert kinds == {"vllm", "sglang", "tgi", "trtllm", "llamacpp", "dcgm"}
    result = runner.invoke(
        app, ["--db", db, "sli", "--by", "pool", "--source", "histograms", "--json"]
    )
    assert result.exit_code == 0, result.output
    groups = {g["pool"]: g for g in json.loads(result.stdout)["histograms"]["groups"]}
    assert set(groups) == set(POOLS)
    for pool, (ttft, scheduler, kv) in POOLS.items():
        block = groups[pool]
        assert (block["ttft_s"]["p95"] is not None) is ttft, pool
        assert (block["requests_running"]["mean"] is not None) is scheduler, pool
        assert (block["kv_cache_usage_ratio"]["mean"] is not None) is kv, pool
    # The same work reads alike whatever page shape reported it (one engine model serves all).
    assert groups["chat-sglang"]["ttft_s"]["p95"] == pytest.approx(
        groups["chat"]["ttft_s"]["p95"], rel=0.5
    )
    report = runner.invoke(app, ["--db", db, "report", "--out", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    kv_chart = (tmp_path / "report" / "charts" / "kv-cache-usage.vl.json").read_text()
    for replica in ("vllm-0", "sglang-1", "trtllm-3"):
        assert replica in kv_chart
    page = (tmp_path / "report" / "report.html").read_text()
    for pool in (
        "chat (vllm x1)",
        "chat-sglang (sglang x1)",
        "batch (tgi x1)",
        "edge (llamacpp x1)",
    ):
        assert pool in page


def test_any_stored_family_reads_through_sli_by_its_shape(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest(db, "sglang")
    names = [
        "sglang:grammar_compilation_time_seconds",  # uncatalogued histogram
        "sglang:num_grammar_total",  # uncatalogued counter, by its sample name
        "sglang:num_grammar",  # the same, by its family
        "sglang:max_total_num_tokens",  # uncatalogued gauge
        "sglang:num_running_reqs",  # catalogued, under its canonical name
        "no_such_family",
    ]
    args = ["--db", str(db), "sli", "--source", "histograms", "--json", "--by", "replica"]
    args += ["--from", "2026-11-18T10:00:00Z", "--to", "2026-11-18T10:01:00Z"]
    for name in names:
        args += ["--metric", name]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    families = json.loads(result.stdout)["families"]
    page = sample("sglang")
    histogram = families["sglang:grammar_compilation_time_seconds"]
    assert histogram["shape"] == "histogram"
    expected = page_quantile(page, "sglang:grammar_compilation_time_seconds", 0.95)
    assert histogram["overall"]["p95"] == pytest.approx(expected)
    counter = families["sglang:num_grammar_total"]
    assert counter["shape"] == "counter"
    first = sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("sglang:num_grammar_total")
    )
    assert counter["overall"]["increase"] == pytest.approx(first)
    assert counter["overall"]["per_s"] == pytest.approx(first / 60.0)
    assert families["sglang:num_grammar"] == counter
    gauge = families["sglang:max_total_num_tokens"]
    assert gauge["shape"] == "gauge"
    assert [g["replica"] for g in gauge["groups"]] == ["sglang-0"]
    assert families["sglang:num_running_reqs"]["shape"] == "gauge"
    assert families["no_such_family"] == {"shape": None, "overall": None, "groups": []}
    table = CliRunner().invoke(app, [a for a in args if a != "--json"])
    assert table.exit_code == 0, table.output
    assert "(counter)" in table.stdout
    assert "(histogram)" in table.stdout
