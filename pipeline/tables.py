"""Canonical Polars schemas of the store's tables: one constant per table.

Frames handed to `pipeline.store.Store` for writing carry exactly these columns and types;
a test holds each constant against the table the migrations create, so the two cannot drift.
Timestamps are naive UTC, microsecond resolution.
"""

from __future__ import annotations

import polars as pl

TIMESTAMP = pl.Datetime("us")

REQUESTS_SCHEMA = pl.Schema(
    {
        "trace_id": pl.String(),
        "span_id": pl.String(),
        "request_id": pl.String(),
        "replica": pl.String(),
        "host": pl.String(),
        "zone": pl.String(),
        "model": pl.String(),
        "pool": pl.String(),
        "tenant": pl.String(),
        "arrival_ts": TIMESTAMP,
        "end_ts": TIMESTAMP,
        "ok": pl.Boolean(),
        "error_type": pl.String(),
        "prompt_tokens": pl.Int64(),
        "completion_tokens": pl.Int64(),
        "ttft_s": pl.Float64(),
        "e2e_s": pl.Float64(),
        "queue_s": pl.Float64(),
        "prefill_s": pl.Float64(),
        "decode_s": pl.Float64(),
        "inference_s": pl.Float64(),
        "max_tokens": pl.Int64(),
        "emulated": pl.Boolean(),
        "source": pl.String(),
    }
)

INGEST_ERRORS_SCHEMA = pl.Schema(
    {
        "source": pl.String(),
        "location": pl.String(),
        "message": pl.String(),
        "recorded_ts": TIMESTAMP,
    }
)
