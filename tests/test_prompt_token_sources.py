"""Prompt tokens by source: vLLM's by-source counters per minute (the `source` label kept, each
increase spread over its scrape interval), the stacked chart, the report's panel or its reason
for not showing one; and preemptions counted on the minute their samples fall on."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import polars as pl
import pytest

from servewatch.dashboards.prompt_token_sources import (
    prompt_token_sources_chart,
    source_shares,
)
from servewatch.dashboards.report import ReportInputs, build_report
from servewatch.pipeline.metric_frames import metric_minute_frames
from servewatch.pipeline.metric_sli import series_dimensions
from servewatch.pipeline.prompt_token_sources import (
    PROMPT_TOKEN_SOURCES_SCHEMA,
    SourceCounter,
    prompt_token_source_minutes,
)
from servewatch.pipeline.request_sli import GoodputLimits

T0 = datetime(2026, 11, 18, 10)


def fleet(
    counters: list[tuple[str, str, str, dict[str, str], list[float]]], *, every_s: int = 120
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(replica, signal, metric, labels, cumulative values) per series, sampled every
    `every_s` seconds from T0 (on the minute, as a recording's samples are)."""
    series_rows, point_rows = [], []
    for sid, (replica, signal, metric, labels, values) in enumerate(counters, start=1):
        series_rows.append(
            (sid, replica, signal, metric, json.dumps(labels, sort_keys=True), "vllm_engine")
        )
        point_rows += [
            (sid, T0 + timedelta(seconds=every_s * i), value) for i, value in enumerate(values)
        ]
    series = pl.LazyFrame(
        series_rows,
        schema=["series_id", "target_id", "signal", "metric", "labels", "source"],
        orient="row",
    )
    replicas = sorted({c[0] for c in counters})
    targets = pl.LazyFrame(
        {
            "target_id": replicas,
            "replica": replicas,
            "host": ["h0"] * len(replicas),
            "zone": ["z"] * len(replicas),
            "pool": ["chat"] * len(replicas),
            "model": ["m"] * len(replicas),
        }
    )
    points = pl.LazyFrame(
        point_rows,
        schema={"series_id": pl.Int32(), "ts": pl.Datetime("us"), "value": pl.Float64()},
        orient="row",
    )
    return points, series_dimensions(series, targets)


BY_SOURCE = ("prompt_tokens_by_source", "vllm:prompt_tokens_by_source_total")
CACHED_BY_SOURCE = ("prompt_tokens_cached_by_source", "vllm:prompt_tokens_cached_by_source_total")


def by_source(
    replica: str, source: str | None, values: list[float], *, cached: bool = False
) -> Any:
    signal, metric = CACHED_BY_SOURCE if cached else BY_SOURCE
    labels = {"engine": "0", "model_name": "m"} | ({} if source is None else {"source": source})
    return (replica, signal, metric, labels, values)


def test_each_source_is_spread_over_its_scrape_interval_and_summed_over_replicas() -> None:
    # 240 prompt tokens per 2-minute scrape: 120 in each minute, never 240 then 0.
    points, dimensions = fleet(
        [
            by_source("vllm-0", "local_compute", [0.0, 240.0, 480.0]),
            by_source("vllm-1", "local_compute", [0.0, 240.0, 480.0]),
            by_source("vllm-0", "local_cache_hit", [100.0, 160.0, 220.0]),
            by_source("vllm-0", "device", [0.0, 60.0, 120.0], cached=True),
            # No source label: kept, and named for what it is.
            by_source("vllm-1", None, [0.0, 20.0, 40.0]),
        ]
    )
    got = prompt_token_source_minutes(points, dimensions).collect()
    assert got.schema == PROMPT_TOKEN_SOURCES_SCHEMA
    per_minute = {
        (row["counter"], row["token_source"], int((row["minute_ts"] - T0).seconds // 60)): row[
            "tokens"
        ]
        for row in got.iter_rows(named=True)
    }
    assert per_minute == {
        **{("prompt", "local_compute", m): 240.0 for m in range(4)},
        **{("prompt", "local_cache_hit", m): 30.0 for m in range(4)},
        **{("prompt", "unlabelled", m): 10.0 for m in range(4)},
        **{("cached", "device", m): 30.0 for m in range(4)},
    }


def test_other_signals_are_left_out() -> None:
    points, dimensions = fleet(
        [("vllm-0", "prompt_tokens", "vllm:prompt_tokens_total", {}, [0.0, 100.0])]
    )
    assert prompt_token_source_minutes(points, dimensions).collect().is_empty()


def source_rows(rows: list[tuple[int, str, str, float]]) -> pl.DataFrame:
    return pl.DataFrame(
        [
            (T0 + timedelta(minutes=m), counter, source, tokens)
            for m, counter, source, tokens in rows
        ],
        schema=PROMPT_TOKEN_SOURCES_SCHEMA,
        orient="row",
    )


def view_rows(view: dict[str, Any], spec: dict[str, Any]) -> list[dict[str, Any]]:
    data = view.get("data", spec.get("data"))
    return list(data["values"]) if "values" in data else list(spec["datasets"][data["name"]])


def test_the_chart_stacks_tokens_per_second_with_every_source_in_every_bucket() -> None:
    frame = source_rows(
        [
            (0, "prompt", "local_compute", 600.0),
            (0, "prompt", "local_cache_hit", 300.0),
            # The cache served nothing in the second minute: a zero, not a gap in the stack.
            (1, "prompt", "local_compute", 1200.0),
        ]
    )
    spec = prompt_token_sources_chart(frame).to_dict()
    assert "vconcat" not in spec  # no cached-by-tier counter, no second panel
    rates = {(r["ts"], r["token_source"]): r["tokens_per_s"] for r in view_rows(spec, spec)}
    ms = int(T0.timestamp() * 1000)
    assert rates == {
        (ms, "local_compute"): 10.0,
        (ms, "local_cache_hit"): 5.0,
        (ms + 60_000, "local_compute"): 20.0,
        (ms + 60_000, "local_cache_hit"): 0.0,
    }
    assert spec["encoding"]["y"]["stack"] == "zero"
    assert spec["encoding"]["color"]["sort"] == ["local_compute", "local_cache_hit"]
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "spread evenly over the time between its two scrapes" in subtitle
    assert "local_compute (prefilled here) 85.7%, local_cache_hit" in subtitle


@pytest.mark.parametrize(
    ("counter", "expected"),
    [
        (SourceCounter.PROMPT, {"local_compute": 0.75, "external_kv_transfer": 0.25}),
        (SourceCounter.CACHED, {"device": 0.5, "host": 0.5}),
    ],
)
def test_shares_are_of_each_counter_alone(
    counter: SourceCounter, expected: dict[str, float]
) -> None:
    frame = source_rows(
        [
            (0, "prompt", "local_compute", 300.0),
            (0, "prompt", "external_kv_transfer", 100.0),
            (0, "cached", "device", 50.0),
            (1, "cached", "host", 50.0),
        ]
    )
    assert source_shares(frame, counter=counter) == pytest.approx(expected)
    spec = prompt_token_sources_chart(frame).to_dict()
    titles = [panel["title"]["text"] for panel in spec["vconcat"]]
    assert titles[1].startswith("Cached prompt tokens by the tier that held them")


def test_the_report_draws_the_panel_or_says_the_engine_does_not_export_it() -> None:
    frame = source_rows([(0, "prompt", "local_compute", 60.0)])
    drawn = build_report(ReportInputs(prompt_token_sources=frame), limits=GoodputLimits())
    assert "prompt-token-sources" in [c.slug for c in drawn.charts]
    assert "Prompt tokens by source" not in dict(drawn.omitted)
    empty = build_report(ReportInputs(prompt_token_sources=frame.clear()), limits=GoodputLimits())
    assert dict(empty.omitted)["Prompt tokens by source"] == (
        "not exported: the engines send no prompt tokens by source (vLLM 0.16 and later count "
        "them as prompt_tokens_by_source_total)"
    )


def test_preemptions_on_minutes_without_a_gauge_sample_are_kept() -> None:
    # Samples on the minute every 2 minutes: a counter's increase is filed under the minute of
    # its later sample, which is not a minute the gauges' windows hold.
    points, dimensions = fleet(
        [
            ("vllm-0", "preemptions", "vllm:num_preemptions_total", {}, [0.0, 2.0, 2.0, 5.0]),
            ("vllm-0", "requests_waiting", "vllm:num_requests_waiting", {}, [1.0, 3.0, 0.0, 0.0]),
            ("vllm-0", "requests_running", "vllm:num_requests_running", {}, [4.0, 4.0, 4.0, 4.0]),
        ]
    )
    frames = metric_minute_frames(points, dimensions, start=T0, end=T0 + timedelta(minutes=7))
    scheduler = frames["scheduler_state"].collect()
    assert scheduler["preemptions"].sum() == 5.0
    assert scheduler.filter(pl.col("running_requests").is_not_null()).height >= 3
