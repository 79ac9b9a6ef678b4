"""Trace ingest into the store: idempotent, and bad input is reported while the rest is kept."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from servewatch.collectors.traces.ingest import ingest_trace_files
from servewatch.collectors.traces.request_spans import SpanMapping
from servewatch.store import Store
from tests.conftest import FIXTURES

SMALL = FIXTURES / "vllm_spans_small" / "spans.jsonl"
NOW = datetime(2026, 11, 29, 12, 0, 0)


def llm_span(span_id: str, **attrs: Any) -> dict[str, Any]:
    values = {
        "gen_ai.latency.time_to_first_token": 0.2,
        "gen_ai.latency.e2e": 1.2,
        "gen_ai.latency.time_in_model_decode": 1.0,
        "gen_ai.usage.prompt_tokens": 100,
        "gen_ai.usage.completion_tokens": 21,
    } | attrs
    attributes = []
    for key, value in values.items():
        if value is None:
            continue
        kind = "intValue" if isinstance(value, int) else "doubleValue"
        kind = "stringValue" if isinstance(value, str) else kind
        attributes.append({"key": key, "value": {kind: value}})
    return {
        "traceId": "1" * 32,
        "spanId": span_id,
        "name": "llm_request",
        "kind": 2,
        "startTimeUnixNano": "1795000000000000000",
        "endTimeUnixNano": "1795000001200000000",
        "attributes": attributes,
    }


def export_line(*spans: dict[str, Any], replica: str = "r1") -> str:
    resource = {"attributes": [{"key": "servewatch.replica", "value": {"stringValue": replica}}]}
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]})


def snapshot(store: Store) -> pl.DataFrame:
    return store.read_requests().collect().sort("trace_id", "span_id")


def test_ingesting_the_same_file_twice_leaves_the_same_rows(store: Store) -> None:
    first = ingest_trace_files([SMALL], store=store, now=NOW)
    rows_after_first = snapshot(store)
    second = ingest_trace_files([SMALL], store=store, now=NOW)
    assert first.new_requests == first.request_spans > 0
    assert second.new_requests == 0
    assert second.duplicate_requests == first.request_spans
    assert snapshot(store).equals(rows_after_first)


def test_fixture_spans_map_onto_request_columns(store: Store) -> None:
    report = ingest_trace_files([SMALL], store=store, now=NOW)
    assert report.other_spans == 3  # one health_check span per replica
    assert report.rejects == []
    rows = snapshot(store)
    assert set(rows["replica"]) == {"vllm-0", "vllm-1", "vllm-2"}
    assert set(rows["host"]) == {"host-a", "host-b"}
    assert rows["emulated"].all()
    assert (rows["e2e_s"] >= rows["ttft_s"]).all()
    assert (rows["end_ts"] >= rows["arrival_ts"]).all()
    assert rows.filter(~pl.col("ok"))["error_type"].to_list() == ["EngineDeadError"] * 5


def test_malformed_line_is_reported_with_file_and_line_and_the_rest_kept(
    store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_text(
        "\n".join(
            [
                export_line(llm_span("a" * 16)),
                '{"resourceSpans": [',  # cut off mid-write
                export_line(llm_span("b" * 16), llm_span("c" * 16)),
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    for _ in range(2):  # and again: idempotent, errors recorded once
        report = ingest_trace_files([path], store=store, now=NOW)
        (reject,) = report.rejects
        assert str(reject).startswith(f"{path}:line 2: not valid JSON")
    assert store.count("requests") == 3
    errors = store.read_ingest_errors().collect()
    assert errors.select("source", "location").rows() == [(str(path), "line 2")]


def test_broken_request_span_is_rejected_with_its_location(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    missing_ttft = llm_span("d" * 16, **{"gen_ai.latency.time_to_first_token": None})
    negative = llm_span("e" * 16, **{"gen_ai.latency.e2e": -1.0})
    text_tokens = llm_span("f" * 16, **{"gen_ai.usage.completion_tokens": "many"})
    path.write_text(
        export_line(llm_span("a" * 16), missing_ttft, negative, text_tokens) + "\n",
        encoding="utf-8",
    )
    report = ingest_trace_files([path], store=store, now=NOW)
    assert report.new_requests == 1
    messages = [(r.location, r.message) for r in report.rejects]
    assert messages == [
        (
            "line 1 span 1 (dddddddddddddddd)",
            "missing attribute gen_ai.latency.time_to_first_token",
        ),
        ("line 1 span 2 (eeeeeeeeeeeeeeee)", "attribute gen_ai.latency.e2e is negative: -1.0"),
        (
            "line 1 span 3 (ffffffffffffffff)",
            "attribute gen_ai.usage.completion_tokens must be a non-negative count, got 'many'",
        ),
    ]


def test_spans_the_store_cannot_hold_are_rejected_and_the_rest_kept(
    store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "traces.jsonl"
    far_end = llm_span("b" * 16) | {"endTimeUnixNano": str(2**63)}
    nan_ttft = llm_span("c" * 16)
    nan_ttft["attributes"][0]["value"] = {"doubleValue": "NaN"}  # the TTFT
    late_token = llm_span("d" * 16, **{"gen_ai.latency.time_to_first_token": 2.0})
    path.write_text(
        export_line(llm_span("a" * 16), far_end, nan_ttft, late_token) + "\n", encoding="utf-8"
    )
    report = ingest_trace_files([path], store=store, now=NOW)
    assert report.new_requests == 1
    assert store.read_requests().collect()["span_id"].to_list() == ["a" * 16]
    messages = [r.message for r in report.rejects]
    assert "below 2^63" in messages[0]
    assert "must be a finite number, got nan" in messages[1]
    assert "(2.0) exceeds gen_ai.latency.e2e (1.2)" in messages[2]


def test_unreadable_file_is_a_reject_not_a_crash(store: Store, tmp_path: Path) -> None:
    bad = tmp_path / "broken.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    good = tmp_path / "good.jsonl"
    good.write_text(export_line(llm_span("a" * 16)) + "\n", encoding="utf-8")
    report = ingest_trace_files([bad, good], store=store, now=NOW)
    assert report.new_requests == 1
    (reject,) = report.rejects
    assert (reject.source, reject.location) == (str(bad), "file")


def test_current_genai_token_names_and_configurable_mapping(store: Store, tmp_path: Path) -> None:
    span = llm_span(
        "a" * 16,
        **{
            "gen_ai.usage.prompt_tokens": None,
            "gen_ai.usage.completion_tokens": None,
            "gen_ai.usage.input_tokens": 7,
            "gen_ai.usage.output_tokens": 9,
            "gateway.backend": "pod-17",
        },
    )
    path = tmp_path / "t.jsonl"
    path.write_text(export_line(span) + "\n", encoding="utf-8")
    mapping = SpanMapping(replica_keys=("gateway.backend",))
    ingest_trace_files([path], store=store, mapping=mapping, now=NOW)
    row = store.read_requests().collect().row(0, named=True)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (7, 9)
    assert row["replica"] == "pod-17"
