"""Canonical Polars schemas of the store's tables: one constant per table.

Frames handed to `servewatch.store.Store` for writing carry exactly these columns and types;
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
        # Set by the store when the row is written; collectors leave it null.
        "ingested_ts": TIMESTAMP,
        # The conversation (session, thread) a gateway or client named; null when none did.
        "conversation_id": pl.String(),
        # The LoRA adapter the request used (a gateway's attribute, or its model name when that
        # is not the base model); null for requests to the base model.
        "adapter": pl.String(),
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

TARGETS_SCHEMA = pl.Schema(
    {
        "target_id": pl.String(),
        "kind": pl.String(),
        "url": pl.String(),
        "replica": pl.String(),
        "host": pl.String(),
        "zone": pl.String(),
        "model": pl.String(),
        "pool": pl.String(),
        "gpus": pl.Int32(),
        "first_seen_ts": TIMESTAMP,
        "last_seen_ts": TIMESTAMP,
        "gpu_uuids": pl.List(pl.String()),
    }
)

SCRAPES_SCHEMA = pl.Schema(
    {
        "target_id": pl.String(),
        "ts": TIMESTAMP,
        "ok": pl.Boolean(),
        "duration_s": pl.Float64(),
        "samples": pl.Int32(),
        "error": pl.String(),
        "kind": pl.String(),
    }
)

# Not a table: the form in which scraped samples reach the store, which resolves
# (target_id, metric, labels) to integer series ids and writes `series` and `points`.
SAMPLES_SCHEMA = pl.Schema(
    {
        "target_id": pl.String(),
        "scrape_ts": TIMESTAMP,
        "ts": TIMESTAMP,
        "metric": pl.String(),
        "labels": pl.String(),
        "signal": pl.String(),
        "source": pl.String(),
        "value": pl.Float64(),
    }
)

SERIES_SCHEMA = pl.Schema(
    {
        "series_id": pl.Int32(),
        "target_id": pl.String(),
        "signal": pl.String(),
        "metric": pl.String(),
        "labels": pl.String(),
        "source": pl.String(),
    }
)

UNKNOWN_FAMILIES_SCHEMA = pl.Schema(
    {
        "target_id": pl.String(),
        "family": pl.String(),
        "samples": pl.Int64(),
        "first_seen_ts": TIMESTAMP,
        "last_seen_ts": TIMESTAMP,
    }
)

POINTS_SCHEMA = pl.Schema({"series_id": pl.Int32(), "ts": TIMESTAMP, "value": pl.Float64()})

# Series a Prometheus-compatible server recorded from `servewatch rules sli` (pipeline/
# recorded_sli.py), imported as they are: already aggregated, so they belong to no target.
RECORDED_POINTS_SCHEMA = pl.Schema(
    {
        "source": pl.String(),
        "record": pl.String(),
        "labels": pl.String(),
        "ts": TIMESTAMP,
        "value": pl.Float64(),
    }
)

REQUEST_MINUTES_SCHEMA = pl.Schema(
    {
        "replica": pl.String(),
        "minute_ts": TIMESTAMP,
        "requests": pl.Int64(),
        "failed_requests": pl.Int64(),
        "prompt_tokens": pl.Int64(),
        "completion_tokens": pl.Int64(),
        **{
            f"{stem}_p{p}_s": pl.Float64() for stem in ("ttft", "tpot", "e2e") for p in (50, 95, 99)
        },
    }
)

SLO_MINUTES_SCHEMA = pl.Schema(
    {
        "minute_ts": TIMESTAMP,
        "slo": pl.String(),
        "replica": pl.String(),
        "good": pl.Int64(),
        "total": pl.Int64(),
        "pool": pl.String(),
        "model": pl.String(),
        "tenant": pl.String(),
        # Output tokens of the good requests and of all requests (failed ones included): the
        # events of token goodput SLOs. Null on rows counted from metrics, which cannot tell.
        "good_output_tokens": pl.Int64(),
        "output_tokens": pl.Int64(),
        "adapter": pl.String(),
    }
)

ALERTS_SCHEMA = pl.Schema(
    {
        "slo": pl.String(),
        "severity": pl.String(),
        "long_window_s": pl.Int64(),
        "short_window_s": pl.Int64(),
        "state": pl.String(),
        "changed_ts": TIMESTAMP,
        "active_since_ts": TIMESTAMP,
        "long_burn_rate": pl.Float64(),
        "short_burn_rate": pl.Float64(),
        "burn_threshold": pl.Float64(),
        "budget_consumed_ratio": pl.Float64(),
        "labels": pl.String(),
    }
)

RECOMMENDATIONS_SCHEMA = pl.Schema(
    {
        "created_ts": TIMESTAMP,
        "name": pl.String(),
        "verdict": pl.String(),
        "record": pl.String(),
    }
)
