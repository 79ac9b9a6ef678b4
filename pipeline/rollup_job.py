"""The incremental rollup job: new requests since the watermark re-aggregate only their minutes.

Cost grows with what arrived, not with history: the job finds the minutes touched by requests
ingested since its last run (late data included, however late), recomputes exactly those
minutes from the raw rows, and swaps them in with the new watermark in one transaction. A change
of SLO criteria (a different fingerprint) recomputes everything once. The per-minute
aggregation runs in the store (DuckDB), as `pipeline.request_minutes` defines it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from pipeline.request_minutes import EventCriterion
from pipeline.store import Store
from pipeline.tables import REQUEST_MINUTES_SCHEMA, SLO_MINUTES_SCHEMA


@dataclass(frozen=True)
class RollupReport:
    minutes: int
    requests: int
    full: bool
    watermark_ts: datetime | None


# Bump when request_minutes' computation changes, so stored minutes are recomputed once.
REQUEST_MINUTES_VERSION = "request_minutes/1"


def criteria_fingerprint(criteria: Sequence[EventCriterion]) -> str:
    text = "|".join(sorted(repr(c) for c in criteria))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _roll_up(
    store: Store,
    *,
    table: str,
    fingerprint: str,
    compute: Callable[[Sequence[datetime] | None], pl.LazyFrame],
    count: Callable[[pl.DataFrame], int],
    schema: pl.Schema,
) -> RollupReport:
    watermark_ts, stored_fingerprint = store.watermark(table)
    # The next watermark is this run's start: with one writer, everything written before it is
    # seen now, and anything written later is stamped at or after it.
    run_ts = store.now()
    full = stored_fingerprint != fingerprint
    # The aggregation runs where the rows are (see Store.aggregate_request_minutes): only
    # per-minute rows cross into Polars, so memory follows the minutes, not the requests.
    if full:
        rows = compute(None).collect()
        minutes = rows["minute_ts"].unique().sort().to_list()
    else:
        minutes = store.minutes_ingested_since(watermark_ts)
        if not minutes:
            return RollupReport(minutes=0, requests=0, full=False, watermark_ts=watermark_ts)
        rows = compute(minutes).collect()
    store.replace_minute_rollup(
        table,
        minutes=minutes,
        frame=rows.select(schema.names()).cast(schema),
        watermark_ts=run_ts,
        fingerprint=fingerprint,
        full=full,
    )
    return RollupReport(minutes=len(minutes), requests=count(rows), full=full, watermark_ts=run_ts)


def roll_up_request_minutes(store: Store) -> RollupReport:
    """Bring `request_minutes` up to date with the `requests` table."""
    return _roll_up(
        store,
        table="request_minutes",
        fingerprint=REQUEST_MINUTES_VERSION,
        compute=store.aggregate_request_minutes,
        count=lambda rows: int(rows["requests"].sum()),
        schema=REQUEST_MINUTES_SCHEMA,
    )


def roll_up_slo_minutes(store: Store, *, criteria: Sequence[EventCriterion]) -> RollupReport:
    """Bring `slo_minutes` up to date for `criteria` (a change of criteria recomputes all)."""
    return _roll_up(
        store,
        table="slo_minutes",
        fingerprint=criteria_fingerprint(criteria),
        compute=lambda minutes: store.aggregate_slo_minutes(minutes, criteria=criteria),
        count=lambda rows: (
            int(rows.filter(pl.col("slo") == criteria[0].name)["total"].sum()) if criteria else 0
        ),
        schema=SLO_MINUTES_SCHEMA,
    )


def roll_up_requests(store: Store, *, criteria: Sequence[EventCriterion]) -> RollupReport:
    """Both request rollups; reports on `slo_minutes`."""
    roll_up_request_minutes(store)
    return roll_up_slo_minutes(store, criteria=criteria)
