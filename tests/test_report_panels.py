"""The report's detail panels, each on a small frame with its values checked: token throughput
without the scrape schedule's sawtooth, a scale per request phase, findings printed in full,
GPU panels per replica and the GPUs that serve none."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import polars as pl
import pytest

from servewatch.dashboards.gpu_replicas import gpu_replicas_chart
from servewatch.dashboards.gpu_unmatched import gpu_unmatched_chart, unmatched_rows
from servewatch.dashboards.health_findings import findings_table_chart, table_lines
from servewatch.dashboards.latency_heatmap import latency_heatmap_chart
from servewatch.dashboards.load_balance import load_balance_chart
from servewatch.dashboards.panel import epoch_ms_of
from servewatch.dashboards.report import ReportInputs, build_report
from servewatch.dashboards.request_phase import request_phase_chart
from servewatch.dashboards.scheduler_state import scheduler_state_chart
from servewatch.dashboards.scrape_health import scrape_health_chart, target_summary
from servewatch.dashboards.token_throughput import COUNTER_SOURCE, token_throughput_chart
from servewatch.pipeline.counter_spread import MAX_SPREAD_S, spread_counter_minutes
from servewatch.pipeline.gpu_attribution import UNMATCHED_GPUS_SCHEMA, JoinRule
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.tables import SCRAPES_SCHEMA
from tests.test_dashboards import datasets

T0 = datetime(2026, 11, 18, 10)


def all_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for rows in datasets(spec) for row in rows]


def view_rows(view: dict[str, Any], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows a view draws, its named dataset looked up in the top-level spec."""
    data = view.get("data", spec.get("data"))
    return list(data["values"]) if "values" in data else list(spec["datasets"][data["name"]])


def views(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("layer", "vconcat", "hconcat", "concat"):
        for child in spec.get(key, []):
            yield from views(child)
    if "mark" in spec:
        yield spec


# -- token throughput: increases spread over their scrape intervals ------------------------------


def counter_points(
    times: list[datetime], values: list[float], *, series_id: int = 1
) -> pl.LazyFrame:
    return pl.LazyFrame(
        {"series_id": [series_id] * len(times), "ts": times, "value": values},
        schema={"series_id": pl.Int32(), "ts": pl.Datetime("ms"), "value": pl.Float64()},
    )


CHOSEN = pl.LazyFrame(
    {"series_id": [1], "replica": ["vllm-0"]},
    schema={"series_id": pl.Int32(), "replica": pl.String()},
)


def test_a_steady_counter_scraped_every_two_minutes_draws_a_flat_rate_in_5m_buckets() -> None:
    # 600 tokens per 2-minute scrape, 20 s past the minute: 5 tokens/s throughout.
    times = [T0 + timedelta(seconds=20 + 120 * i) for i in range(13)]
    points = counter_points(times, [600.0 * i for i in range(13)])
    minutes = spread_counter_minutes(points, CHOSEN, by=["replica"], name="generation_tokens")
    frame = minutes.with_columns(prompt_tokens=pl.lit(0.0)).collect()
    assert frame["generation_tokens"].sum() == pytest.approx(600.0 * 12)
    # Every whole minute inside the scrapes holds 300 tokens, none 600 then 0.
    inside = frame.filter(
        (pl.col("minute_ts") > times[0]) & (pl.col("minute_ts") < times[-1] - timedelta(minutes=1))
    )
    assert set(inside["generation_tokens"].round(6).to_list()) == {300.0}
    spec = token_throughput_chart(frame, source=COUNTER_SOURCE, max_points=5).to_dict()
    rates = sorted(
        (r["ts"], r["tokens_per_s"]) for r in all_rows(spec) if r.get("tokens") == "generation"
    )
    # The first and last buckets reach beyond the first and last scrapes.
    inner = [rate for _, rate in rates[1:-1]]
    assert len(inner) == 3
    assert inner == pytest.approx([5.0] * 3)
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "spread evenly over the time between its two scrapes" in subtitle
    assert "exact" not in subtitle


@pytest.mark.parametrize(
    ("seconds", "values", "expected"),
    [
        # 90 s interval from 10:00:30 to 10:02:00: 30 s, 60 s of it in the two minutes.
        ([30, 120], [0.0, 90.0], {0: 30.0, 1: 60.0}),
        # A counter reset: the new value is the increase, spread the same way.
        ([0, 60, 120], [50.0, 110.0, 30.0], {0: 60.0, 1: 30.0}),
        # Ending exactly on a minute boundary: nothing is filed in the next minute.
        ([0, 60], [0.0, 60.0], {0: 60.0}),
    ],
)
def test_each_increase_is_shared_by_the_minutes_its_interval_covers(
    seconds: list[int], values: list[float], expected: dict[int, float]
) -> None:
    points = counter_points([T0 + timedelta(seconds=s) for s in seconds], values)
    got = spread_counter_minutes(points, CHOSEN, by=["replica"], name="n").collect()
    assert {
        int((row["minute_ts"] - T0).total_seconds() // 60): round(row["n"], 9)
        for row in got.iter_rows(named=True)
    } == expected


def test_an_increase_after_a_long_gap_stays_with_its_later_sample() -> None:
    later = T0 + timedelta(seconds=MAX_SPREAD_S * 2)
    points = counter_points([T0, later], [0.0, 500.0])
    got = spread_counter_minutes(points, CHOSEN, by=["replica"], name="n").collect()
    assert got["minute_ts"].to_list() == [later - timedelta(minutes=1)]
    assert got["n"].to_list() == [500.0]


# -- request phases: one scale per phase ---------------------------------------------------------


def test_queue_and_prefill_get_their_own_scales_beside_decode() -> None:
    rows = [
        (T0 + timedelta(minutes=m), phase, seconds * 10, 10)
        for m in range(3)
        for phase, seconds in (("queue", 0.02 + m / 100), ("prefill", 0.1), ("decode", 15.0))
    ]
    frame = pl.DataFrame(rows, schema=["minute_ts", "phase", "total_s", "requests"], orient="row")
    spec = request_phase_chart(frame).to_dict()
    assert spec["resolve"]["scale"]["y"] == "independent"
    panels = spec["vconcat"]
    titles = [p["encoding"]["y"]["title"] for p in panels]
    assert titles == [
        "queue: mean per request (s)",
        "prefill: mean per request (s)",
        "decode: mean per request (s)",
    ]
    queue = sorted(r["mean_s"] for r in view_rows(panels[0], spec))
    assert queue == pytest.approx([0.02, 0.03, 0.04])
    assert {r["mean_s"] for r in view_rows(panels[2], spec)} == {15.0}


def test_a_minute_holding_only_preemptions_is_no_zero_in_the_scheduler_lines() -> None:
    frame = pl.DataFrame(
        {
            "minute_ts": [T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)],
            "replica": ["vllm-0"] * 3,
            "running_requests": [4.0, None, 4.0],
            "waiting_requests": [1.0, None, 1.0],
            "preemptions": [None, 3.0, None],
        }
    )
    spec = scheduler_state_chart(frame).to_dict()
    lines, bars = spec["vconcat"]
    running = {r["ts"]: r["requests"] for r in view_rows(lines, spec) if r["state"] == "running"}
    assert running == {epoch_ms_of(T0): 4.0, epoch_ms_of(T0 + timedelta(minutes=2)): 4.0}
    assert sum(r["preemptions"] for r in view_rows(bars, spec)) == 3.0


# -- findings: summary, action and evidence printed in full --------------------------------------


def findings(summary: str, suggestion: str, *, end: datetime | None) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "kind": ["dependency"],
            "scope_unit": ["host"],
            "scope": ["host-1"],
            "start_ts": [T0],
            "end_ts": [end],
            "confidence": [0.99],
            "summary": [summary],
            "evidence": ["targets 3 count; failed_minutes 62 count"],
            "suggestion": [suggestion],
        },
        schema_overrides={"end_ts": pl.Datetime("us")},
    )


def test_the_findings_table_prints_summary_action_and_evidence_whole() -> None:
    summary = "host host-1 lost: " + "all of its targets failed their scrapes together " * 4
    action = "treat it as a host failure: check the node, and size for losing a whole host"
    frame = findings(summary.strip(), action, end=T0 + timedelta(minutes=62))
    spec = findings_table_chart(frame).to_dict()
    printed = [r["text"] for r in all_rows(spec)]
    assert printed[0] == "11-18 10:00 to 11:02 · dependency · host host-1 · confidence 99%"
    # Wrapped, not cut: the words of the summary and action are all there, in order.
    body = " ".join(line.strip() for line in printed[1:])
    assert " ".join(summary.split()) in body
    assert f"Action: {action}" in body
    assert "Evidence: targets 3 count; failed_minutes 62 count" in body
    assert all(len(line) <= 100 for line in printed)
    assert all(view["mark"].get("limit") == 0 for view in views(spec))
    assert not any("tooltip" in view.get("encoding", {}) for view in views(spec))


def test_an_ongoing_finding_says_so_in_its_head_line() -> None:
    rows = findings("still down", "check the node", end=None).with_columns(
        where=pl.lit("host host-1"),
        ts=pl.lit(int(T0.timestamp() * 1000)),
        ts_end=pl.lit(0),
        state=pl.lit("ongoing"),
        confidence_pct=pl.lit(99.0),
    )
    lines = table_lines(rows)
    assert lines["text"][0].startswith("11-18 10:00 to ongoing")
    assert lines["style"].to_list() == ["head", "body", "body", "evidence"]


# -- GPUs: the DCGM dashboard's panels per replica, unmatched GPUs apart --------------------------


def gpu_minutes() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "minute_ts": [T0, T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=1)],
            "replica": ["vllm-10", "vllm-2", "vllm-10", "vllm-2"],
            "power_w": [700.0, 300.0, 500.0, 300.0],
            "temperature_c": [80.0, 60.0, 70.0, 60.0],
            "sm_clock_hz": [1.98e9, 1.41e9, 1.98e9, 1.41e9],
            "fb_used_bytes": [64 * 1024.0**3] * 4,
            "gpu_util_ratio": [None, None, None, None],
        },
        schema_overrides={"gpu_util_ratio": pl.Float64()},
    )


def test_gpu_panels_draw_each_replicas_own_readings_in_the_shown_units() -> None:
    spec = gpu_replicas_chart(gpu_minutes()).to_dict()
    panels = {p["title"]["text"]: p for p in spec["vconcat"]}
    assert list(panels) == [
        "GPU power (sum of each replica's GPUs)",
        "GPU temperature (hottest of each replica's GPUs)",
        "SM clock (mean of each replica's GPUs)",
        "Framebuffer memory used (sum of each replica's GPUs)",
    ]
    power = panels["GPU power (sum of each replica's GPUs)"]
    assert power["encoding"]["y"]["sort"] == ["vllm-2", "vllm-10"]
    by_replica = {(r["replica"], r["ts"]): r["value"] for r in view_rows(power, spec)}
    assert by_replica[("vllm-10", epoch_ms_of(T0))] == 700.0
    clock = panels["SM clock (mean of each replica's GPUs)"]
    assert {r["value"] for r in view_rows(clock, spec)} == {1980.0, 1410.0}  # MHz
    memory = panels["Framebuffer memory used (sum of each replica's GPUs)"]
    assert {r["value"] for r in view_rows(memory, spec)} == {64.0}  # GiB
    subtitle = " ".join(spec["title"]["subtitle"])
    # 12239's gauges: mean temperature (70 over the four readings), total power (900 W mean).
    assert "mean of the replicas' hottest GPUs 67.5 °C" in subtitle
    assert "fleet power 900 W on average" in subtitle
    assert "Not reported by any GPU: gpu utilisation, graphics engine active" in subtitle


def test_gpus_serving_no_replica_are_listed_with_why() -> None:
    frame = pl.DataFrame(
        {
            "target_id": ["dcgm/h1", "dcgm/h0"],
            "hostname": ["h1", "h0"],
            "uuid": ["GPU-b", "GPU-a"],
            "gpu_instance": [None, "3"],
            "pod": ["batch-7", None],
            "namespace": ["jobs", None],
            "rule": [JoinRule.OTHER_WORKLOAD.value, JoinRule.UNMATCHED.value],
            "gpu_power_w_mean": [250.4, None],
            "gpu_util_ratio_mean": [0.5, 0.0],
        },
        schema_overrides={"gpu_instance": pl.String(), "gpu_power_w_mean": pl.Float64()},
    )
    cells = unmatched_rows(frame)
    printed = [cells.filter(pl.col("row") == n).sort("x")["text"].to_list() for n in range(1, 3)]
    assert printed == [
        ["h0", "GPU-a", "3", "-", "no replica on its host claims it", "-", "0%"],
        ["h1", "GPU-b", "-", "jobs/batch-7", "its pod is no replica's", "250", "50%"],
    ]
    spec = gpu_unmatched_chart(frame).to_dict()
    assert spec["title"]["subtitle"][0].startswith("2 GPU(s) or MIG slice(s)")


def test_the_report_draws_gpu_panels_and_lists_unmatched_gpus() -> None:
    unmatched = pl.DataFrame(
        [("dcgm/h9", "h9", "GPU-z", None, None, None, JoinRule.UNMATCHED.value)],
        schema=UNMATCHED_GPUS_SCHEMA,
        orient="row",
    )
    report = build_report(
        ReportInputs(
            gpu=gpu_minutes().with_columns(tensor_active_ratio=pl.lit(0.3)),
            unmatched_gpus=unmatched,
        ),
        limits=GoodputLimits(),
    )
    slugs = [c.slug for c in report.charts]
    assert slugs == ["gpu-health", "gpu-replicas", "gpu-unmatched", "seven-boxes"]


# -- scrape health: failed scrapes and unreachable targets ---------------------------------------


def scrapes_frame(rows: list[tuple[str, int, bool, str | None]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "target_id": [r[0] for r in rows],
            "ts": [T0 + timedelta(seconds=r[1]) for r in rows],
            "ok": [r[2] for r in rows],
            "duration_s": [0.02 for _ in rows],
            "samples": [0 if r[3] else 100 for r in rows],
            "error": [r[3] for r in rows],
            "kind": ["vllm" for _ in rows],
        },
        schema=SCRAPES_SCHEMA,
    )


def test_scrape_health_counts_failures_and_names_the_unreachable_first() -> None:
    refused, timeout = "connection refused", "timed out after 10 s"
    rows = [("vllm-10", 60 * m, True, None) for m in range(4)]
    rows += [("vllm-2", 0, True, None), ("vllm-2", 60, False, timeout)]
    rows += [("vllm-2", 120, False, refused), ("vllm-2", 180, False, refused)]
    rows += [("vllm-3", 0, False, timeout), ("vllm-3", 60, True, None)]
    rows += [("vllm-3", 120, True, None), ("vllm-3", 180, True, None)]
    frame = scrapes_frame(rows)
    summary = target_summary(frame)
    assert summary.select("target_id", "scrapes", "failed", "last_ok", "error").rows() == [
        ("vllm-2", 4, 3, False, refused),
        ("vllm-3", 4, 1, True, timeout),
        ("vllm-10", 4, 0, True, None),
    ]
    spec = scrape_health_chart(frame).to_dict()
    heat, table = spec["vconcat"]
    cells = {(r["target_id"], r["ts"]): r["failed_ratio"] for r in view_rows(heat, spec)}
    assert cells[("vllm-2", epoch_ms_of(T0 + timedelta(minutes=1)))] == 1.0
    assert cells[("vllm-10", epoch_ms_of(T0))] == 0.0
    cells_printed = [r for layer in table["layer"] for r in view_rows(layer, spec)]
    printed = " | ".join(r["text"] for r in sorted(cells_printed, key=lambda r: (r["row"], r["x"])))
    assert "vllm-2 | 3 of 4 | failed: unreachable" in printed
    assert "vllm-3 | 1 of 4 | ok" in printed
    assert "vllm-10" not in printed  # never failed: not in the table
    assert (
        "4 of 12 scrapes failed; 2 of 3 targets failed at least once, 1 unreachable"
        in (spec["title"]["subtitle"][0])
    )


def test_replayed_scrapes_without_durations_print_a_dash() -> None:
    frame = scrapes_frame([("vllm-2", 0, False, "connection refused")]).with_columns(
        duration_s=pl.lit(None, pl.Float64)
    )
    spec = scrape_health_chart(frame).to_dict()
    _, table = spec["vconcat"]
    printed = sorted(
        (r["row"], r["x"], r["text"]) for layer in table["layer"] for r in view_rows(layer, spec)
    )
    assert [text for row, _, text in printed if row == 1] == [
        "vllm-2",
        "1 of 1",
        "failed: unreachable",
        "-",
        "connection refused",
    ]


# -- latency heatmaps: the histogram's own resolution --------------------------------------------


def test_the_latency_heatmap_draws_each_buckets_share_and_names_its_edges() -> None:
    # Cumulative counts over two replicas: 10 at or under 10 ms, 40 under 25 ms, 50 in all.
    rows = [
        (T0, "itl", le, count / 2)
        for le, count in ((0.01, 10.0), (0.025, 40.0), (0.05, 50.0), (math.inf, 50.0))
        for _ in range(2)
    ]
    frame = pl.DataFrame(rows, schema=["minute_ts", "stat", "le", "count"], orient="row")
    spec = latency_heatmap_chart(frame).to_dict()
    (panel,) = spec["vconcat"]
    shares = {r["band"]: r["share"] for r in view_rows(panel, spec)}
    assert shares == {
        "0 ms to 10 ms": 0.2,
        "10 ms to 25 ms": 0.6,
        "25 ms to 50 ms": 0.2,
        "50 ms to +Inf": 0.0,
    }
    assert panel["title"]["subtitle"] == ["Bucket edges: 10 ms, 25 ms, 50 ms, +Inf."]
    assert panel["encoding"]["y"]["sort"][0] == "50 ms to +Inf"
    assert "sit on or next to these edges" in " ".join(spec["title"]["subtitle"])


# -- load balance: each replica's share against the even share -----------------------------------


def test_load_balance_is_each_replicas_share_of_counts_per_bucket() -> None:
    frame = pl.DataFrame(
        {
            "minute_ts": [T0, T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=1)],
            "replica": ["vllm-10", "vllm-2", "vllm-10", "vllm-2"],
            "requests": [30, 10, 0, 0],
            "completion_tokens": [3000, 1000, 0, 0],
        }
    )
    spec = load_balance_chart(frame).to_dict()
    requests, tokens = spec["vconcat"]
    assert tokens["title"]["text"] == "Share of output tokens per minute"
    assert requests["encoding"]["y"]["sort"] == ["vllm-2", "vllm-10"]
    shares = {(r["replica"], r["ts"]): r["vs_even"] for r in view_rows(requests, spec)}
    # vllm-10 drew 75% of requests: 1.5x the even half; an idle minute draws no cell.
    assert shares == {("vllm-10", epoch_ms_of(T0)): 1.5, ("vllm-2", epoch_ms_of(T0)): 0.5}
    assert "vllm-10, took 75.0% of requests (1.50x even)" in spec["title"]["subtitle"][1]
