"""Trace replay: Azure LLM inference CSV and Mooncake JSONL readers, and replaying them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servewatch.emulator.trace_replay import (
    TraceFormat,
    TraceFormatError,
    TraceRecord,
    parse_azure_csv,
    parse_mooncake_jsonl,
    read_trace,
)
from servewatch.emulator.workload import PrefixSegment, ReplayWorkload

START = datetime(2023, 11, 16, 18, 15, 46, tzinfo=UTC)

rows = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=10**9),  # offset in units of 100 ns
        st.integers(min_value=1, max_value=200_000),
        st.integers(min_value=1, max_value=20_000),
        st.lists(st.integers(min_value=0, max_value=10**6), max_size=6),
    ),
    min_size=1,
    max_size=40,
).map(lambda items: sorted(items, key=lambda row: row[0]))


def azure_text(items: list[tuple[int, int, int, list[int]]]) -> str:
    base = items[0][0]
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for ticks, prompt, output, _ in items:
        # The published trace writes seven fraction digits (100 ns ticks).
        moment = START + timedelta(microseconds=(ticks - base) // 10)
        lines.append(f"{moment:%Y-%m-%d %H:%M:%S.%f}{(ticks - base) % 10},{prompt},{output}")
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=rows)
def test_azure_csv_round_trip(items: list[tuple[int, int, int, list[int]]]) -> None:
    records = list(parse_azure_csv(azure_text(items).splitlines(), source="t.csv"))
    base = items[0][0]
    assert [(r.prompt_tokens, r.output_tokens) for r in records] == [(p, o) for _, p, o, _ in items]
    for record, (ticks, *_rest) in zip(records, items, strict=True):
        # Fractions beyond microseconds are dropped, as datetime keeps microseconds.
        assert record.offset_s == pytest.approx((ticks - base) // 10 / 1e6, abs=2e-6)
        assert record.hash_ids == ()


@settings(max_examples=60, deadline=None)
@given(items=rows)
def test_mooncake_jsonl_round_trip(items: list[tuple[int, int, int, list[int]]]) -> None:
    lines = [
        json.dumps({"timestamp": ms, "input_length": p, "output_length": o, "hash_ids": h})
        for ms, p, o, h in items
    ]
    records = list(parse_mooncake_jsonl(lines, source="t.jsonl"))
    base = items[0][0]
    assert records == [TraceRecord((ms - base) / 1000.0, p, o, tuple(h)) for ms, p, o, h in items]


def test_azure_timestamps_may_be_plain_seconds_and_rows_are_sorted(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n12.5,100,10\n10.0,200,20\n\n11.0,300,30\n",
        encoding="utf-8",
    )
    records = list(read_trace(path, TraceFormat.AZURE_CSV))
    assert [(r.offset_s, r.prompt_tokens) for r in records] == [(0.0, 200), (1.0, 300), (2.5, 100)]


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("time,a,b\n", 1, "expected the header TIMESTAMP,ContextTokens,GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,5\n", 2, "expected 3 fields, got 2"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,5,6\nyesterday,5,6\n",
            3,
            "TIMESTAMP must be",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,-5,6\n",
            2,
            "ContextTokens must be a non-negative",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,5,0\n",
            2,
            "GeneratedTokens must be a positive",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,5,x\n", 2, "GeneratedTokens must be"),
    ],
)
def test_bad_azure_rows_name_file_and_line(text: str, line: int, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message) as info:
        list(parse_azure_csv(text.splitlines(keepends=True), source="azure.csv"))
    assert str(info.value).startswith(f"azure.csv:{line}: ")
    assert info.value.line == line


GOOD = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}'


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "not a JSON object"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"timestamp": true, "input_length": 10, "output_length": 2}', "timestamp must be"),
        ('{"input_length": 10, "output_length": 2, "hash_ids": []}', "missing field 'timestamp'"),
        (
            '{"timestamp": -1, "input_length": 1, "output_length": 2, "hash_ids": []}',
            "non-negative",
        ),
        ('{"timestamp": 1, "input_length": 0, "output_length": 2, "hash_ids": []}', "input_length"),
        (
            '{"timestamp": 1, "input_length": 3, "output_length": 2.5, "hash_ids": []}',
            "output_length",
        ),
        ('{"timestamp": 1, "input_length": 3, "output_length": 2, "hash_ids": 7}', "hash_ids must"),
        (
            '{"timestamp": 1, "input_length": 3, "output_length": 2, "hash_ids": ["a"]}',
            r"hash_ids\[0\]",
        ),
    ],
)
def test_bad_mooncake_rows_name_file_and_line(bad: str, message: str) -> None:
    lines = [GOOD, "", bad]
    with pytest.raises(TraceFormatError, match=message) as info:
        list(parse_mooncake_jsonl(lines, source="mc.jsonl"))
    assert str(info.value).startswith("mc.jsonl:3: ")


def test_mooncake_rows_may_leave_out_hash_ids() -> None:
    line = '{"timestamp": 5, "input_length": 10, "output_length": 2}'
    (record,) = parse_mooncake_jsonl([line], source="mc.jsonl")
    assert record == TraceRecord(0.0, 10, 2, ())


def test_unreadable_trace_says_which_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"missing\.csv.*cannot read"):
        read_trace(tmp_path / "missing.csv", TraceFormat.AZURE_CSV)


def test_mooncake_hash_ids_become_shared_prefix_segments() -> None:
    records = iter(
        [
            TraceRecord(0.0, 1200, 10, (7, 8, 9)),
            TraceRecord(2.0, 600, 10, (7, 11)),
        ]
    )
    workload = ReplayWorkload(records, start_s=1000.0, speedup=2.0, tenant="t")
    first = workload.next_arrival()
    second = workload.next_arrival()
    assert workload.next_arrival() is None
    assert first is not None
    assert second is not None
    assert first.prefix == (
        PrefixSegment("hash:7", 512),
        PrefixSegment("hash:8", 1024),
        PrefixSegment("hash:9", 1200),
    )
    assert second.prefix == (PrefixSegment("hash:7", 512), PrefixSegment("hash:11", 600))
    assert (first.arrival_s, second.arrival_s) == (1000.0, 1001.0)  # offsets / speedup
    assert (second.tenant, second.conversation_id, second.max_tokens) == ("t", None, 10)
    assert workload.follow_up(first, completion_tokens=10, end_s=1.0, ok=True) is None
