"""Recorded LLM workload traces: readers for the Azure LLM inference CSV and Mooncake JSONL.

Azure LLM inference trace (2023/2024): CSV with header `TIMESTAMP,ContextTokens,GeneratedTokens`,
timestamps as `2023-11-16 18:15:46.6805900` (naive times are UTC; extra fraction digits are
dropped) or as plain seconds. Mooncake (FAST'25): one JSON object per line with `timestamp`
(milliseconds), `input_length`, `output_length` and `hash_ids` (one id per 512-token block;
shared leading ids mean a shared prefix). Offsets are relative to the first row. A bad row
stops the read with an error naming the file, the line and what is allowed.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_BLOCK_TOKENS = 512
_LONG_FRACTION = re.compile(r"(\.\d{6})\d+")


class TraceFormat(Enum):
    AZURE_CSV = "azure"
    MOONCAKE_JSONL = "mooncake"


class TraceFormatError(ValueError):
    """A trace file breaks its format; the message names file, line and what is allowed."""

    def __init__(self, source: str, line: int, message: str) -> None:
        super().__init__(f"{source}:{line}: {message}")
        self.source = source
        self.line = line


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One replayed request: when (seconds after the first row) and how long."""

    offset_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS


def _positive_int(value: Any, name: str, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, str):
        value = value.strip()
        if not value.isdigit():
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} must be {kind} integer, got {value}")
    return value


def _azure_time_s(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(_LONG_FRACTION.sub(r"\1", text))
    except ValueError as exc:
        raise ValueError(
            f"TIMESTAMP must be a date-time like 2023-11-16 18:15:46.6805900 or seconds, "
            f"got {text!r}"
        ) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_azure_csv(lines: Iterable[str], *, source: str) -> Iterator[TraceRecord]:
    """Records of an Azure LLM inference trace CSV; the first line must be its header."""
    reader = csv.reader(lines)
    first_s: float | None = None
    for row in reader:
        line = reader.line_num
        if line == 1:
            if tuple(cell.strip() for cell in row) != AZURE_HEADER:
                raise TraceFormatError(
                    source, line, f"expected the header {','.join(AZURE_HEADER)}, got {row}"
                )
            continue
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(AZURE_HEADER):
            raise TraceFormatError(
                source, line, f"expected {len(AZURE_HEADER)} fields, got {len(row)}: {row}"
            )
        try:
            at_s = _azure_time_s(row[0])
            prompt = _positive_int(row[1], "ContextTokens")
            output = _positive_int(row[2], "GeneratedTokens")
        except (TypeError, ValueError) as exc:
            raise TraceFormatError(source, line, str(exc)) from exc
        if first_s is None:
            first_s = at_s
        yield TraceRecord(offset_s=at_s - first_s, prompt_tokens=prompt, output_tokens=output)


def parse_mooncake_jsonl(lines: Iterable[str], *, source: str) -> Iterator[TraceRecord]:
    """Records of a Mooncake trace: one JSON object per line, blank lines skipped."""
    first_ms: float | None = None
    for line_no, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(source, line_no, f"not a JSON object: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise TraceFormatError(
                source, line_no, f"expected a JSON object, got {type(obj).__name__}"
            )
        try:
            stamp = obj["timestamp"]
            if isinstance(stamp, bool) or not isinstance(stamp, int | float) or stamp < 0:
                raise ValueError(f"timestamp must be non-negative milliseconds, got {stamp!r}")
            prompt = _positive_int(obj["input_length"], "input_length")
            output = _positive_int(obj["output_length"], "output_length")
            raw_ids = obj.get("hash_ids", [])
            if not isinstance(raw_ids, list):
                raise TypeError(f"hash_ids must be a list of integers, got {raw_ids!r}")
            hash_ids = tuple(
                _positive_int(h, f"hash_ids[{i}]", allow_zero=True) for i, h in enumerate(raw_ids)
            )
        except KeyError as exc:
            raise TraceFormatError(
                source,
                line_no,
                f"missing field {exc.args[0]!r} (needs timestamp, "
                "input_length, output_length, hash_ids)",
            ) from exc
        except (TypeError, ValueError) as exc:
            raise TraceFormatError(source, line_no, str(exc)) from exc
        if first_ms is None:
            first_ms = float(stamp)
        yield TraceRecord(
            offset_s=(stamp - first_ms) / 1000.0,
            prompt_tokens=prompt,
            output_tokens=output,
            hash_ids=hash_ids,
        )


def read_trace(path: Path, trace_format: TraceFormat) -> Iterator[TraceRecord]:
    """All records of a trace file, in arrival order (a stable sort by offset), read at once."""
    source = str(path)
    try:
        with path.open(encoding="utf-8", newline="") as lines:
            if trace_format is TraceFormat.AZURE_CSV:
                records = list(parse_azure_csv(lines, source=source))
            else:
                records = list(parse_mooncake_jsonl(lines, source=source))
    except OSError as exc:
        raise TraceFormatError(source, 0, f"cannot read the trace: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise TraceFormatError(source, 0, f"not UTF-8 text: {exc.reason}") from exc
    records.sort(key=lambda record: record.offset_s)
    if records and records[0].offset_s < 0:
        # Rows out of order: offsets count from the earliest row, not the first line.
        base_s = records[0].offset_s
        records = [replace(r, offset_s=r.offset_s - base_s) for r in records]
    return iter(records)
