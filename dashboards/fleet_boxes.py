"""Fleet boxes: the autoscaler (engine targets appearing and leaving, cold starts) and the
observer, servewatch itself (scrapes answered, scrape duration, trace ingest lag), from the
scrapes and targets tables and the traced requests.

Thresholds are starting points a reader checks against the number printed beside each state.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from servewatch.dashboards.box_signal import (
    Box,
    BoxFrames,
    BoxSignal,
    BoxState,
    engine_scrapes,
    has_rows,
    listed,
    seconds_text,
    verdict,
)
from servewatch.dashboards.panel import natural_order

COLD_START_DEGRADED_S = 300.0
SCRAPE_OK_DEGRADED_RATIO = 0.99
# Half of Prometheus's default 10 s scrape timeout.
SCRAPE_DURATION_DEGRADED_S = 5.0
INGEST_LAG_DEGRADED_S = 60.0
# A median lag above this is a replay or backfill of old data, not a live pipeline's lag.
BACKFILL_LAG_S = 3600.0
# A target that appears or disappears within this many scrape intervals of the window's edge
# was there all along (scrapes are periodic, not at the edge).
EDGE_INTERVALS = 2


# -- autoscaler -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Presence:
    start: datetime
    end: datetime
    edge: timedelta
    spans: pl.DataFrame  # replica, first_ts, last_ts


def _presence(frames: BoxFrames) -> _Presence | None:
    scrapes = engine_scrapes(frames)
    if scrapes is None:
        return None
    spans = scrapes.group_by("replica").agg(first_ts=pl.col("ts").min(), last_ts=pl.col("ts").max())
    gaps = (
        scrapes.sort("replica", "ts")
        .select(gap=pl.col("ts").diff().over("replica").dt.total_seconds(fractional=True))
        .drop_nulls()
    )
    interval_s = float(gaps["gap"].median()) if not gaps.is_empty() else 60.0  # type: ignore[arg-type]
    first, last = scrapes["ts"].min(), scrapes["ts"].max()
    assert isinstance(first, datetime)
    assert isinstance(last, datetime)
    start, end = frames.window if frames.window is not None else (first, last)
    edge = timedelta(seconds=max(interval_s, 60.0) * EDGE_INTERVALS)
    return _Presence(start, end, edge, spans)


def autoscaler_signals(frames: BoxFrames) -> list[BoxSignal]:
    box = Box.AUTOSCALER
    presence = _presence(frames)
    if presence is None:
        why = "no engine target was scraped in the window (servewatch scrape or run)"
        return [
            BoxSignal(box, "replica count changes", BoxState.NO_SIGNAL, "-", why),
            BoxSignal(box, "cold starts", BoxState.NO_SIGNAL, "-", why),
        ]
    spans = presence.spans
    appeared = spans.filter(pl.col("first_ts") > presence.start + presence.edge)
    gone = spans.filter(pl.col("last_ts") < presence.end - presence.edge)
    at_start = spans.height - appeared.height
    at_end = spans.height - gone.height
    changes = [f"+{r}" for r in natural_order(appeared["replica"].to_list())]
    changes += [f"-{r}" for r in natural_order(gone["replica"].to_list())]
    value = f"{at_start} at the start, {at_end} at the end"
    value += f": {listed(changes)}" if changes else ", no change"
    signals = [
        BoxSignal(
            box,
            "replica count changes",
            BoxState.OK,
            value,
            "engine targets scraped: one appears with its first scrape and leaves with its "
            f"last, {EDGE_INTERVALS} scrape intervals from the window's edges counting as there "
            "all along; no threshold",
        )
    ]
    signals.append(_cold_starts(frames, appeared, presence))
    return signals


def _cold_starts(frames: BoxFrames, appeared: pl.DataFrame, presence: _Presence) -> BoxSignal:
    box = Box.AUTOSCALER
    how = (
        "each new replica's first scrape to the arrival of its first traced request; "
        f"degraded above {COLD_START_DEGRADED_S:.0f} s, or when one never served though it "
        "appeared that long before the window's end"
    )
    if appeared.is_empty():
        return BoxSignal(box, "cold starts", BoxState.NO_SIGNAL, "none: no replica appeared", how)
    requests = frames.requests
    if not has_rows(requests):
        return BoxSignal(
            box,
            "cold starts",
            BoxState.NO_SIGNAL,
            f"{appeared.height} replica(s) appeared",
            "needs traced requests to see when a new replica first served",
        )
    assert requests is not None
    served = requests.group_by("replica").agg(first_served_ts=pl.col("arrival_ts").min())
    starts = appeared.join(served, on="replica", how="left").with_columns(
        cold_s=(pl.col("first_served_ts") - pl.col("first_ts")).dt.total_seconds(fractional=True)
    )
    order = {name: i for i, name in enumerate(natural_order(starts["replica"].to_list()))}
    starts = starts.sort(pl.col("replica").replace_strict(order, return_dtype=pl.Int64))
    degraded, parts = False, []
    limit = timedelta(seconds=COLD_START_DEGRADED_S)
    for row in starts.to_dicts():
        cold = row["cold_s"]
        if cold is None:
            parts.append(f"{row['replica']} never served")
            degraded |= row["first_ts"] + limit < presence.end
        else:
            parts.append(f"{row['replica']} {seconds_text(max(cold, 0.0))}")
            degraded |= cold > COLD_START_DEGRADED_S
    return BoxSignal(box, "cold starts", verdict(degraded), listed(parts), how)


# -- observer -------------------------------------------------------------------------------------


def observer_signals(frames: BoxFrames) -> list[BoxSignal]:
    box, scrapes = Box.OBSERVER, frames.scrapes
    signals = []
    if not has_rows(scrapes):
        why = "no target was scraped in the window (servewatch scrape or run)"
        signals += [
            BoxSignal(box, "scrapes answered", BoxState.NO_SIGNAL, "-", why),
            BoxSignal(box, "scrape duration", BoxState.NO_SIGNAL, "-", why),
        ]
    else:
        assert scrapes is not None
        ok = int(scrapes["ok"].sum())
        ratio = ok / scrapes.height
        signals.append(
            BoxSignal(
                box,
                "scrapes answered",
                verdict(ratio < SCRAPE_OK_DEGRADED_RATIO),
                f"{ok:,} of {scrapes.height:,} ({ratio:.2%}), every target",
                "scrapes that returned a page / all scrapes; degraded below "
                f"{SCRAPE_OK_DEGRADED_RATIO:.0%}",
            )
        )
        signals.append(_scrape_duration(scrapes))
    signals.append(_ingest_lag(frames))
    return signals


def _scrape_duration(scrapes: pl.DataFrame) -> BoxSignal:
    how = (
        "95th percentile (nearest rank) of every scrape's duration; degraded above "
        f"{SCRAPE_DURATION_DEGRADED_S:g} s, half of Prometheus's default timeout"
    )
    durations = scrapes["duration_s"].drop_nulls()
    if durations.is_empty():
        return BoxSignal(
            Box.OBSERVER,
            "scrape duration",
            BoxState.NO_SIGNAL,
            "-",
            "no scrape in the window recorded its duration (replayed scrapes do not)",
        )
    p95 = float(durations.quantile(0.95, interpolation="nearest") or 0.0)
    longest = float(durations.max())  # type: ignore[arg-type]
    return BoxSignal(
        Box.OBSERVER,
        "scrape duration",
        verdict(p95 > SCRAPE_DURATION_DEGRADED_S),
        f"p95 {p95 * 1000:,.0f} ms, longest {longest * 1000:,.0f} ms",
        how,
    )


def _ingest_lag(frames: BoxFrames) -> BoxSignal:
    box, requests = Box.OBSERVER, frames.requests
    how = (
        "a traced request's store write (ingested_ts) less its end; median and p95; degraded "
        f"above {INGEST_LAG_DEGRADED_S:.0f} s at p95"
    )
    lags = (
        None
        if requests is None or "ingested_ts" not in requests.columns
        else requests.select(
            lag=(pl.col("ingested_ts") - pl.col("end_ts")).dt.total_seconds(fractional=True)
        )["lag"].drop_nulls()
    )
    if lags is None or lags.is_empty():
        return BoxSignal(
            box,
            "trace ingest lag",
            BoxState.NO_SIGNAL,
            "-",
            "no traced request carries the time it was written to the store",
        )
    median = float(lags.median())  # type: ignore[arg-type]
    p95 = float(lags.quantile(0.95, interpolation="nearest") or 0.0)
    value = f"median {seconds_text(max(median, 0.0))}, p95 {seconds_text(max(p95, 0.0))}"
    if median > BACKFILL_LAG_S:
        return BoxSignal(
            box,
            "trace ingest lag",
            BoxState.NO_SIGNAL,
            value,
            "ingested long after the fact (a replay or backfill), so no live lag: " + how,
        )
    return BoxSignal(box, "trace ingest lag", verdict(p95 > INGEST_LAG_DEGRADED_S), value, how)
