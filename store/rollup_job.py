"""The incremental rollup job: new requests since the watermark re-aggregate only their minutes.

Cost grows with what arrived, not with history: the job finds the minutes touched by requests
ingested since its last run (late data included, however late), recomputes exactly those
minutes from the raw rows, and swaps them in with the new watermark in one transaction. A change
of SLO criteria (a different fingerprint) recomputes everything once. The per-minute
aggregation runs in the store (DuckDB), as `pipeline.request_minutes` defines it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from servewatch.pipeline.request_minutes import EventCriterion
from servewatch.store.rollups import (
    REQUEST_MINUTES_VERSION,
    MinuteRollupSwap,
    criteria_fingerprint,
)
from servewatch.store.store import Store


@dataclass(frozen=True)
class RollupReport:
    minutes: int
    requests: int
    full: bool
    watermark_ts: datetime | None


# Recomputes the given minutes (all when None) and swaps them in with a watermark and a
# fingerprint: `Store.recompute_request_minutes` or `Store.recompute_slo_minutes`.
Recompute = Callable[[Sequence[datetime] | None, datetime, str], MinuteRollupSwap]


def _roll_up(store: Store, *, table: str, fingerprint: str, recompute: Recompute) -> RollupReport:
    watermark_ts, stored_fingerprint = store.watermark(table)
    # The next watermark is this run's start: with one writer, everything written before it is
    # seen now, and anything written later is stamped at or after it.
    run_ts = store.now()
    # The aggregation runs where the rows are and writes its rows there (see
    # Store.recompute_request_minutes): neither the requests nor the per-minute rows cross into
    # Python.
    if stored_fingerprint != fingerprint:
        swap = recompute(None, run_ts, fingerprint)
        return RollupReport(
            minutes=swap.minutes, requests=swap.requests, full=True, watermark_ts=run_ts
        )
    minutes = store.minutes_ingested_since(watermark_ts)
    if not minutes:
        return RollupReport(minutes=0, requests=0, full=False, watermark_ts=watermark_ts)
    swap = recompute(minutes, run_ts, fingerprint)
    return RollupReport(
        minutes=len(minutes), requests=swap.requests, full=False, watermark_ts=run_ts
    )


def roll_up_request_minutes(store: Store) -> RollupReport:
    """Bring `request_minutes` up to date with the `requests` table."""
    return _roll_up(
        store,
        table="request_minutes",
        fingerprint=REQUEST_MINUTES_VERSION,
        recompute=lambda minutes, watermark_ts, fingerprint: store.recompute_request_minutes(
            minutes, watermark_ts=watermark_ts, fingerprint=fingerprint
        ),
    )


def roll_up_slo_minutes(store: Store, *, criteria: Sequence[EventCriterion]) -> RollupReport:
    """Bring `slo_minutes` up to date for `criteria` (a change of criteria recomputes all)."""
    return _roll_up(
        store,
        table="slo_minutes",
        fingerprint=criteria_fingerprint(criteria),
        recompute=lambda minutes, watermark_ts, fingerprint: store.recompute_slo_minutes(
            minutes, criteria=criteria, watermark_ts=watermark_ts, fingerprint=fingerprint
        ),
    )


def roll_up_requests(store: Store, *, criteria: Sequence[EventCriterion]) -> RollupReport:
    """Both request rollups; reports on `slo_minutes`."""
    roll_up_request_minutes(store)
    return roll_up_slo_minutes(store, criteria=criteria)
