"""Dashboards: golden Vega-Lite per chart over fixtures/dashboards_small, titles and units on
every chart, exact downsampling, column contracts, and a page that cannot run label values."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from servewatch.collectors.traces.ingest import ingest_trace_files
from servewatch.dashboards.alert_band import firing_intervals
from servewatch.dashboards.attainment import attainment_chart
from servewatch.dashboards.capacity_curve import CapacityCurve, capacity_curve_chart
from servewatch.dashboards.downsampling import choose_buckets
from servewatch.dashboards.drill_timeline import drill_timeline_chart
from servewatch.dashboards.export import chart_specs, spec_json
from servewatch.dashboards.kv_usage import MAX_CELLS, kv_usage_heatmap
from servewatch.dashboards.latency import LatencyStat, latency_chart, latency_from_requests
from servewatch.dashboards.prefix_cache import prefix_cache_chart
from servewatch.dashboards.report import (
    CapacityView,
    DrillView,
    FailureView,
    Report,
    ReportInputs,
    TornadoView,
    build_report,
    slug,
)
from servewatch.dashboards.report_page import PageChart, render_page, script_json
from servewatch.dashboards.token_throughput import token_throughput_chart
from servewatch.dashboards.tornado import tornado_chart
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.sli_report import build_sli_report
from servewatch.store import Store
from tests.conftest import FIXTURES

CASE = FIXTURES / "dashboards_small"
EXPECTED = CASE / "expected"
SLUGS = (
    "capacity-curve",
    "failure-table",
    "sensitivity-tornado",
    "latency-ttft",
    "latency-tpot",
    "latency-itl",
    "latency-e2e",
    "request-phases",
    "attainment",
    "goodput",
    "token-goodput",
    "error-budget",
    "burn-rate-availability",
    "burn-rate-chat-latency",
    "alerts",
    "kv-cache-usage",
    "prefix-cache-hit-rate",
    "scheduler-state",
    "token-throughput",
    "finish-reasons",
    "prompt-length",
    "generation-length",
    "load-balance",
    "gpu-health",
    "gpu-replicas",
    "seven-boxes",
)
T0 = datetime(2026, 11, 18)


# -- the fixture as report inputs ----------------------------------------------------------------


def fixture_inputs(folder: Path = CASE) -> tuple[ReportInputs, tuple[datetime, datetime], Any]:
    settings = json.loads((folder / "settings.json").read_text(encoding="utf-8"))
    frames = {p.stem: pl.read_parquet(p) for p in folder.glob("*.parquet")}
    limits = settings["limits_s"]
    inputs = ReportInputs(
        requests=frames["requests"],
        request_minutes=frames["request_minutes"],
        slo_minutes=frames["slo_minutes"],
        slo_objectives=settings["slo_objectives"],
        latency_percentiles=frames["latency_percentiles"],
        finish_reasons=frames["finish_reasons"],
        kv_cache_usage=frames["kv_cache_usage"],
        prefix_cache=frames["prefix_cache"],
        scheduler_state=frames["scheduler_state"],
        gpu=frames["gpu"],
        xid_events=frames["xid_events"],
        budget_remaining=frames["budget_remaining"],
        burn_rates=frames["burn_rates"],
        burn_thresholds=frames["burn_thresholds"],
        alert_intervals=frames["alert_intervals"],
        capacity=CapacityView(
            frames["capacity_points"], CapacityCurve(**settings["capacity_curve"])
        ),
        failure_table=FailureView(
            frames["failure_table"],
            demand_rate=settings["failure_demand_rate"],
            rate_unit=settings["failure_rate_unit"],
            failure_unit=settings["failure_unit"],
        ),
        tornado=TornadoView(
            frames["tornado"], baseline_replicas=settings["tornado_baseline_replicas"]
        ),
    )
    start, end = (datetime.fromisoformat(t) for t in settings["window"])
    goodput = GoodputLimits(ttft_s=limits["ttft"], tpot_s=limits["tpot"], e2e_s=limits["e2e"])
    return inputs, (start, end), goodput


def fixture_report() -> Report:
    inputs, window, limits = fixture_inputs()
    return build_report(inputs, title="dashboards_small", window=window, limits=limits)


@pytest.fixture(scope="module")
def specs() -> dict[str, dict[str, Any]]:
    return chart_specs(fixture_report())


# -- golden Vega-Lite ----------------------------------------------------------------------------


def assert_same(got: Any, want: Any, where: str) -> None:
    """Equal JSON, floats to 1e-9 relative (a Polars upgrade may move the last bit)."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        assert sorted(got) == sorted(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list), where
        assert len(got) == len(want), f"{where}: {len(got)} items, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, int | float):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), where
    else:
        assert got == want, where


def test_the_fixture_report_has_every_panel(
    specs: dict[str, dict[str, Any]], update_golden: bool
) -> None:
    assert tuple(specs) == SLUGS
    if update_golden:
        return  # the golden files are (re)written by the test below
    stored = sorted(p.name.removesuffix(".vl.json") for p in EXPECTED.glob("*.vl.json"))
    assert stored == sorted(SLUGS), "expected/ must hold one file per chart: see --update-golden"


@pytest.mark.parametrize("chart", SLUGS)
def test_golden_vega_lite(
    chart: str, specs: dict[str, dict[str, Any]], update_golden: bool
) -> None:
    golden = EXPECTED / f"{chart}.vl.json"
    if update_golden:
        EXPECTED.mkdir(exist_ok=True)
        golden.write_text(spec_json(specs[chart]), encoding="utf-8")
    assert golden.exists(), f"{golden} missing: run pytest with --update-golden once"
    assert_same(json.loads(spec_json(specs[chart])), json.loads(golden.read_text()), chart)


# -- every chart says what it shows, in which units ----------------------------------------------


def views(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("layer", "vconcat", "hconcat", "concat"):
        for child in spec.get(key, []):
            yield from views(child)
    if "mark" in spec:
        yield spec


def positional(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for view in views(spec):
        for channel in ("x", "y"):
            encoding = view.get("encoding", {}).get(channel)
            if isinstance(encoding, dict) and "field" in encoding:
                yield channel, encoding


@pytest.mark.parametrize("chart", SLUGS)
def test_every_chart_has_a_title_a_subtitle_and_axis_titles_with_units(
    chart: str, specs: dict[str, dict[str, Any]]
) -> None:
    spec = specs[chart]
    assert spec["title"]["text"], chart
    assert spec["title"]["subtitle"], f"{chart} has no subtitle saying what is drawn"
    if all(view["mark"]["type"] == "text" for view in views(spec)):
        return  # a printed table: no axes to title
    titled = 0
    for channel, encoding in positional(spec):
        if encoding.get("axis", {}) is None:
            continue  # a shared axis drawn by the neighbouring view
        title = encoding.get("title")
        if title is None:
            # A layer that reuses a field another layer of the same view already titled.
            continue
        titled += 1
        if encoding["type"] == "quantitative":
            assert title.endswith(")"), f"{chart} {channel}: {title!r} lacks a unit"
            assert "(" in title, f"{chart} {channel}: {title!r} lacks a unit"
        if encoding["type"] == "temporal":
            assert title == "time (UTC)", f"{chart} {channel}: {title!r}"
    assert titled >= 2, f"{chart}: fewer than two titled axes"


def test_downsampled_charts_say_so_in_the_subtitle(specs: dict[str, dict[str, Any]]) -> None:
    # The fixture's hour fits one point per minute: nothing may claim to be downsampled.
    for chart, spec in specs.items():
        assert not any("Downsampled" in line for line in spec["title"]["subtitle"]), chart
    day = pl.DataFrame(
        {
            "minute_ts": [T0 + timedelta(minutes=m) for m in range(1440)],
            "prompt_tokens": [60] * 1440,
            "generation_tokens": list(range(1440)),
        }
    )
    spec = token_throughput_chart(day).to_dict()
    assert "Downsampled: 1,440 minutes into 288 buckets of 5m" in " ".join(
        spec["title"]["subtitle"]
    )


# -- downsampling keeps each chart's meaning -----------------------------------------------------


def datasets(spec: Any) -> Iterator[list[dict[str, Any]]]:
    if isinstance(spec, dict):
        yield from spec.get("datasets", {}).values()
        data = spec.get("data")
        if isinstance(data, dict) and "values" in data:
            yield data["values"]
        for value in spec.values():
            yield from datasets(value)
    elif isinstance(spec, list):
        for item in spec:
            yield from datasets(item)


def chart_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of the spec's largest inline dataset (the series the chart draws)."""
    return max(datasets(spec), key=len)


def test_bucket_ladder_keeps_a_line_under_the_point_budget() -> None:
    assert choose_buckets(60).width_s == 60
    assert choose_buckets(1440).width_s == 300
    assert choose_buckets(1440, max_points=1440).width_s == 60
    assert choose_buckets(7 * 1440).width_s == 1800
    with pytest.raises(ValueError, match="max_points is 0"):
        choose_buckets(10, max_points=0)


def test_token_rates_stay_exact_after_downsampling() -> None:
    day = pl.DataFrame(
        {
            "minute_ts": [T0 + timedelta(minutes=m) for m in range(1440)],
            "prompt_tokens": [(m * 7) % 1000 for m in range(1440)],
            "generation_tokens": [(m * 13) % 500 for m in range(1440)],
        }
    )
    rows = chart_rows(token_throughput_chart(day).to_dict())
    assert len(rows) == 2 * 288
    for kind, column in (("prompt", "prompt_tokens"), ("generation", "generation_tokens")):
        total = sum(r["tokens_per_s"] * 300 for r in rows if r["tokens"] == kind)
        assert total == pytest.approx(day[column].sum(), rel=1e-3)


def test_downsampled_percentiles_keep_the_worst_minute() -> None:
    minutes = [T0 + timedelta(minutes=m) for m in range(1440)]
    frame = pl.DataFrame(
        {
            "minute_ts": minutes,
            "percentile": ["p99"] * 1440,
            "latency_s": [5.0 if m == 7 else 0.1 for m in range(1440)],
        }
    )
    spec = latency_chart(frame, stat=LatencyStat.TTFT, limit_s=0.5).to_dict()
    rows = chart_rows(spec)
    assert len(rows) == 288
    assert max(r["latency_s"] for r in rows) == 5.0
    assert any("highest of its minutes" in line for line in spec["title"]["subtitle"])


def test_hit_rate_is_hits_over_queries_not_a_mean_of_ratios() -> None:
    frame = pl.DataFrame(
        {
            "minute_ts": [T0, T0, T0 + timedelta(minutes=1)],
            "replica": ["a", "b", "a"],
            "hits_tokens": [900.0, 0.0, 10.0],
            "queries_tokens": [1000.0, 10.0, 100.0],
        }
    )
    rows = chart_rows(prefix_cache_chart(frame).to_dict())
    first = next(r for r in rows if r["ts"] == int(T0.timestamp() * 1000))
    assert first["fleet_hit_ratio"] == pytest.approx(900 / 1010, rel=1e-3)
    assert first["lowest_replica"] == 0.0
    assert first["highest_replica"] == pytest.approx(0.9)


def test_attainment_is_good_over_total_per_bucket() -> None:
    minutes = [T0 + timedelta(minutes=m) for m in range(1440)]
    frame = pl.DataFrame(
        {
            "minute_ts": minutes,
            "slo": ["chat"] * 1440,
            "good": [0 if m % 5 == 0 else 100 for m in range(1440)],
            "total": [1 if m % 5 == 0 else 100 for m in range(1440)],
        }
    )
    rows = chart_rows(attainment_chart(frame, objectives={"chat": 0.99}).to_dict())
    # Each 5-minute bucket: 400 good of 401, not the mean of four 1.0 and one 0.0.
    assert {round(r["attainment_ratio"], 6) for r in rows} == {round(400 / 401, 6)}


def test_kv_heatmap_cells_stay_bounded_for_a_fleet_day() -> None:
    replicas = [f"vllm-{i}" for i in range(45)]
    frame = pl.DataFrame(
        {
            "minute_ts": [T0 + timedelta(minutes=m) for m in range(1440) for _ in replicas],
            "replica": replicas * 1440,
            "kv_cache_usage_ratio": [0.5] * (1440 * 45),
        }
    )
    spec = kv_usage_heatmap(frame).to_dict()
    rows = chart_rows(spec)
    assert len(rows) <= MAX_CELLS
    assert spec["encoding"]["y"]["sort"][:3] == ["vllm-0", "vllm-1", "vllm-2"]
    assert spec["encoding"]["y"]["sort"][10] == "vllm-10"


def test_capacity_scatter_is_sampled_and_says_so() -> None:
    points = pl.DataFrame({"load": [i / 1000 for i in range(10_000)], "latency_s": [0.02] * 10_000})
    curve = CapacityCurve(
        intercept_s=0.02,
        slope_s_per_load=0.01,
        knee_load=15.0,
        knee_low_load=12.0,
        knee_high_load=20.0,
        latency_limit_s=0.05,
        load_unit="req/s",
        confidence_ratio=0.9,
    )
    spec = capacity_curve_chart(points, curve=curve, max_points=1000).to_dict()
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "every 10th of 10,000 windows drawn (1,000)" in subtitle
    assert "extrapolated, 1.5x the highest observed load" in subtitle


def test_tornado_ranks_by_swing_and_marks_infeasible_ends() -> None:
    frame = pl.DataFrame(
        {
            "assumption": ["small", "none-fits", "large"],
            "low": [1.0, 0.1, 10.0],
            "high": [2.0, 0.9, 50.0],
            "replicas_at_low": [6, None, 4],
            "replicas_at_high": [7, 6, 12],
        },
        schema_overrides={"replicas_at_low": pl.Int64},
    )
    spec = tornado_chart(frame, baseline_replicas=6).to_dict()
    assert spec["layer"][0]["encoding"]["y"]["sort"] == ["none-fits", "large", "small"]
    assert "no fleet meets the requirement" in " ".join(spec["title"]["subtitle"])


# -- inputs: contracts, sources, omissions -------------------------------------------------------


def test_a_frame_missing_columns_is_refused_with_the_contract() -> None:
    frame = pl.DataFrame({"minute_ts": [T0], "replica": ["a"], "usage": [0.5]})
    with pytest.raises(ValueError, match="KV-cache usage heatmap") as error:
        kv_usage_heatmap(frame)
    message = str(error.value)
    assert "lacks column(s) kv_cache_usage_ratio" in message
    assert "it has minute_ts, replica, usage" in message
    assert "kv_cache_usage_ratio (number: mean KV blocks in use, ratio 0-1)" in message


def test_a_mistyped_column_is_refused() -> None:
    frame = pl.DataFrame(
        {"minute_ts": ["2026-11-18 11:00"], "replica": ["a"], "kv_cache_usage_ratio": [0.5]}
    )
    with pytest.raises(ValueError, match="column minute_ts is String; allowed: a time column"):
        kv_usage_heatmap(frame)


def test_latency_from_requests_follows_vllm_definitions() -> None:
    inputs, _, _ = fixture_inputs()
    assert inputs.requests is not None
    requests = inputs.requests.lazy()
    got = latency_from_requests(requests, stat=LatencyStat.TPOT).collect()
    minute = got["minute_ts"].min()
    assert isinstance(minute, datetime)
    chosen = (
        requests.filter(
            pl.col("ok")
            & (pl.col("completion_tokens") > 1)
            & (pl.col("end_ts").dt.truncate("1m") == minute)
        )
        .select(tpot=pl.col("decode_s") / (pl.col("completion_tokens") - 1))
        .collect()["tpot"]
        .sort()
        .to_list()
    )
    rank = 0.95 * (len(chosen) - 1)
    low = math.floor(rank)
    want = chosen[low] + (chosen[min(low + 1, len(chosen) - 1)] - chosen[low]) * (rank - low)
    p95 = got.filter((pl.col("minute_ts") == minute) & (pl.col("percentile") == "p95"))
    assert p95["latency_s"][0] == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="inter_token_latency_seconds histogram"):
        latency_from_requests(requests, stat=LatencyStat.ITL)


def test_a_report_from_traces_alone_says_what_is_missing() -> None:
    inputs, window, limits = fixture_inputs()
    report = build_report(ReportInputs(requests=inputs.requests), window=window, limits=limits)
    slugs = [c.slug for c in report.charts]
    assert slugs == [
        "latency-ttft",
        "latency-tpot",
        "latency-e2e",
        "request-phases",
        "token-throughput",
        "finish-reasons",
        "prompt-length",
        "generation-length",
        "seven-boxes",
    ]
    # Each missing panel says, in the reader's words, what would provide it.
    omitted = dict(report.omitted)
    assert "inter-token latency histogram" in omitted["Inter-token latency (ITL)"]
    assert "servewatch scrape" in omitted["KV-cache usage per replica"]
    assert "--slo FILE" in omitted["SLO verdicts"]
    assert "--requirement FILE" in omitted["Capacity answer"]
    assert "Sensitivity tornado" not in omitted  # one line covers the capacity answer
    assert all("needs" not in reason for reason in omitted.values()), omitted
    finish = next(c for c in report.charts if c.slug == "finish-reasons").chart.to_dict()
    assert "derived from spans" in " ".join(finish["title"]["subtitle"])


def test_report_from_a_store_of_ingested_spans(store: Store) -> None:
    """What `servewatch report` does today: frames read from the store, nothing else."""
    ingest_trace_files([FIXTURES / "vllm_spans_small" / "spans.jsonl"], store=store)
    limits = GoodputLimits(ttft_s=0.5, tpot_s=0.05)
    sli_report = build_sli_report(store.read_window(), limits=limits)
    report = build_report(
        ReportInputs(requests=store.read_requests(), sli_report=sli_report), limits=limits
    )
    # Which replica first (the SLI report is by replica), then the detail charts.
    assert [c.slug for c in report.charts][:4] == [
        "replicas",
        "latency-ttft",
        "latency-tpot",
        "latency-e2e",
    ]
    assert report.replicas is not None
    assert report.replicas["replica"].to_list() == sorted(
        report.replicas["replica"].to_list(),
        key=lambda r: next(
            g["attainment_ratio"] for g in sli_report["groups"] if g["replica"] == r
        ),
    )
    facts = dict(report.facts)
    assert facts["requests"] == "228 (5 failed)"
    assert facts["replicas"] == "3"
    assert facts["latency limits"] == "TTFT <= 500 ms, TPOT <= 50 ms"
    assert facts["attainment"].endswith("of requests met every limit")
    # Token goodput beside request goodput (the figures `sli` reports; test_replay holds them
    # to an oracle over the raw spans).
    overall = sli_report["overall"]
    assert 0 < overall["token_goodput_ratio"] < 1
    assert facts["token goodput"] == (
        f"{overall['token_goodput_tps']:,.4g} good output tokens/s "
        f"({overall['token_goodput_ratio']:.2%} of output tokens)"
    )
    assert report.window is not None
    assert report.window[0] == report.window[0].replace(second=0, microsecond=0)
    for chart in report.charts:
        chart.chart.to_dict()  # validates against the Vega-Lite schema


def test_histogram_latency_stands_in_when_there_are_no_traces() -> None:
    inputs, window, _ = fixture_inputs()
    itl = inputs.latency_percentiles
    assert itl is not None
    ttft = itl.lazy().with_columns(stat=pl.lit("ttft")).collect()
    report = build_report(ReportInputs(latency_percentiles=ttft), window=window)
    chart = next(c for c in report.charts if c.slug == "latency-ttft").chart.to_dict()
    assert "from vLLM histograms" in chart["title"]["subtitle"][0]


def test_limits_come_from_the_sli_report_when_not_given() -> None:
    inputs, window, _ = fixture_inputs()
    sli = {"limits": {"ttft_ms": 250.0, "tpot_ms": None, "e2e_ms": None}, "overall": {}}
    report = build_report(ReportInputs(requests=inputs.requests, sli_report=sli), window=window)
    ttft = report.charts[0].chart.to_dict()
    assert "SLO limit 0.25 s" in " ".join(ttft["title"]["subtitle"])
    assert ("latency limits", "TTFT <= 250 ms") in report.facts


def test_firing_intervals_run_from_firing_to_the_next_change() -> None:
    def change(state: str, minute: int) -> dict[str, Any]:
        return {
            "slo": "chat",
            "severity": "page",
            "long_window_s": 3600,
            "short_window_s": 300,
            "state": state,
            "changed_ts": T0 + timedelta(minutes=minute),
        }

    changes = pl.DataFrame(
        [change("pending", 0), change("firing", 2), change("resolved", 9), change("firing", 30)]
    )
    intervals = firing_intervals(changes)
    assert intervals.select("start_ts", "end_ts").rows() == [
        (T0 + timedelta(minutes=2), T0 + timedelta(minutes=9)),
        (T0 + timedelta(minutes=30), None),
    ]


def test_slugs_are_file_name_safe_and_unique() -> None:
    assert slug("Chat Latency / EU") == "chat-latency-eu"
    assert slug("</script><script>") == "script-script"
    assert slug("***") == "unnamed"
    inputs, window, _ = fixture_inputs()
    assert inputs.burn_rates is not None
    burns = pl.concat(
        [
            pl.DataFrame(inputs.burn_rates).with_columns(slo=pl.lit("a b")),
            pl.DataFrame(inputs.burn_rates).with_columns(slo=pl.lit("a-b")),
        ]
    )
    report = build_report(ReportInputs(burn_rates=burns), window=window)
    assert [c.slug for c in report.charts] == ["burn-rate-a-b", "burn-rate-a-b-2", "seven-boxes"]


# -- the page: label values are text, never markup -----------------------------------------------

PAYLOAD = "<script>alert(1)</script>"


def test_script_json_cannot_close_its_script_element() -> None:
    text = script_json({"model": f"</script>{PAYLOAD}<!--", "amp": "&"})
    assert "<" not in text
    assert ">" not in text
    assert "&" not in text
    assert json.loads(text) == {"model": f"</script>{PAYLOAD}<!--", "amp": "&"}


def test_page_escapes_every_label_value() -> None:
    spec = {"mark": "point", "title": PAYLOAD, "data": {"values": [{"replica": PAYLOAD}]}}
    page = render_page(
        title=f"report {PAYLOAD}",
        facts=[("models", PAYLOAD), (PAYLOAD, "x")],
        charts=[PageChart("c", f"section {PAYLOAD}", PAYLOAD, spec)],
        omitted=[(PAYLOAD, PAYLOAD)],
    )
    assert PAYLOAD not in page
    assert page.count("<script") == 3  # the libraries, the spec block, the bootstrap
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Content-Security-Policy" in page
    assert "default-src 'none'" in page


# -- the failure drill -------------------------------------------------------------------------


def drill_minutes() -> pl.DataFrame:
    rows = []
    for fleet, dip in (("4 hosts (holds)", 0.97), ("3 hosts (fails)", 0.05)):
        for minute in range(-3, 6):
            after = 0 <= minute < 3
            rows.append(
                {
                    "fleet": fleet,
                    "minute": minute,
                    "attainment_ratio": dip if after else 0.99,
                    "ready_replicas": 12 if after else 16,
                    "queue_depth_max": 400 if after and dip < 0.5 else 1,
                }
            )
    return pl.DataFrame(rows)


def test_the_drill_chart_draws_each_fleet_against_the_target_and_says_the_verdicts() -> None:
    verdicts = ("4 hosts: holds.", "3 hosts: fails in phase failed.")
    chart = drill_timeline_chart(
        drill_minutes(), target_ratio=0.9, lost="host host-0", recovery_s=180, verdicts=verdicts
    )
    spec = chart.to_dict()
    subtitle = spec["title"]["subtitle"]
    assert subtitle[1:] == list(verdicts)
    assert "host host-0 lost at minute 0" in subtitle[0]
    values = [row for rows in spec["datasets"].values() for row in rows]
    assert {v["fleet"] for v in values if "fleet" in v} == {"4 hosts (holds)", "3 hosts (fails)"}
    assert any(v.get("label") == "target 90%" for v in values)


def test_a_report_with_a_drill_charts_it_and_one_without_says_why_not() -> None:
    drill = DrillView(
        drill_minutes(), target_ratio=0.9, lost="host host-0", recovery_s=180, verdicts=()
    )
    assert "failure-drill" in {c.slug for c in build_report(ReportInputs(drill=drill)).charts}
    omitted = dict(build_report(ReportInputs()).omitted)
    assert "--requirement FILE" in omitted["Capacity answer"]


def test_a_drill_frame_missing_a_column_is_refused_with_the_contract() -> None:
    with pytest.raises(ValueError, match="drill timeline chart") as error:
        drill_timeline_chart(
            drill_minutes().drop("ready_replicas"), target_ratio=0.9, lost="x", recovery_s=60
        )
    assert "lacks column(s) ready_replicas" in str(error.value)
