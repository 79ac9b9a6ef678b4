"""The incremental rollup job: new requests since the watermark re-aggregate only their minutes.

Cost grows with what arrived, not with history: the job finds the minutes touched by requests
ingested since its last run (late data included, however late), recomputes exactly those
minutes from the raw rows, and swaps them in with the new watermark in one transaction. A change
of SLO criteria (a different fingerprint) recomputes everything once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from pipeline.request_minutes import EventCriterion, request_minutes, slo_minutes
from pipeline.store import Store
from pipeline.tables import REQUEST_MINUTES_SCHEMA, SLO_MINUTES_SCHEMA


@dataclass(frozen=True)
class RollupReport:
    minutes: int
    requests: int
    full: bool
    watermark_ts: datetime | None


def criteria_fingerprint(criteria: Sequence[EventCriterion]) -> str:
    text = "|".join(sorted(repr(c) for c in criteria))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def roll_up_requests(store: Store, *, criteria: Sequence[EventCriterion]) -> RollupReport:
    """Bring `request_minutes` and `slo_minutes` up to date with the `requests` table."""
    watermark_ts, stored_fingerprint = store.watermark("requests")
    # The next watermark is this run's start: with one writer, everything written before it is
    # seen now, and anything written later is stamped at or after it.
    run_ts = store.now()
    fingerprint = criteria_fingerprint(criteria)
    full = stored_fingerprint != fingerprint
    minutes = store.minutes_ingested_since(None if full else watermark_ts)
    if not minutes and not full:
        return RollupReport(minutes=0, requests=0, full=False, watermark_ts=watermark_ts)
    requests = store.read_requests_in_minutes(minutes)
    per_replica, per_slo, counted = pl.collect_all(
        [
            request_minutes(requests).select(REQUEST_MINUTES_SCHEMA.names()),
            slo_minutes(requests, criteria=criteria),
            requests.select(pl.len()),
        ]
    )
    store.replace_request_rollups(
        minutes=minutes,
        request_minutes=per_replica.cast(REQUEST_MINUTES_SCHEMA),
        slo_minutes=per_slo.cast(SLO_MINUTES_SCHEMA),
        watermark_ts=run_ts,
        fingerprint=fingerprint,
        full=full,
    )
    return RollupReport(
        minutes=len(minutes), requests=int(counted.item()), full=full, watermark_ts=run_ts
    )
